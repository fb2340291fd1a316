"""Horovod shut down with no exception and no killed rank: a rank finished first (SPEC R7, issue 12 item 3).

Horovod's own status text names the two causes of its shut-down and where to look for the first:
"Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to
allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the
shutdown was caused by an exception, you should see the exception in the log before the first
shutdown message." (horovod/horovod horovod/common/operations.cc, ``SHUT_DOWN_ERROR``). The packs
read the message as fallout (``horovod.shut_down``, gloo.yaml) and an exception before it, when
there is one, is the root cause. A rank that died by a signal (the OOM killer's SIGKILL, a node's
loss, a segfault) leaves no exception either, which is why the message alone keeps the fallout
reading (restart).

:func:`finished_rank` reads the case that is left when neither shows: the incident's errors are
only Horovod's shut-down messages and process exits with a plain status (a rank that raised the
shut-down error exits 1), and nothing in the incident reports a death by a signal (an exit with a
signal or a status above 128, mpirun's ``exited on signal``, a kill report). By Horovod's text the
cause is then its other one: a collective after one rank finished its loop, which the program's
uneven work between ranks causes (imbalanced data, one rank with fewer batches than another:
horovod/horovod#3980). A restart runs the same split: user_code, fail_job.

The log must hold more than one rank's output (shut-down messages of two ranks or more, as mpirun's
merged ``[1,N]<stderr>:`` output or several streams give): a maintainer's first reading of a lone
shut-down message is that "one of the ranks crashed", to be found in "the logs of all Horovod
processes" (horovod/horovod#2975), and a log of one rank cannot show the other's exception. mpirun's
own output is the logs of all of them: Open MPI "directs UNIX standard output and error from remote
nodes to the node that invoked mpirun and prints it on the standard output/error of mpirun"
(mpirun(1), Standard I/O), so a log that holds mpirun's report of the job's end (``mpi.first_nonzero_exit``:
"one or more processes exited with non-zero status ... The first process to do so was", orterun's
help-orterun.txt) would show a peer's exception or its death by a signal too, and one shut-down
message in it suffices.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding

#: Horovod's shut-down status as the packs read it (gloo.yaml).
SHUT_DOWN = "horovod.shut_down"
#: The root cause this reading gives.
RULE = "horovod.collective_after_rank_finished"
#: Reports of a death by a signal that no exit field carries (mpirun's, a shell's, a launcher's).
SIGNAL_REPORTS = frozenset({"mpi.process_exited_on_signal", "shell.job_killed", "shell.killed_foreground",
                            "python.subprocess_died_sigkill", "torch.mp_spawn_sigkill",
                            "deepspeed_launcher.worker_sigkilled"})
#: mpirun's own report of the job's end (kill_vocab.yaml): the log is mpirun's output, which holds every rank's.
MPIRUN_REPORTS = frozenset({"mpi.first_nonzero_exit"})
SOURCE = ("horovod/horovod horovod/common/operations.cc SHUT_DOWN_ERROR ('caused by an exception on one of the ranks "
          "or an attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If "
          "the shutdown was caused by an exception, you should see the exception in the log before the first shutdown "
          "message'); ftwatch.policy.hvdshutdown")


def _signalled(f: Finding) -> bool:
    """Says whether ``f`` reports a death by a signal."""
    if f.rule_id in SIGNAL_REPORTS or f.rule_id.startswith("exit.sig"):
        return True
    code = f.fields.get("exitcode")
    return f.fields.get("signal") is not None or (isinstance(code, int) and (code > 128 or code < 0))


#: mpirun's per-rank output prefix (``--tag-output``: ``[1,2]<stderr>:``): group 1 the rank.
_MPI_TAG = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:")


def _speaker(f: Finding) -> tuple:
    """Who printed ``f``: its stream and rank, and the rank mpirun's output tag names."""
    tag = _MPI_TAG.search(f.line) or _MPI_TAG.search(f.evidence[0] if f.evidence else "")
    return (f.origin.instance, f.origin.rank, tag.group(1) if tag else None)


def finished_rank(order: Sequence[Finding], fallout: Sequence[Finding]) -> Finding | None:
    """The first shut-down message re-read as ``horovod.collective_after_rank_finished``, or None.

    Args:
        order: the incident's findings by (time, seq) (no real error among them: the caller's case).
        fallout: its fallout, earliest first.

    Returns:
        The earliest ``horovod.shut_down`` finding as user_code / fail_job, its line saying why;
        None when there is none, when fallout other than shut-down messages and plain exits is
        present, or when anything in the incident reports a death by a signal.
    """
    shut = [f for f in fallout if f.rule_id == SHUT_DOWN]
    if not shut:
        return None
    if any(f.rule_id != SHUT_DOWN and not (f.kind == "exit_code" and not _signalled(f)) for f in fallout):
        return None
    if any(_signalled(f) for f in order):
        return None
    if len({_speaker(f) for f in shut}) < 2 and not any(f.rule_id in MPIRUN_REPORTS for f in order):
        return None                     # one rank's output: another's exception may be elsewhere
    head = shut[0]
    line = (f"{head.line.strip()[:200]} -- Horovod shut down with no exception before its first shut-down message and "
            "no rank killed by a signal: by Horovod's own text the cause left is a collective after one rank finished "
            "execution (uneven work between ranks, the program's split)")
    return replace(head, rule_id=RULE, failure_class=FailureClass.USER_CODE, action=Action.FAIL_JOB, line=line,
                   source=SOURCE)
