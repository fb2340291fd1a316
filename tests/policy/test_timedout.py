"""An exit with status 124 is a timeout's stop (coreutils timeout(1), ftwatch.policy.timedout): a
hang, not the generic exit that an unlisted code would be; a real error logged before it stays the
root cause, and other codes and signal deaths keep their grading."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit
from ftwatch.policy.rootcause import analyse
from ftwatch.policy.timedout import timed_out
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
TABLE = ExitCodeTable.load()


def logged(t: float, *lines: str) -> list[Finding]:
    o = Origin("combined", None, "timedout", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def exited(code: int | None, sig: int | None = None, t: float = 60.0) -> Finding:
    o = Origin("worker-0", 0, "timedout", "node-0", "stderr", "process")
    f = exit_finding(ProcessExit(o, 0, code, sig, T0 + t), TABLE)
    assert f is not None
    return f


def test_a_reported_exit_124_after_the_steps_is_a_hang():
    found = logged(0.0, "step 54070 train_loss=1.23687", "task 0 of job hero exited with code 124")
    rc = analyse(found).root_cause
    assert rc is not None and rc.rule_id == "container.exit_code"
    assert (rc.failure_class, rc.action) == (FailureClass.HANG, Action.RESTART_JOB)
    assert "coreutils" in rc.source and rc.fields["generic"] is False


def test_a_process_exit_124_is_a_hang():
    rc = analyse([exited(124)]).root_cause
    assert rc is not None and (rc.rule_id, rc.failure_class) == ("exit.124", FailureClass.HANG)


def test_a_real_error_before_the_timeout_stays_the_root_cause():
    found = logged(0.0, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") + [exited(124)]
    rc = analyse(found).root_cause
    assert rc is not None and rc.failure_class is FailureClass.OOM


def test_other_exits_keep_their_grade():
    # counterexamples: the generic 1, an unlisted 125 (timeout itself failed), SIGKILL (timeout -s KILL: 137)
    for f in (exited(1), exited(125), exited(None, 9)):
        assert timed_out(f) is f
    assert analyse([exited(125)]).root_cause.failure_class is FailureClass.USER_CODE
    assert analyse([exited(None, 9)]).root_cause.failure_class is FailureClass.RETRYABLE_INFRA
