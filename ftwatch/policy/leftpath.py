"""The rank the others waited for had left their path: a hang the program made (SPEC R7, issue 12 item 3).

Every rank of a process group must issue the same collectives in the same order. PyTorch's own
words for what happens when one does not: "Such collective communications require participation
from all ranks in the process group, so if a rank has fewer inputs, then the other ranks will hang
or error (depending on the backend)" (tutorial "Distributed Training with Uneven Inputs Using the
Join Context Manager"; ``torch.distributed.algorithms.Join`` exists to "shadow the collective
communications of non-joined processes to prevent hanging and erroring"); accelerate's
troubleshooting guide names the same for a stop decided on one process ("a break can happen on
process 0 but not on process 1", "Early stopping leads to hanging") and for work only some
processes run while the others reach a collective. The watchdog that ends such a wait says it too:
"the order of collectives is not same for all ranks or the scheduled collective, for some reason,
didn't run" (ProcessGroupNCCL.cpp).

What tells that apart from a rank stuck by its node or the network is the stuck rank's own last
word. :func:`left_rank` reads it from the evidence:

1. every rank that reports an error only waited for its peers until a timeout, and no instance
   died on its own (``ftwatch.policy.busy.waits``: the same reading the busy-rank rule starts from);
2. another rank (one that reported no wait; a line without a rank prefix when the waiting ranks are
   named), with no error of its own before the first timeout, last said that it *left the path*
   the waiting ranks are on: a finding of :data:`LEFT_PATH_RULES` (``lifecycle.left_path.*`` in
   ``rules/packs/lifecycle.yaml``, each with its source: its data ran out, its epoch ended, it
   stops early, it works on the main process alone) is its latest finding up to the first timeout,
   printed no earlier than the wait began (the first timeout less the wait's timeout, less
   :data:`SLACK_SECONDS` for the collective issued after the line);
3. none of the waiting ranks printed a finding of that rule from then on: they did not leave with it.

Then that rank is the root cause, ``collective.left_path`` (user_code, fail_job): the program's
control flow (its data split, its stop decision, its rank-only work) put the ranks on different
paths, and a restart replays the same control flow. A rank that says nothing of the kind keeps
the hang reading (``ftwatch.policy.collectives.silent_rank``); a rank busy in a datasets map the
busy-rank reading (``ftwatch.policy.busy``).

One more path the ranks leave is the training loop itself. After the program said training
finished (``ftwatch.policy.lifecycle.finish``), every rank of a synchronous job had completed
every training collective with its peers; what remains is the program's own end (a final save,
loading the best model, a last barrier). When what follows is only waiting (a job hang, a
collective timeout and its follow-on lines, exits nothing else explains), the ranks' ends do not
match: a collective one rank issues after the loop and the others do not (Lightning's
``Trainer.save_checkpoint``: "This method needs to be called on all processes in case the selected
strategy is handling distributed checkpointing", and it ends in ``strategy.barrier``; accelerate's
"Early stopping leads to hanging"), or rank-only work at the end outlasting the others' timeout
(the busy-rank reading). :func:`waited_after_finish` reads it as ``collective.wait_after_finish``
(user_code, fail_job): a restart would train again what was finished and reach the same end.
An error of its own after the finish (a crash, an OOM, a death by a signal) stays a notice.

The same two sources name what a whole job hang right after such a line is: a job whose every
instance went silent (``hang.job``, SPEC R5) within :data:`SLACK_SECONDS` of a line that says a
rank stops early or its data ran out (:data:`HANG_LEFT_RULES`), with no error between, is the
stop or the uneven data leaving the other ranks in a collective ("a break can happen on process 0
but not on process 1. This will cause the code to hang"; "if a rank has fewer inputs, then the
other ranks will hang"): :func:`left_before_hang`, ``collective.left_path`` as well. Main-process
work is no such sign at a job hang (a hang in the main process's own work is no peer's leaving),
and an epoch's end alone is none either (every rank ends its epochs, and a program that logs on
one rank prints it once for all). An epoch's end is one when the ranks' own lines show that only
one of them ended it (:func:`_ended_alone`): the instance that went silent first (the hang's
culprit) is another one, it was still writing when the epoch-end line came (its last output no
earlier than :data:`SLACK_SECONDS` before it: it logs, so it would have printed its own end), and
no instance but the one that printed it printed an epoch end since. In a synchronous group a
rank ends its epoch only after every per-step collective of it completed, so its peers took part
in all of them: the rank that stayed in the epoch was not stuck before, it went on into
collectives the other never issues, which is the uneven-inputs hang of the Join tutorial ("the
ranks that exhaust their inputs early"), the program's data split. Horovod's coordinator says it outright when its ranks
diverge ("One or more tensors were submitted ... by subset of ranks and are waiting for remainder
of ranks ... This may indicate that different ranks are trying to submit different tensors or
that only subset of ranks is submitting tensors, which will cause deadlock", stall_inspector.cc):
a job hang right after that warning is that deadlock (``lifecycle.stall.horovod``; while steps go
on, the same warning is only a slow rank, horovod/horovod#403). NCCL's device code says the same of
its own communicator ("Your program may be hanging, this may be caused by a collective mismatch
around rank N", src/init.cc ncclCommGetAsyncError, raised when "the peer advanced opcount so many
times yet we are still waiting for credit of current op, so it is _most likely_ a mismatch",
src/collectives/device/primitives.h checkMismatch): a job hang right after it is the ranks waiting
in collectives they did not all issue (``nccl.collective_mismatch_suspected``). A job that a person
or its launcher stopped (SIGTERM, SIGINT) before the hang interval ran out, right after Horovod's
warning came twice or more in a row (the stall outlived a whole check period and held up to the
stop), is the same deadlock: :func:`stalled_until_stopped`. A data loader that says the job's shards do
not split evenly over its ranks names the uneven inputs before they happen (``lifecycle.uneven_split.*``,
:data:`UNEVEN_SPLIT_RULES`): WebDataset's ``split_by_node`` warns "world_size N > num_shards M" and
hands each rank ``urls[rank::world_size]``, so the ranks past the last shard get no data at all; NeMo's
tarred datasets warn that the shard count does not divide by the world size, and their docstring says
"your program may hang if the shards are uneven". A job hang right after such a line is that split
(``collective.left_path``, phase the split rule, no rank named: the loader speaks for all of them).
So is a job hang right after the ranks stated their batch counts for the epoch and the counts disagree
(``lifecycle.rank_batches``, compared by ``ftwatch.policy.rankcounts``): they started it with uneven inputs.
"""

from __future__ import annotations

from typing import AbstractSet, Iterator, Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity, is_error
from ftwatch.policy.busy import Waits, died_on_its_own
from ftwatch.policy.collectives import TIMEOUT_RULES
from ftwatch.policy.rankcounts import RANK_BATCHES, unequal_counts

#: Rules that say a rank left the path its peers are on (lifecycle.yaml's ``lifecycle.left_path.*``,
#: tag ``left_path``; tests/policy/test_leftpath.py keeps the two in step).
LEFT_PATH_RULES = frozenset({"lifecycle.left_path.data_exhausted", "lifecycle.left_path.epoch_end",
                             "lifecycle.left_path.early_stopping", "lifecycle.left_path.main_process_only"})
#: How long before the wait began a rank's last line may be: the collective the waiting ranks are
#: in is issued after the step that printed it (seconds).
SLACK_SECONDS = 300.0
SOURCE = ("pytorch.org/tutorials/advanced/generic_join.html (uneven inputs: the other ranks hang or error); "
          "huggingface.co/docs/accelerate/basic_tutorials/troubleshooting (hanging code: early stopping, "
          "code run on some processes only); ProcessGroupNCCL.cpp watchdog timeout message")


def left_rank(order: Sequence[Finding], w: Waits | None) -> Finding | None:
    """``collective.left_path`` on the rank that left its peers' path (the module docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        w: ``ftwatch.policy.busy.waits`` of ``order`` and the errors to explain (the real ones,
            or the fallout when there is none); None: they are not all waits.

    Returns:
        A Finding on the left rank's line's origin, at the first timeout's (time, seq), or None.
    """
    if w is None:
        return None
    first = w.first
    start = first.time - w.window - SLACK_SECONDS
    for who, last in last_words(w):
        if last.rule_id not in LEFT_PATH_RULES:
            continue
        if any(f.rule_id == last.rule_id and f.time >= start for r in w.waiting for f in w.by_rank.get(r, ())):
            continue                    # a waiting rank said the same: they did not part there
        what = last.rule_id.rpartition(".")[2].replace("_", " ")
        line = (f"{who} last said it left the path its peers are on ({what}: {last.line.strip()[:160]}) and "
                f"reported no wait, while rank(s) {w.waiting} timed out waiting in a collective "
                f"({first.rule_id}, timeout {w.window:.0f} s): the program's control flow put the ranks on "
                "different paths (uneven inputs, a stop or work decided on one rank), which a restart repeats")
        return Finding("collective.left_path", "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                       last.origin, line, first.time, first.seq, (last.line, first.line),
                       {"left": last.rank, "waiting": w.waiting, "phase": last.rule_id, "timeout_s": w.window},
                       SOURCE)
    return None


def last_words(w: Waits) -> Iterator[tuple[str, Finding]]:
    """The last word of each instance that did not wait (``Waits.others``), shared by the readings
    of what a non-waiting rank was doing when its peers timed out (:func:`left_rank`,
    ``ftwatch.policy.namedwait.named_wait_rank``).

    Yields:
        ``(who, finding)``: its latest finding up to the first timeout, for each one with no error of
        its own by then whose latest finding is no older than the wait's start (the first timeout
        less the wait's timeout, less :data:`SLACK_SECONDS`).
    """
    first = w.first
    start = first.time - w.window - SLACK_SECONDS
    for who, mine in w.others():
        before = [f for f in mine if (f.time, f.seq) <= (first.time, first.seq)]
        if not before or any(is_error(f) for f in before):
            continue
        last = max(before, key=lambda f: (f.time, f.seq))
        if last.time >= start:
            yield who, last


FINISH_SOURCE = ("Lightning src/lightning/pytorch/trainer/trainer.py Trainer.save_checkpoint (\"This method needs to be "
                 "called on all processes ...\", then strategy.barrier); huggingface.co/docs/accelerate/"
                 "basic_tutorials/troubleshooting (early stopping leads to hanging)")


def waited_after_finish(notices: Sequence[Finding], finished: Finding | None) -> Finding | None:
    """``collective.wait_after_finish`` (the module docstring), or None.

    Args:
        notices: the errors printed after ``finished`` (``ftwatch.policy.rootcause.Analysis.notices``).
        finished: the "training finished" finding, or None.

    Returns:
        A Finding on the first wait's origin and (time, seq) when every notice is a wait (a job hang
        or a collective timeout), its fallout, or an exit that says nothing of its own
        (``ftwatch.policy.busy.died_on_its_own`` false), and one of them is a wait; else None. Only the
        notices up to the first job hang are read (:func:`until_job_hang`: what came after the silence
        is how the silent job was ended).
    """
    if finished is None or not notices:
        return None
    notices = until_job_hang(notices)
    if any(died_on_its_own(f) for f in notices):
        return None
    waited = [f for f in notices if f.kind == "hang" or f.rule_id in TIMEOUT_RULES]
    if not waited or any(f.kind not in ("hang", "exit_code") and f.rule_id not in TIMEOUT_RULES
                         and f.failure_class is not FailureClass.FALLOUT for f in notices):
        return None
    first = min(waited, key=lambda f: (f.time, f.seq))
    who = f"rank {first.rank}" if first.rank is not None else first.origin.instance
    line = (f"training had finished ({finished.rule_id}: {finished.line.strip()[:120]}) and then {who} only waited "
            f"({first.rule_id}): the ranks' ends after the training loop do not match (a collective or barrier "
            "one rank issues after the loop and the others do not, or rank-only work outlasting their timeout); "
            "a restart would train again what was finished")
    return Finding("collective.wait_after_finish", "collective", FailureClass.USER_CODE, Action.FAIL_JOB,
                   Severity.ERROR, first.origin, line, first.time, first.seq, (finished.line, first.line),
                   {"finished": finished.rule_id, "wait": first.rule_id}, FINISH_SOURCE)


def until_job_hang(errors: Sequence[Finding]) -> list[Finding]:
    """``errors`` up to and including the first job hang (kind ``hang``), by (time, seq); all of them
    when there is none.

    What a job prints after it went silent for the hang interval is how the silent job was ended
    (a person's Ctrl-C, the scheduler's ``CANCELLED`` at its time limit, a launcher's SIGTERM): it
    came after the silence and says nothing of it, as :func:`line_before_hang` reads no error after
    the hang either.
    """
    order = sorted(errors, key=lambda f: (f.time, f.seq))
    first = next((i for i, f in enumerate(order) if f.kind == "hang"), None)
    return order if first is None else order[:first + 1]


#: A data loader's own word that the job's shards do not split evenly over its ranks (lifecycle.yaml's
#: ``lifecycle.uneven_split.*``, tag ``uneven_split``; tests/policy/test_leftpath.py keeps the two in step).
UNEVEN_SPLIT_RULES = frozenset({"lifecycle.uneven_split.webdataset_world_over_shards",
                                "lifecycle.uneven_split.nemo_tarred_shards"})
UNEVEN_SPLIT_SOURCE = ("webdataset shardlists.py split_by_node (\"world_size N > num_shards M\": ranks past the last "
                       "shard get none); NeMo audio_to_text.py expand_sharded_filepaths (\"your program may hang if the "
                       "shards are uneven\"); pytorch.org/tutorials/advanced/generic_join.html (a rank with fewer "
                       "inputs leaves the others hanging)")
#: The left-path lines a job hang right after is read by (:func:`left_before_hang`).
HANG_LEFT_RULES = frozenset({"lifecycle.left_path.early_stopping", "lifecycle.left_path.data_exhausted",
                             "lifecycle.stall.horovod", "nccl.collective_mismatch_suspected"}) | UNEVEN_SPLIT_RULES


def left_before_hang(order: Sequence[Finding], real: Sequence[Finding]) -> Finding | None:
    """``collective.left_path`` for a job hang right after a rank stopped early or ran out of data
    (the module docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        real: its real errors: only a job hang (kind ``hang``) qualifies.

    Returns:
        A Finding on the stop line's origin, at the hang's (time, seq), or None. Errors after the
        first job hang (the scheduler's time limit, a person's Ctrl-C, the launcher's report of the
        ranks it then stopped) are how the silent job was ended, not read (:func:`until_job_hang`).
    """
    found = line_before_hang(order, until_job_hang(real), HANG_LEFT_RULES | {EPOCH_END, RANK_BATCHES})
    if found is None:
        return None
    hang, stop, before = found
    if stop.rule_id == EPOCH_END and not _ended_alone(stop, hang, before):
        return None
    if stop.rule_id == RANK_BATCHES:      # the ranks' own counts: only counts that disagree are uneven inputs
        counts = unequal_counts(stop, before)
        if counts is None:
            return None
        line = (f"right after the ranks stated unequal batch counts "
                f"({', '.join(f'rank {r}: {n}' for r, n in sorted(counts.items()))}): the ranks with fewer inputs "
                "leave the others waiting in a collective, which a restart with the same data split repeats")
        return _left_path(stop, hang, line, {"left": _fewest(counts), "counts": counts}, SOURCE)
    if stop.rule_id in UNEVEN_SPLIT_RULES:     # the loader's word for all ranks: it names no rank that left
        line = (f"right after its data loader said the shards do not split evenly over the ranks ({stop.rule_id}: "
                f"{stop.line.strip()[:160]}): ranks with fewer or no shards leave the others waiting in a "
                "collective, which a restart with the same data and world size repeats")
        return _left_path(stop, hang, line, {"left": None}, UNEVEN_SPLIT_SOURCE)
    what = stop.rule_id.rpartition(".")[2].replace("_", " ")
    line = (f"right after {stop.origin.instance} said it left the path its peers are on ({what}: "
            f"{stop.line.strip()[:160]}): a stop or an end of data on some ranks only leaves the others waiting in "
            "a collective, which a restart repeats")
    return _left_path(stop, hang, line, {"left": stop.rank}, SOURCE)


def _left_path(stop: Finding, hang: Finding, why: str, fields: dict, source: str) -> Finding:
    """``collective.left_path`` on ``stop``'s origin at the hang's (time, seq); ``why`` follows "the job
    went silent (...)" in its line, ``fields`` add to its phase and hang."""
    return Finding("collective.left_path", "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                   stop.origin, f"the job went silent ({hang.rule_id}) {why}", hang.time, hang.seq,
                   (stop.line, hang.line), {**fields, "phase": stop.rule_id, "hang": hang.rule_id}, source)


#: Horovod's coordinator's stall warning (``rules/packs/lifecycle.yaml``).
HOROVOD_STALL = "lifecycle.stall.horovod"
#: How many stall warnings in a row must come last before the stop: Horovod's stall inspector warns
#: at every check (HOROVOD_STALL_CHECK_TIME_SECONDS, 60 s by default) while a tensor still waits, so
#: two in a row are one stall that outlived a whole check period.
STALL_REPEATS = 2
STALL_SOURCE = ("horovod/horovod horovod/common/stall_inspector.cc CheckForStalledTensors (the warning is re-issued "
                "at every check while the same tensors wait for the missing ranks: \"This may indicate that different "
                "ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, "
                "which will cause deadlock\"; with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS Horovod itself shuts such a "
                "job down)")


def stalled_until_stopped(order: Sequence[Finding], real: Sequence[Finding]) -> Finding | None:
    """``collective.left_path`` for a job stopped from outside while Horovod reported its ranks stalled.

    The same deadlock :func:`left_before_hang` reads at a job hang right after Horovod's stall
    warning, when a person or the launcher stopped the job before the hang interval ran out: every
    real error is an exit that says nothing of its own (a SIGTERM or SIGINT stop:
    ``busy.died_on_its_own`` false), and the last :data:`STALL_REPEATS` findings before the first
    of them are Horovod's stall warning, with nothing between (the stall held through a whole
    check period and up to the stop; a slow rank that catches up stops the warnings).

    Args:
        order: the incident's findings by (time, seq).
        real: its real errors.

    Returns:
        A Finding on the last warning's origin, at the first stop's (time, seq), or None.
    """
    if not real or any(f.kind != "exit_code" or died_on_its_own(f) or f.fields.get("signal") not in (2, 15)
                       for f in real):
        return None
    stop = min(real, key=lambda f: (f.time, f.seq))
    before = [f for f in order if (f.time, f.seq) < (stop.time, stop.seq) and f.kind not in ("hang", "exit_hang")]
    last = before[-STALL_REPEATS:]
    if len(last) < STALL_REPEATS or any(f.rule_id != HOROVOD_STALL for f in last):
        return None
    warn = last[-1]
    line = (f"the job was stopped ({stop.rule_id}: {stop.line.strip()[:120]}) while Horovod's coordinator kept "
            f"reporting tensors that some ranks submitted and the others did not ({len(last)} or more warnings in a "
            "row, the last right before the stop): the ranks were on different paths of the program, a deadlock "
            "that a restart repeats")
    return Finding("collective.left_path", "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                   warn.origin, line, stop.time, stop.seq, (warn.line, stop.line),
                   {"left": None, "phase": HOROVOD_STALL, "stop": stop.rule_id}, STALL_SOURCE)


def line_before_hang(order: Sequence[Finding], real: Sequence[Finding], rules: AbstractSet[str],
                     slack: float = SLACK_SECONDS) -> tuple[Finding, Finding, list[Finding]] | None:
    """The line a job hang began right after: shared by the readings of a job hang by its last words
    (:func:`left_before_hang`, ``namedwait``, ``rankonly``).

    Args:
        order: the incident's findings by (time, seq).
        real: its real errors: only job hangs (kind ``hang``) qualify.
        rules: the rules whose line is looked for.
        slack: how long before the job's last output (the hang's time less its ``silent_for``)
            the line may be, in seconds.

    Returns:
        (the first hang, the latest finding of ``rules`` up to it, every non-hang finding up to
        it) when every real error is a job hang that states its silence, such a line is no older
        than ``slack`` before the last output, and no error follows it; else None.
    """
    if not real or any(f.kind != "hang" for f in real):
        return None
    hang = real[0]
    silent = hang.fields.get("silent_for")
    if not isinstance(silent, (int, float)):
        return None
    before = [f for f in order if f.kind not in ("hang", "exit_hang") and (f.time, f.seq) <= (hang.time, hang.seq)]
    line = max((f for f in before if f.rule_id in rules), key=lambda f: (f.time, f.seq), default=None)
    if line is None or line.time < hang.time - silent - slack:
        return None
    if any(is_error(f) for f in before if (f.time, f.seq) > (line.time, line.seq)):
        return None
    return hang, line, before


#: An epoch's end, a left-path line a job hang is read by only when one rank alone ended it (:func:`_ended_alone`).
EPOCH_END = "lifecycle.left_path.epoch_end"


def _ended_alone(stop: Finding, hang: Finding, before: Sequence[Finding]) -> bool:
    """Whether ``stop`` (an epoch end) shows its rank ended the epoch while the hang's culprit did not
    (the module docstring): the culprit is another instance that was writing until no earlier than
    ``stop`` less :data:`SLACK_SECONDS`, and no other instance printed an epoch end since then."""
    if hang.origin.instance == stop.origin.instance or hang.fields.get("last_output") is None:
        return False
    quiet = hang.fields.get("culprit_silent_for")
    if not isinstance(quiet, (int, float)) or hang.time - quiet < stop.time - SLACK_SECONDS:
        return False
    return not any(f.rule_id == EPOCH_END and f.origin.instance != stop.origin.instance
                   and f.time >= stop.time - SLACK_SECONDS for f in before)


def _fewest(counts: dict[int, int]) -> int | None:
    """The one rank with the fewest batches, or None when several share the fewest."""
    low = min(counts.values())
    fewest = [r for r, n in counts.items() if n == low]
    return fewest[0] if len(fewest) == 1 else None
