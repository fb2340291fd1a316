"""A collective timeout of seconds is the job's setting, not a hang, through rootcause.analyse
(ftwatch.policy.timeoutbound): the same timeout-only incident reads as a hang with a default timeout."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.policy.timeoutbound import TIGHTEST_DEFAULT_MS, tight_bound
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())


def watchdog(rank: int, timeout_ms: int, ran_ms: int) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "short", "node-0", "stderr", "process")
    line = (f"[rank{rank}]:[E0502 14:08:41.000331255 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            f"Timeout(ms)={timeout_ms}) ran for {ran_ms} milliseconds before timing out.\n")
    return ENGINE.feed(o, line.encode(), T0 + rank / 10, final=True)


def every_rank(timeout_ms: int, ran_ms: int, world: int = 4) -> list[Finding]:
    return [f for r in range(world) for f in watchdog(r, timeout_ms, ran_ms)]


def test_a_timeout_of_milliseconds_is_the_jobs_configuration():
    an = analyse(every_rank(1, 90), world=4)
    rc = an.root_cause
    assert rc is not None and rc.rule_id == "collective.timeout_below_default", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.fields["timeout_ms"] == 1
    assert not an.fallout_only


def test_a_timeout_of_seconds_with_a_silent_rank_is_the_setting_not_the_silent_rank():
    """torchtitan PR #189: rank 0 exports a trace past a 5 s timeout; the others time out."""
    found = [f for r in (1, 2, 3) for f in watchdog(r, 5000, 5048)]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.timeout_below_default", rc


def test_a_default_timeout_keeps_the_hang_reading():
    an = analyse(every_rank(600000, 600064), world=4)
    assert an.root_cause is not None and an.root_cause.rule_id != "collective.timeout_below_default"
    assert an.fallout_only and an.fallout_class is FailureClass.HANG
    high = every_rank(TIGHTEST_DEFAULT_MS, TIGHTEST_DEFAULT_MS + 60)
    assert tight_bound(high, high) is None


def test_a_real_error_beside_short_timeouts_decides():
    o = Origin("worker-3", 3, "short", "node-0", "stderr", "process")
    oom = ENGINE.feed(o, b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", T0 - 1,
                      final=True)
    rc = analyse([*oom, *every_rank(5000, 5040, world=3)], world=4).root_cause
    assert rc is not None and rc.failure_class is FailureClass.OOM, rc


def test_lines_without_the_configured_timeout_say_nothing():
    o = Origin("worker-0", 0, "short", "node-0", "stderr", "process")
    line = b"[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 0] Timeout at NCCL work: 12, last enqueued NCCL work: 12, " \
           b"last completed NCCL work: 11.\n"
    found = ENGINE.feed(o, line, T0, final=True)
    assert tight_bound(found, found) is None


def test_gloos_wait_gives_its_timeout_too():
    def gloo(rank: int, ms: int) -> list[Finding]:
        o = Origin(f"worker-{rank}", rank, "short", "node-0", "stderr", "process")
        line = (f"[rank{rank}]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                f"unbound_buffer.cc:78] Timed out waiting {ms}ms for recv operation to complete\n")
        return ENGINE.feed(o, line.encode(), T0 + rank / 10, final=True)
    short = [f for r in range(3) for f in gloo(r, 5000)]
    assert short and short[0].rule_id == "gloo.wait_timeout"
    rc = tight_bound(short, short)
    assert rc is not None and rc.fields["timeout_ms"] == 5000
    long = [f for r in range(3) for f in gloo(r, 1800000)]
    assert tight_bound(long, long) is None
