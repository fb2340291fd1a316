"""Collective timeouts under a bound the program set tighter than any framework ships
(ftwatch.policy.timeoutbound, issue 12 item 3): the watchdog measured the program's setting, so a
restart meets it again (user_code); at a framework's own bound the hang readings stay."""

from __future__ import annotations

import dataclasses

import pytest

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.policy.timeoutbound import TIGHTEST_DEFAULT_MS, tight_bound
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.testing import finding

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "bound", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def watchdog(rank: int, timeout_ms: int, seq: int = 1411) -> str:
    return (f"[E ProcessGroupNCCL.cpp:563] [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType=_ALLGATHER_BASE, NumelIn=16801792, NumelOut=134414336, "
            f"Timeout(ms)={timeout_ms}) ran for {timeout_ms + 70} milliseconds before timing out.")


def timeouts(timeout_ms: int, ranks=(1, 2, 3)) -> list[Finding]:
    """Ranks time out in the same all-gather; rank 0 reports nothing (it was the slow one)."""
    found = logged(0, 0.0, "step: 10  loss:  7.8000  memory:  9.41GiB(9.91%)  wps: 17,230")
    for r in ranks:
        found += logged(r, timeout_ms / 1000 + r / 10, watchdog(r, timeout_ms))
    return found


@pytest.mark.parametrize("timeout_ms", [1, 5_000, 10_000, TIGHTEST_DEFAULT_MS - 1])
def test_timeouts_under_a_bound_below_every_framework_default_are_the_programs(timeout_ms):
    rc = analyse(timeouts(timeout_ms), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.timeout_below_default", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.fields["timeout_ms"] == timeout_ms


@pytest.mark.parametrize("timeout_ms", [TIGHTEST_DEFAULT_MS, 600_000, 1_800_000])
def test_at_a_frameworks_own_bound_the_silent_rank_stays_a_hang(timeout_ms):
    rc = analyse(timeouts(timeout_ms), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.silent_rank", rc
    assert rc.failure_class is FailureClass.HANG


def test_a_job_hang_after_tightly_bound_timeouts_is_the_programs_too():
    # the watchdog fired but did not take the processes down (pytorch/pytorch#97191): the job then hangs
    found = timeouts(10_000, ranks=(0, 1, 2, 3))
    hang = finding("hang.job", kind="hang", failure_class=FailureClass.HANG, action=Action.RESTART_JOB,
                   time=T0 + 1810.0, seq=10**9, fields={"silent_for": 1800.0})
    rc = analyse([*found, hang], world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.timeout_below_default", rc


def test_a_ranks_own_error_is_no_wait_and_keeps_its_reading():
    found = timeouts(5_000)
    crash = logged(0, 4.0, "RuntimeError: CUDA error: an illegal memory access was encountered")
    assert crash, "the engine reads the CUDA error"
    assert tight_bound(sorted(found + crash, key=lambda f: (f.time, f.seq)), crash) is None
    rc = analyse(found + crash, world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.timeout_below_default"


def test_no_stated_bound_no_reading():
    found = [dataclasses.replace(f, fields={k: v for k, v in f.fields.items() if k != "timeout_ms"})
             for f in timeouts(5_000)]
    assert tight_bound(found, [f for f in found if f.rule_id == "torch.nccl_watchdog_timeout"]) is None
