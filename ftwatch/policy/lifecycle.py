"""Where a job is in its life, read from the findings of ``ftwatch/rules/packs/lifecycle.yaml``
(issue 12 items 3 and 6). The facts (which line means what, and its source) are that pack; this
module only knows its id prefixes:

* ``lifecycle.finished.<who>``: the launcher or framework said training finished
  (torchelastic ``worker group successfully finished``, HF Trainer ``Training completed``,
  Lightning ``Trainer.fit stopped: max_... reached``, Megatron ``[after training is done]``, and
  the pack's other trainers: OpenNMT-tf / Keras early stopping, fairseq, TF Estimator, nnU-Net,
  YOLO; the HF Trainer's end-of-training metrics, printed at any verbosity). An error printed
  after it is a notice, not a restart (``ftwatch.policy.rootcause``), graded by its class
  (:func:`after_finish`).
* ``lifecycle.exited_ok.<who>`` (and torchelastic's finished line, which says every local worker
  exited 0): a launcher saw a worker exit 0. The launcher is the worker's parent and reads its
  exit status itself (torchelastic's ``PContext``, DeepSpeed's ``launch.py``), and Python exits 1
  when an exception ends the main thread (``sys.excepthook``: "the interpreter exits with status
  1"), so a traceback before it ended no program: a notice (:func:`worker_tracebacks`). Only a
  command that may run a pipe or a wrapper (:func:`reports_own_status` false under ``ftwatch
  run``) can hide a failure's status behind an exit 0 (seed 001: ``| tee`` without ``set -o
  pipefail``).
* ``lifecycle.elastic_reset.<who>``: an elastic launcher re-formed the job's world (Elastic
  Horovod's ``reset workers: N``, or its ``blacklist failing host: H``, after which the driver
  either stops with an error or resumes); after an incident's errors it recovered from them by itself
  (:func:`elastic_recovery`).
* ``launcher.<name>``: the job runs under that launcher (its private exit codes apply,
  ``ftwatch.rules.exitcodes``). Under ``ftwatch run`` the command says it too
  (:func:`launcher_of_command`).
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Sequence

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity, precedes
from ftwatch.parsers.multiline import PY_START as _TRACEBACK

FINISHED = "lifecycle.finished."
EXITED_OK = "lifecycle.exited_ok."
LAUNCHER = "launcher."
#: finished lines that also say every worker of the agent exited 0 (the pack's ``exited_ok`` tag)
_FINISHED_AND_EXITED = frozenset({"lifecycle.finished.torchelastic"})
#: a command (argv[0]'s base name, or ``python -m <module>``) -> the launcher it is
LAUNCHER_COMMANDS = {"dlrover-run": "dlrover", "dlrover.trainer.torch.elastic_run": "dlrover"}
#: commands whose exit status is the program's own or the launcher's reading of its workers' (the
#: Python interpreter; torchrun / torch.distributed.run, DeepSpeed's and accelerate's launchers,
#: dlrover-run, mpirun / mpiexec, srun): no pipe of theirs can turn a failure into an exit 0
OWN_STATUS_COMMANDS = frozenset({"python", "torchrun", "deepspeed", "accelerate", "dlrover-run", "mpirun",
                                 "mpiexec", "srun"})
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")


def is_finished(f: Finding) -> bool:
    """A line saying training finished."""
    return f.rule_id.startswith(FINISHED)


def finished_by_program(f: Finding) -> bool:
    """A "training finished" line the training program printed itself (HF Trainer, Lightning,
    Megatron), not a launcher's (torchelastic's says its workers exited: an exit, read as one)."""
    return is_finished(f) and f.rule_id not in _FINISHED_AND_EXITED


def is_exited_ok(f: Finding) -> bool:
    """A launcher's line saying a worker process exited 0."""
    return f.rule_id.startswith(EXITED_OK) or f.rule_id in _FINISHED_AND_EXITED


def finish(findings: Iterable[Finding]) -> Finding | None:
    """The earliest (time, seq) "training finished" finding, or None."""
    return min((f for f in findings if is_finished(f)), key=lambda f: (f.time, f.seq), default=None)


#: a training loss or gradient that is NaN or infinite (``rules/packs/torch.yaml``): printed after the
#: finish it says the result the run wrote is not finite either (:func:`after_finish`)
NON_FINITE = frozenset({"python.loss_not_finite"})


def after_finish(notice: Finding, cascade: bool, saving: bool = False) -> tuple[Action | None, str]:
    """What an error printed after training finished asks for (issue 12 item 3: a notice, not a
    restart), graded by its class: ``(action, why)``, or ``(None, why)`` when the ordinary decision
    stands.

    * A transient infrastructure fault the program's own tail raised and died of (an uncaught
      exception of a Python traceback, as saving or uploading its results raises it; not a line
      of the ranks' collective library while the finished job tears its process group down, not
      an exit, not a cascade symptom of a peer's exit): the results may not have reached their
      store and a rerun from the last checkpoint redoes that tail; the ordinary decision (D2:
      restart) stands. ClearML's maintainers asked for the upload after training to be retried
      (allegroai/clearml, an S3 connection reset after the final save).
    * An uncaught exception that ended the program while it was saving its result or going on with
      the work it trains for (:data:`TAIL_WORK`: evaluating or predicting with the trained model, the HF
      Trainer's ``***** Running Prediction *****``, Lightning's ``Predicting DataLoader 0:``, whose
      output the job exists to produce): its own line
      after the finish said it writes the model or results (``lifecycle.own_work.writing``:
      ``Saving model checkpoint to <dir>``, axolotl's ``Training Completed!!! Saving pre-trained model
      to <dir>``) and the traceback came after it: the result is not written, so the job has failed
      and the ordinary decision by the error's class stands (a program error on the save path fails
      the same way after any rerun's training; a transient one, as above, is rerun).
    * A loss or gradient that was not finite when training ended (:data:`NON_FINITE`): NaN and
      infinity propagate through every update that reads them (IEEE 754 arithmetic), so the
      weights the run wrote are not a trained model; nvidia-resiliency-ext's restart agent grades
      ``nan_or_inf`` a root candidate. The ordinary decision by its class stands.
    * A hardware fault of the node: the run's work is done, the node's fault is a person's to look
      at before the next job lands there: notify.
    * Anything else (the program's own error in its tail, a nonzero exit after the last step,
      fallout of a peer's exit, an out-of-memory error while tearing down): the training result is
      written and a restart would train again what was finished: none. The frameworks that met
      this turned such a job into a success (NVIDIA-NeMo/Megatron-Bridge and NVIDIA/NeMo's job
      templates read the log and pass a job whose training completed though it exited nonzero).

    Args:
        notice: the earliest error after the finish (``Analysis.notices[0]``).
        cascade: its rule is a cascade symptom (``ftwatch.policy.rootcause.CASCADE_RULES``).
        saving: the program said, after the finish and before ``notice``, that it writes its result.

    Returns:
        ``(Action.NOTIFY | Action.NONE | None, clause)``.
    """
    if notice.failure_class is FailureClass.RETRYABLE_INFRA and uncaught_traceback(notice) and not cascade:
        return None, "a transient fault in the run's tail (its results may not be stored): a rerun redoes it"
    if saving and uncaught_traceback(notice) and not cascade:
        return None, ("the program died while saving its result, or evaluating or predicting with it, after "
                      "training (the job's work is not done)")
    if notice.rule_id in NON_FINITE:
        return None, "the loss was not finite when training ended: the written result is no result"
    if notice.failure_class is FailureClass.HARDWARE_NODE:
        return Action.NOTIFY, "the work is done and the node's fault is a person's to look at → notify"
    return Action.NONE, "the training result is written and a restart would train it again → none"


#: the program's own line that it writes a file to a path (``rules/packs/lifecycle.yaml``)
WRITING = "lifecycle.own_work.writing"
#: the program's own lines that it goes on with work of its own after training: writing its result, or
#: evaluating / predicting with it (``lifecycle.own_work.evaluation``: the HF Trainer's ``***** Running
#: Evaluation *****`` / ``Prediction``, Lightning's ``Predicting DataLoader 0:``), or loading its best
#: checkpoint as the result (``lifecycle.tail.loading_best``; any program's ``Loading checkpoint: <path>``,
#: ``lifecycle.tail.loading_checkpoint``, as MACE reloads its last checkpoint to evaluate and export it):
#: the job's remaining work
TAIL_WORK = frozenset({WRITING, "lifecycle.own_work.evaluation", "lifecycle.tail.loading_best",
                       "lifecycle.tail.loading_checkpoint"})


def saving_before(findings: Iterable[Finding], finished: Finding, notice: Finding) -> bool:
    """Whether the program said it writes its result or evaluates / predicts with it (:data:`TAIL_WORK`)
    after ``finished`` and before ``notice``, on ``notice``'s stream (its instance, or the combined log
    it came in)."""
    return any(f.rule_id in TAIL_WORK and precedes(finished, f) and precedes(f, notice) and _one_stream(f, notice)
               for f in findings)


def _one_stream(line: Finding, rank_line: Finding) -> bool:
    """``line`` came in ``rank_line``'s stream: its instance, the stream a rank prefix split it from
    (``<instance>/rank3`` under ``run`` and ``watch``), or, in a replayed combined log, the same file
    (there a prefixed rank is instance ``rank3`` of that file's stream: ``Origin.with_rank``), so
    replay reads a combined log as ``run`` reads the stream it was written from."""
    a, b = line.origin, rank_line.origin
    if a.instance in (b.instance, b.instance.rpartition("/")[0]):
        return True
    return a.source == b.source == "replay" and a.stream == b.stream and a.node == b.node


#: an elastic launcher's line that it re-formed the job's world (``rules/packs/lifecycle.yaml``)
ELASTIC_RESET = "lifecycle.elastic_reset."


def elastic_recovery(findings: Iterable[Finding], errors: Sequence[Finding]) -> Finding | None:
    """The elastic launcher's reset of its workers after every one of ``errors``, or None.

    Elastic Horovod handles a failed worker itself: its driver blacklists the failing host, resets
    the remaining workers (``reset workers: N``) and the training function resumes from the last
    committed state (horovod docs/elastic.rst); when it cannot (every host failed or blacklisted,
    the reset limit spent) it stops with an error instead of resetting. A reset after the
    incident's errors is therefore the launcher's own recovery from them: nothing to restart from
    outside (the reset the driver logs at the start comes before any error and counts for none).

    Args:
        findings: the attempt's findings.
        errors: the incident's errors (real ones and fallout), any order.

    Returns:
        The earliest reset finding later (time, seq) than every error, or None.
    """
    if not errors:
        return None
    last = max((f.time, f.seq) for f in errors)
    resets = [f for f in findings if f.rule_id.startswith(ELASTIC_RESET) and (f.time, f.seq) > last]
    return min(resets, key=lambda f: (f.time, f.seq), default=None)


def launchers(findings: Iterable[Finding]) -> set[str]:
    """The launchers the findings show the job runs under (``{"dlrover"}``)."""
    return {f.rule_id[len(LAUNCHER):] for f in findings if f.rule_id.startswith(LAUNCHER)}


def launcher_of_command(command: Sequence[str]) -> str | None:
    """The launcher a command runs under: ``dlrover-run ...`` or ``python -m
    dlrover.trainer.torch.elastic_run ...`` -> ``"dlrover"``; else None."""
    if not command:
        return None
    found = LAUNCHER_COMMANDS.get(os.path.basename(command[0]))
    if found is None and "-m" in command[:-1]:
        found = LAUNCHER_COMMANDS.get(command[list(command).index("-m") + 1])
    return found


def reports_own_status(command: Sequence[str]) -> bool:
    """Says whether ``command``'s exit status is its program's own (``python train.py``) or its
    launcher's reading of its workers' (``torchrun ...``, :data:`OWN_STATUS_COMMANDS`): then an
    exit 0 after an uncaught-looking traceback means the traceback ended no program. False for a
    shell (``bash -c "python train.py | tee log"``), a wrapper script or any other command: its
    pipe may hide a failure (seed 001)."""
    if not command:
        return False
    name = os.path.basename(command[0])
    return name in OWN_STATUS_COMMANDS or bool(_PYTHON.match(name))


def uncaught_traceback(f: Finding) -> bool:
    """A Python traceback that is a real error (not fallout, not info, error or worse): what the
    interpreter prints when an exception ends the program."""
    return (f.kind != "exit_code" and bool(f.evidence) and _TRACEBACK in f.evidence[0]
            and f.severity >= Severity.ERROR
            and f.failure_class not in (FailureClass.FALLOUT, FailureClass.INFO))


def last_uncaught(findings: Iterable[Finding], instance: str, before: float,
                  seq: float = float("inf"), since: float = float("-inf")) -> Finding | None:
    """The last uncaught traceback (:func:`uncaught_traceback`, or a fallout traceback) of
    ``instance`` (or a rank of its stream, ``instance/rank3``) before (``before``, ``seq``) and not
    before ``since`` (epoch s: the instance's latest start, so a restarted instance is not blamed
    for what its previous process printed), unless training finished after it (then it was
    caught: the run went on); None when there is none."""
    last = None
    for f in sorted(findings, key=lambda f: (f.time, f.seq)):
        if (f.time, f.seq) >= (before, seq):
            break
        if f.time < since:
            continue
        if _of(f, instance) and _ends_program(f):
            last = f
        elif last is not None and is_finished(f):
            last = None
    return last


def worker_tracebacks(findings: Iterable[Finding], instance: str | None, before: float,
                      seq: float = float("inf"), since: float = float("-inf")) -> list[Finding]:
    """Every uncaught traceback (as :func:`last_uncaught` reads one) of ``instance`` or a rank of
    its stream (None: of any instance) before (``before``, ``seq``) and not before ``since``, in
    order: those an exit 0 of that instance (or its launcher's "exited 0" line) says ended no
    program."""
    return [f for f in sorted(findings, key=lambda f: (f.time, f.seq))
            if (f.time, f.seq) < (before, seq) and f.time >= since and (instance is None or _of(f, instance))
            and _ends_program(f)]


def _of(f: Finding, instance: str) -> bool:
    """``f`` is of ``instance`` or of a rank of its stream (``instance/rank3``)."""
    return f.origin.instance == instance or f.origin.instance.startswith(instance + "/")


def _ends_program(f: Finding) -> bool:
    """An uncaught traceback, or a fallout one: what Python prints as an exception ends it."""
    return uncaught_traceback(f) or (
        f.failure_class is FailureClass.FALLOUT and bool(f.evidence) and _TRACEBACK in f.evidence[0])


def derived_exit(origin: Origin, time: float, seq: int, cause: Finding, rule_id: str, line: str) -> Finding:
    """An exit read from the evidence (``exit.hidden_by_pipe``, ``exit.ended_in_traceback``): a
    generic failing exit, so R7 explains it by ``cause`` (the policy decides by the traceback's
    class) or, with nothing logged to explain it, it is a user-code failure of its own.

    Returns:
        A Finding of kind ``exit_code``; fields ``generic`` True, ``derived`` (the rule id) and
        ``traceback`` (``cause``'s rule id).
    """
    return Finding(rule_id, "exit_code", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR, origin, line,
                   time, seq, cause.evidence,
                   {"exitcode": None, "signal": None, "generic": True, "derived": rule_id,
                    "traceback": cause.rule_id},
                   "ftwatch.pipeline.incidents (issue 12: seed 001 pipefail; a log that ends in an error block)")


def exited_ok(origin: Origin, time: float, seq: int) -> Finding:
    """An instance exited 0 (kind ``exit_ok``, info: it opens nothing); evidence for
    ``ftwatch.policy.rootcause.left_first``, a rank that left while the others ran on."""
    who = origin.instance + (f" (rank {origin.rank})" if origin.rank is not None else "")
    return Finding("exit.0", "exit_ok", FailureClass.INFO, Action.NONE, Severity.INFO, origin, f"{who} exited 0",
                   time, seq, fields={"exitcode": 0}, source="the process's exit status (ftwatch run)")
