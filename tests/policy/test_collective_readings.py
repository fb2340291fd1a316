"""Timeout-only incidents read across ranks (issue 12 item 3, ftwatch.policy.collectives): ranks in
different collectives at one SeqNum are a program bug; the same collective everywhere stays
fallout (collectives.timeouts_only reads it as a hang)."""

from __future__ import annotations

from ftwatch.events import FailureClass, Finding, Origin
from ftwatch.policy.collectives import mismatch
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "coll", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def watchdog(rank: int, seq: int, op: str, pg: str = "") -> str:
    where = f"[PG ID {pg} PG GUID {pg}(default_pg) Rank {rank}]" if pg else f"[Rank {rank}]"
    return (f"[rank{rank}]:[E0110 16:40:30.000000 ProcessGroupNCCL.cpp:616] {where} Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1, NumelOut=2, Timeout(ms)=1800000) "
            "ran for 1800071 milliseconds before timing out.")


def test_ranks_in_different_collectives_at_one_seqnum_are_a_program_bug():
    found = [*logged(0, 1.0, watchdog(0, 2437, "ALLREDUCE")), *logged(1, 1.1, watchdog(1, 2437, "ALLGATHER"))]
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "collective.mismatch", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 0
    assert rc.fields["ops"] == {0: "ALLREDUCE", 1: "ALLGATHER"}


def test_the_same_collective_everywhere_is_no_mismatch():
    found = [f for r in range(2) for f in logged(r, 1.0 + r / 10, watchdog(r, 2437, "ALLREDUCE"))]
    assert mismatch(found) is None


def test_different_process_groups_are_not_compared():
    found = [*logged(0, 1.0, watchdog(0, 12, "ALLREDUCE", pg="0")), *logged(1, 1.1, watchdog(1, 12, "BROADCAST", pg="3"))]
    assert mismatch(found) is None


def test_the_same_collective_timing_out_everywhere_stays_fallout():
    found = [f for r in range(2) for f in logged(r, 1.0 + r / 10, watchdog(r, 2437, "ALLREDUCE"))]
    an = analyse(found, world=2)
    assert an.fallout_only and an.root_cause.rule_id == "torch.nccl_watchdog_timeout"
    assert an.fallout_class is FailureClass.HANG
