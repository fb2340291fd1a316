"""Rule 22 of rootcause: a store-based barrier that counted more arrivals than ranks (ftwatch.policy.rejoined)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.rejoined import REJOINED_RULE, counts, rejoined, restarted_alone
from ftwatch.policy.rootcause import analyse

T0 = 1_795_219_200.0
OLD_OVER = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 2, for key: "
            "store_based_barrier_key:1 (world_size=4, worker_count=5, timeout=0:30:00)")
NEW_OVER = ("torch.distributed.DistStoreError: Timed out initializing process group in store based barrier on rank 3, "
            "for key: store_based_barrier_key:1 (world_size=8, num_workers_joined=16, timeout=0:30:00 error=Socket "
            "Timeout)")
UNDER = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for key: "
         "store_based_barrier_key:1 (world_size=2, worker_count=1, timeout=0:30:00)")


def err(line: str, cls: FailureClass = FailureClass.USER_CODE, rule: str = "python.exception.RuntimeError") -> Finding:
    return Finding(rule, "keyword", cls, Action.FAIL_JOB, Severity.ERROR,
                   Origin("rank2", 2, "job", "node-0", "stderr", "process"), line, T0,
                   evidence=("Traceback (most recent call last):", line))


def test_counts_read_both_pytorch_formats():
    assert counts(OLD_OVER) == (4, 5) and counts(NEW_OVER) == (8, 16) and counts(UNDER) == (2, 1)
    assert counts("Waiting in store based barrier to initialize process group for rank: 2") is None


def test_more_arrivals_than_ranks_is_a_job_hang_to_restart():
    for line in (OLD_OVER, NEW_OVER):
        an = analyse([err(line)])
        assert an.root_cause.rule_id == REJOINED_RULE
        assert an.root_cause.failure_class is FailureClass.HANG and an.root_cause.action is Action.RESTART_JOB


def test_fewer_arrivals_keep_their_grade():
    """Ranks that never arrived: the message does not say whose fault (a wrong address, too few processes)."""
    f = err(UNDER)
    assert not rejoined(f) and restarted_alone([f]) == [f]
    assert analyse([f]).root_cause.rule_id == "python.exception.RuntimeError"


def test_fallout_is_left_as_it_is():
    f = err(OLD_OVER, FailureClass.FALLOUT, "c10d.store_fallout")
    assert not rejoined(f)
