"""A kernel's failed device-side assert() (CUDA C++ Programming Guide, "Assertion"): the program's
fault on the rank that printed it, whether its process then raised cudaErrorAssert or its peers
only timed out waiting for it (ftwatch.policy.lasterror.assert_reported)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
ASSERT = ("../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [31,0,0], thread: [96,0,0] "
          "Assertion `index >= -sizes[i] && index < sizes[i] && \"index out of bounds\"` failed.")


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "assert", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def watchdog(rank: int) -> str:
    return (f"[E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=30877, OpType=_ALLGATHER_BASE, NumelIn=22020096, NumelOut=88080384, "
            "Timeout(ms)=1800000) ran for 1800391 milliseconds before timing out.")


def test_the_kernel_assert_print_is_a_program_error():
    found = logged(2, 0.0, ASSERT)
    assert [f.rule_id for f in found] == ["cuda.kernel_assert_failed"]
    assert found[0].failure_class is FailureClass.USER_CODE and found[0].action is Action.FAIL_JOB


def test_a_rank_whose_kernel_asserted_is_what_its_peers_timed_out_on():
    """The asserting rank raised nothing (it went on into the collective); its peers only time out."""
    found = [*logged(2, 0.0, ASSERT), *(f for r in (0, 1, 3) for f in logged(r, 1800.0 + r, watchdog(r)))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "cuda.kernel_assert_failed", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 2


def test_the_print_yields_to_the_cuda_error_assert_its_process_raised():
    found = [*logged(5, 0.0, ASSERT), *logged(5, 0.5, "RuntimeError: CUDA error: device-side assert triggered")]
    rc = analyse(found, world=8).root_cause
    assert rc is not None and rc.rule_id == "cuda.device_side_assert", rc
    assert rc.rank == 5


def test_another_ranks_assert_report_does_not_explain_the_print():
    found = [*logged(2, 0.0, ASSERT), *logged(5, 0.5, "RuntimeError: CUDA error: device-side assert triggered")]
    rc = analyse(found, world=8).root_cause
    assert rc is not None and rc.rule_id == "cuda.kernel_assert_failed" and rc.rank == 2, rc


def test_whether_a_print_is_reported_later_is_read_from_each_instances_latest_report():
    """``assert_reports`` (each instance's latest cudaErrorAssert, made once) gives every print the
    answer a search of all the errors gives: its own instance reported the assert after it."""
    import random

    from ftwatch.policy.lasterror import assert_reported, assert_reports
    from ftwatch.testing import finding
    rng = random.Random(13)
    rules = ["cuda.kernel_assert_failed", "cuda.device_side_assert", "cuda.rt.assert", "nccl.watchdog_timeout"]
    for _ in range(200):
        errors = [finding(rng.choice(rules), time=T0 + rng.choice([0.0, 1.0, 2.0, 3.0]), seq=seq,
                          rank=rng.randint(0, 2)) for seq in range(rng.randint(1, 30))]
        reports = assert_reports(errors)
        for f in errors:
            searched = f.rule_id == "cuda.kernel_assert_failed" and any(
                e.rule_id in ("cuda.device_side_assert", "cuda.rt.assert") and e.origin.instance == f.origin.instance
                and (f.time, f.seq) < (e.time, e.seq) for e in errors)
            assert assert_reported(f, reports) is searched
