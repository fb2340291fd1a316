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


def progress_line(rank: int, pg: str, seq: int, done: int) -> str:
    return (f"[rank{rank}]:[E0110 16:40:30.000000 ProcessGroupNCCL.cpp:2279] [PG ID {pg} PG GUID {pg}(default_pg) "
            f"Rank {rank}]  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: "
            f"{seq}, last completed work: {done}")


def test_a_rank_that_completed_collectives_its_peer_never_entered_is_a_program_bug():
    """One group's ranks disagree on how many collectives they issued (Ray Train's NCCL hang
    detector, the flight recorder's matching by sequence id): rank 1 completed work 41876 while
    rank 0 still waits in 41212, which only different control flow does."""
    found = [*logged(0, 1.0, watchdog(0, 41212, "ALLREDUCE", pg="0"), progress_line(0, "0", 41212, 41211)),
             *logged(1, 1.1, watchdog(1, 41877, "ALLREDUCE", pg="0"), progress_line(1, "0", 41877, 41876))]
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "collective.mismatch", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 0
    assert rc.fields["behind"] == 0 and rc.fields["ahead"] == [1]
    # progress stated about another work (an earlier attempt's line) is not where the rank is
    other = [*logged(0, 1.0, watchdog(0, 41212, "ALLREDUCE", pg="0")),
             *logged(1, 1.1, watchdog(1, 41213, "ALLREDUCE", pg="0"), progress_line(1, "0", 41877, 41876))]
    assert mismatch(other) is None


def test_unnamed_groups_compare_seqnums_only_between_two_ranks_that_each_report_one():
    """torch < 2.3 names no group: in a world of two, SeqNums two apart on ranks that each report
    one are the ranks' counts disagreeing; a rank that reports several SeqNums may be in several
    groups, and with more ranks a data-parallel peer waits for a rank stuck in its tensor-parallel
    group by another numbering."""
    found = [*logged(0, 1.0, watchdog(0, 233, "BROADCAST")), *logged(1, 1.1, watchdog(1, 231, "ALLREDUCE"))]
    rc = mismatch(found, world=2)
    assert rc is not None and rc.rank == 1 and rc.fields["pg"] is None, rc
    assert mismatch(found) is None and mismatch(found, world=8) is None
    several = [*found, *logged(0, 1.2, watchdog(0, 64211, "ALLREDUCE"))]
    assert mismatch(several, world=2) is None


def test_one_collective_apart_or_point_to_point_is_no_count_mismatch():
    """A gap of one: a fault may stop a rank in the tail of work its peer just completed. A pipeline
    group's sends and receives are numbered per rank by design; so may be a batched send/receive
    (``COALESCED`` without a gather's larger output)."""
    one = [*logged(0, 1.0, watchdog(0, 207114, "ALLREDUCE")), *logged(1, 1.1, watchdog(1, 207113, "ALLREDUCE"))]
    assert mismatch(one, world=2) is None
    p2p = [*logged(2, 1.0, watchdog(2, 2121, "SEND", pg="3")), *logged(3, 1.1, watchdog(3, 2118, "RECV", pg="3"))]
    assert mismatch(p2p) is None
    batched = [*logged(0, 1.0, watchdog(0, 500, "COALESCED", pg="2").replace("NumelOut=2", "NumelOut=1")),
               *logged(1, 1.1, watchdog(1, 510, "COALESCED", pg="2").replace("NumelOut=2", "NumelOut=1"))]
    assert mismatch(batched) is None
    gathers = [*logged(0, 1.0, watchdog(0, 500, "COALESCED", pg="2")), *logged(1, 1.1, watchdog(1, 510, "COALESCED", pg="2"))]
    assert mismatch(gathers) is not None
