"""Horovod's shut-down with no exception before it and no rank killed by a signal (ftwatch.policy.hvdshutdown,
issue 12 item 3): by Horovod's own text a collective after one rank finished (the program's uneven work);
with an exception, a killed rank or only one rank's output (not mpirun's own, which holds every rank's), the
other readings stand."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
SHUT = ("RuntimeError: Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt "
        "to allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown was "
        "caused by an exception, you should see the exception in the log before the first shutdown message.")


def mpirun(t: float, *lines: str) -> list[Finding]:
    o = Origin("mpirun", None, "hvd", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def shut_downs(*ranks: int) -> list[Finding]:
    return [f for r in ranks for f in mpirun(100.0 + r, f"[1,{r}]<stderr>:{SHUT}")]


def test_shut_down_on_several_ranks_with_no_exception_and_no_kill_is_a_rank_that_finished():
    rc = analyse(shut_downs(0, 1, 2), world=4).root_cause
    assert rc is not None and rc.rule_id == "horovod.collective_after_rank_finished", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB


def test_a_rank_killed_by_a_signal_keeps_the_fallout_reading():
    found = shut_downs(0, 1, 2) + mpirun(110.0, "mpirun noticed that process rank 3 with PID 4242 on node node-0 "
                                                "exited on signal 9 (Killed).")
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id != "horovod.collective_after_rank_finished", rc


def test_one_ranks_output_alone_cannot_show_anothers_exception():
    rc = analyse(shut_downs(0), world=4).root_cause
    assert rc is None or rc.rule_id != "horovod.collective_after_rank_finished", rc


MPIRUN_END = ("--------------------------------------------------------------------------",
              "mpirun detected that one or more processes exited with non-zero status, thus causing",
              "the job to be terminated. The first process to do so was:", "",
              "  Process name: [[40211,1],1]", "  Exit code:    1",
              "--------------------------------------------------------------------------")


def test_one_shut_down_in_mpiruns_own_output_suffices():
    """mpirun's report of the job's end: the log is mpirun's, which forwards every rank's output (mpirun(1))."""
    found = shut_downs(1) + mpirun(110.0, *MPIRUN_END)
    assert any(f.rule_id == "mpi.first_nonzero_exit" for f in found)
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "horovod.collective_after_rank_finished", rc
    killed = found + mpirun(111.0, "mpirun noticed that process rank 0 with PID 4242 on node node-0 "
                                   "exited on signal 9 (Killed).")
    rc = analyse(killed, world=2).root_cause
    assert rc is not None and rc.rule_id != "horovod.collective_after_rank_finished", rc


def test_the_exception_before_the_first_shut_down_is_the_root_cause():
    found = mpirun(90.0, "[1,3]<stderr>:Traceback (most recent call last):",
                   '[1,3]<stderr>:  File "train.py", line 10, in <module>',
                   "[1,3]<stderr>:ValueError: could not convert string to float: 'n/a'") + shut_downs(0, 1, 2)
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id != "horovod.collective_after_rank_finished", rc
    assert rc.failure_class is FailureClass.USER_CODE
