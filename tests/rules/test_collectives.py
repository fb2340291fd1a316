"""The collective fields of watchdog / flight-recorder lines (SPEC P3) and the rank the others
wait for (``ftwatch.policy.collectives``); DLRover's private exit codes (issue 12 item 6)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.parsers.collective import fields as collective_fields
from ftwatch.policy.collectives import silent_rank
from ftwatch.policy.lifecycle import launcher_of_command
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding

T0 = 1_795_219_200.0


def timeout(rank: int, t: float, **fields) -> Finding:
    return Finding("torch.nccl_watchdog_timeout", "keyword", FailureClass.FALLOUT, Action.RESTART_IN_PLACE,
                   Severity.ERROR, Origin(f"worker-{rank}", rank, "j", "n1"), "timeout", T0 + t, int(t * 10),
                   fields=fields)


def test_fields_of_the_watchdog_and_flight_recorder_lines():
    assert collective_fields("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=902, "
                             "OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800117 "
                             "milliseconds before timing out.") == {
        "seq": 902, "op": "BROADCAST", "numel_in": 1, "numel_out": 1, "timeout_ms": 1800000, "ran_ms": 1800117}
    assert collective_fields("[PG 0 (default_pg) Rank 1] Timeout at NCCL work: 6463, last enqueued NCCL work: "
                             "6463, last completed NCCL work: 6462.") == {
        "seq": 6463, "last_enqueued": 6463, "last_completed": 6462}
    assert collective_fields("Received a dump signal due to a collective timeout from  rank 7 and we will try our "
                             "best to dump the debug info. Last enqueued NCCL work: 56118, last completed NCCL "
                             "work: 56118.") == {"last_enqueued": 56118, "last_completed": 56118, "timeout_from": 7}
    assert collective_fields("WorkHCCL(SeqNum=12, OpType=ALLREDUCE, Timeout(ms)=1800000)")["seq"] == 12
    assert collective_fields("step 7 loss 0.1") == {}


def test_a_silent_rank_among_four_is_the_suspect():
    found = [timeout(r, 600 + r, seq=812, op="ALLREDUCE") for r in (0, 1, 2)]
    suspect = silent_rank(found, world=4)
    assert suspect is not None and suspect.rank == 3 and suspect.rule_id == "collective.silent_rank"
    assert suspect.origin.instance == "worker-3" and suspect.failure_class is FailureClass.HANG
    an = analyse(found, world=4)
    assert an.root_cause == suspect and an.real == (suspect,) and not an.fallout_only
    assert analyse(found).fallout_only                      # world unknown: no one is named


def test_one_timeout_beside_three_quiet_ranks_names_no_one():
    assert silent_rank([timeout(0, 600, seq=33371, op="ALLGATHER")], world=4) is None


def test_the_rank_behind_the_others_is_the_suspect():
    found = [timeout(0, 600, seq=135, last_completed=134), timeout(1, 601, seq=132, last_completed=131),
             timeout(2, 602, seq=135, last_completed=134)]
    suspect = silent_rank(found, world=3)
    assert suspect is not None and suspect.rank == 1 and suspect.rule_id == "collective.behind_rank"


def test_every_rank_at_the_same_collective_names_no_one():
    assert silent_rank([timeout(r, 600 + r, seq=812) for r in range(4)], world=4) is None


def test_the_silent_ranks_own_hardware_warning_makes_it_the_nodes_fault():
    warn = Finding("xid.63", "fault_code", FailureClass.HARDWARE_NODE, Action.NOTIFY, Severity.WARNING,
                   Origin("worker-3", 3, "j", "n2"), "row remap pending", T0 + 10, 1)
    suspect = silent_rank([timeout(r, 600 + r, seq=812) for r in (0, 1, 2)] + [warn], world=4)
    assert suspect.failure_class is FailureClass.HARDWARE_NODE and suspect.action is Action.ISOLATE_NODE
    assert suspect.origin.node == "n2"



def test_many_ranks_each_reporting_again_and_again_name_the_rank_behind(seed=5):
    """Hundreds of ranks, several timeout reports each, some ranks behind: the suspects are the
    ranks whose least completed work is the lowest, read in one pass over the reports (per rank
    over all of them was O(ranks²), issue 16), with the suspect's own origin."""
    import random
    rnd = random.Random(seed)
    found = []
    for r in range(600):
        low = 130 if r in (17, 403) else 134
        for k in range(3):
            found.append(timeout(r, 600 + rnd.random() * 60, seq=low + 1 + k, last_completed=low + k))
    rnd.shuffle(found)
    suspect = silent_rank(found, world=600)
    assert suspect is not None and suspect.rule_id == "collective.behind_rank"
    assert suspect.fields["suspects"] == [17, 403] and suspect.rank == 17
    assert suspect.origin == Origin("worker-17", 17, "j", "n1")
    assert "last completed work 130, the others up to 134" in suspect.line


def test_thousands_of_silent_ranks_beside_more_reporters_take_a_reporters_origin():
    """World 5,000: 3,000 ranks report one collective, 2,000 say nothing. The silent ranks are
    the suspects; having no finding of their own, each gets a reporter's origin with its rank
    swapped in (one pass over the findings for all of them)."""
    found = [timeout(r, 600 + r / 1000, seq=812, op="ALLREDUCE") for r in range(3000)]
    suspect = silent_rank(found, world=5000)
    assert suspect is not None and suspect.rule_id == "collective.silent_rank"
    assert suspect.fields["suspects"][:2] == [3000, 3001] and len(suspect.fields["suspects"]) == 2000
    assert suspect.origin == Origin("worker-3000", 3000, "j", "n1")

def test_dlrovers_exit_14_only_under_dlrover():
    table = ExitCodeTable.load()
    exit = ProcessExit(Origin("worker-1", 1), 101, 14, None, T0)
    plain = exit_finding(exit, table)
    assert plain.failure_class is FailureClass.USER_CODE and plain.fields["generic"] is True
    assert plain.fields["private_to"] == "dlrover"
    under = exit_finding(exit, table, launchers={"dlrover"})
    assert under.failure_class is FailureClass.HARDWARE_NODE and under.action is Action.ISOLATE_NODE
    assert under.fields["generic"] is False


def test_the_launcher_of_a_command():
    assert launcher_of_command(["/usr/local/bin/dlrover-run", "--nproc_per_node=8", "train.py"]) == "dlrover"
    assert launcher_of_command(["python", "-m", "dlrover.trainer.torch.elastic_run", "train.py"]) == "dlrover"
    assert launcher_of_command(["torchrun", "train.py"]) is None and launcher_of_command([]) is None


def job_hang(t: float) -> Finding:
    return Finding("hang.job", "hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR,
                   Origin("train", None, "j", "n1"), "no output for 1800 s", T0 + t, int(t * 10))


def test_a_job_hang_after_watchdogs_that_name_different_sizes_is_their_mismatch():
    """The ranks' own watchdog reports (one SeqNum, one all-gather, different NumelIn) say why the job went
    quiet: they issued different collectives. A job hang on top of them does not hide that."""
    found = [timeout(0, 600, seq=1187, op="_ALLGATHER_BASE", numel_in=1),
             timeout(1, 601, seq=1187, op="_ALLGATHER_BASE", numel_in=5), job_hang(1800)]
    an = analyse(found, world=2)
    assert an.root_cause is not None and an.root_cause.rule_id == "collective.mismatch", an
    assert an.root_cause.failure_class is FailureClass.USER_CODE


def test_a_job_hang_after_watchdogs_at_one_collective_alike_stays_a_hang():
    found = [timeout(0, 600, seq=1187, op="_ALLGATHER_BASE", numel_in=5),
             timeout(1, 601, seq=1187, op="_ALLGATHER_BASE", numel_in=5), job_hang(1800)]
    assert analyse(found, world=2).root_cause.rule_id == "hang.job"
