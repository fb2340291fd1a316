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


def watchdog(rank: int, seq: int, op: str, pg: str = "", numel: int = 1) -> str:
    where = f"[PG ID {pg} PG GUID {pg}(default_pg) Rank {rank}]" if pg else f"[Rank {rank}]"
    return (f"[rank{rank}]:[E0110 16:40:30.000000 ProcessGroupNCCL.cpp:616] {where} Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={2 * numel}, "
            "Timeout(ms)=1800000) "
            "ran for 1800071 milliseconds before timing out.")


def test_ranks_in_different_collectives_at_one_seqnum_are_a_program_bug():
    found = [*logged(0, 1.0, watchdog(0, 2437, "ALLREDUCE")), *logged(1, 1.1, watchdog(1, 2437, "ALLGATHER"))]
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "collective.mismatch", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 0
    assert rc.fields["ops"] == {0: "ALLREDUCE", 1: "ALLGATHER"}


def test_different_collectives_named_only_by_the_watchdog_lines_are_a_program_bug():
    """A launcher that prefixes nothing (torch 1.x's ``[E ProcessGroupNCCL.cpp:740] [Rank 1] ...``,
    one shared stream): the rank the c10d line names in the default group is the line's rank."""
    o = Origin("job-log", None, "coll", "node-0", "stderr", "file")
    text = "".join(f"[E ProcessGroupNCCL.cpp:740] [Rank {r}] Watchdog caught collective operation timeout: "
                   f"WorkNCCL(SeqNum=118402, OpType={op}, Timeout(ms)=1800000) ran for 1801942 milliseconds "
                   "before timing out.\n" for r, op in ((0, "_ALLGATHER_BASE"), (1, "REDUCE"), (2, "REDUCE")))
    found = ENGINE.feed(o, text.encode(), T0 + 1.0, final=True)
    rc = mismatch(found)
    assert rc is not None and rc.failure_class is FailureClass.USER_CODE, rc
    assert rc.fields["ops"] == {0: "_ALLGATHER_BASE", 1: "REDUCE", 2: "REDUCE"}
    assert "rank 0 is the odd one out" in rc.line
    same = text.replace("_ALLGATHER_BASE", "REDUCE")
    assert mismatch(ENGINE.feed(o, same.encode(), T0 + 1.0, final=True)) is None


def test_the_same_collective_everywhere_is_no_mismatch():
    found = [f for r in range(2) for f in logged(r, 1.0 + r / 10, watchdog(r, 2437, "ALLREDUCE"))]
    assert mismatch(found) is None


def test_one_sized_collective_on_different_sizes_is_a_program_bug():
    """ZeRO-3: the rank that left generate() gathers another layer's parameter (NCCL's all-gather
    takes one count on every rank; TORCH_DISTRIBUTED_DEBUG=DETAIL compares the sizes)."""
    found = [*logged(0, 1.0, watchdog(0, 20911, "_ALLGATHER_BASE", numel=114688)),
             *logged(1, 1.1, watchdog(1, 20911, "_ALLGATHER_BASE", numel=114688)),
             *logged(3, 1.2, watchdog(3, 20911, "_ALLGATHER_BASE", numel=4718592))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.mismatch", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 3      # the odd one out
    assert rc.fields["sizes"] == {0: 114688, 1: 114688, 3: 4718592}


def test_uneven_sizes_where_torch_allows_them_are_no_mismatch():
    """All-to-all takes split sizes and list all_gather accepts uneven tensors: sizes may differ."""
    for op in ("ALLTOALL_BASE", "ALLGATHER", "SEND"):
        found = [*logged(0, 1.0, watchdog(0, 77, op, numel=100)), *logged(1, 1.1, watchdog(1, 77, op, numel=300))]
        assert mismatch(found) is None, op


def test_different_process_groups_are_not_compared():
    found = [*logged(0, 1.0, watchdog(0, 12, "ALLREDUCE", pg="0")), *logged(1, 1.1, watchdog(1, 12, "BROADCAST", pg="3"))]
    assert mismatch(found) is None


def test_the_same_collective_timing_out_everywhere_stays_fallout():
    found = [f for r in range(2) for f in logged(r, 1.0 + r / 10, watchdog(r, 2437, "ALLREDUCE"))]
    an = analyse(found, world=2)
    assert an.fallout_only and an.root_cause.rule_id == "torch.nccl_watchdog_timeout"
    assert an.fallout_class is FailureClass.HANG


def test_a_ddp_reducer_error_is_the_program_bug_its_peers_wait_on():
    """reducer.cpp's unused-parameter error on one rank (dist_vocab.tsv) is the root cause; the
    peers' later watchdog timeouts are its fallout."""
    found = [*logged(1, 1.0, "[rank1]:Traceback (most recent call last):",
                     '[rank1]:  File "train.py", line 88, in <module>',
                     "[rank1]:    loss = model(batch).sum()",
                     "[rank1]:RuntimeError: Expected to have finished reduction in the prior iteration before "
                     "starting a new one. This error indicates that your module has parameters that were not "
                     "used in producing loss."),
             *logged(0, 600.0, watchdog(0, 812, "ALLREDUCE"))]
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "ddp.prior_reduction_unfinished", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 1


def test_torch_collective_fingerprint_mismatch_is_a_program_bug():
    found = logged(0, 1.0, "[rank0]:RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is "
                           "running collective: CollectiveFingerPrint(SequenceNumber=9, OpType=ALLREDUCE), but "
                           "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=9, OpType=BROADCAST).")
    assert [f.rule_id for f in found] == ["c10d.collective_mismatch_detected"]
    assert found[0].failure_class is FailureClass.USER_CODE


NCCL_SUSPECTED = ("gpu-a:31502:31620 [0] init.cc:1256 NCCL WARN Your program may be hanging, this may be caused by a "
                  "collective mismatch around rank 0. Please check your collective calls at and around this rank. "
                  "You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to see the collective logs")
NCCL_ASSERTED = ("gpu-a:21403:21403 [3] init.cc:1247 NCCL WARN Mismatched collective detected, please check your "
                 "collective calls at and around rank 3. You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to see "
                 "the collective logs")


def bare_watchdog(rank: int, seq: int = 2437) -> str:
    """The torch 1.x form, no time stamp of its own: the test's time is the line's."""
    return (f"[E ProcessGroupNCCL.cpp:821] [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1801398 milliseconds "
            "before timing out.")


def test_nccls_suspected_mismatch_before_the_timeouts_is_a_program_bug():
    """NCCL's device check (primitives.h checkMismatch: a peer advanced its op count while this rank
    waits in its current op) names what the same SeqNum everywhere cannot show."""
    found = [*logged(0, 0.5, NCCL_SUSPECTED),
             *(f for r in range(2) for f in logged(r, 1.0 + r / 10, bare_watchdog(r)))]
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "collective.mismatch", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 0
    assert rc.fields["warning"] == "nccl.collective_mismatch_suspected"


def test_nccls_suspected_mismatch_alone_is_evidence_not_a_failure():
    """Without a timeout after it (training went on, or nothing waited) the warning decides nothing."""
    found = logged(0, 0.5, NCCL_SUSPECTED)
    assert [f.severity.name for f in found] == ["INFO"]
    assert mismatch(found) is None
    late = [*logged(0, 9.0, NCCL_SUSPECTED), *logged(1, 1.0, bare_watchdog(1))]
    assert mismatch(late) is None


def test_nccls_asserted_mismatch_is_a_program_bug_of_its_own():
    """init.cc: ncclDevAssertedMismatch sets the communicator's fatal error to ncclInvalidUsage."""
    found = [*logged(3, 0.5, NCCL_ASSERTED), *logged(1, 1.0, bare_watchdog(1))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "nccl.collective_mismatch_asserted", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 3
