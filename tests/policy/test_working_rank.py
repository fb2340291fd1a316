"""Ranks that timed out waiting while another rank wrote lines of its own work well inside their
wait (ftwatch.policy.busy.working_rank, issue 12 item 3): that rank ran its own code, not their
collective, so the program held them past its timeout (user_code); a rank whose last line came at
the moment the wait began (a save stuck on its storage) keeps the hang reading."""

from __future__ import annotations

from ftwatch.events import FailureClass, Finding, Origin
from ftwatch.policy.busy import INSIDE_SECONDS, WORK_RULES, waits, working_rank
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
RULES = load_rules()
ENGINE = Engine(RULES)
TIMEOUT_S = 600.0
FIRED = 2000.0                          # the waiting ranks' watchdogs fire here: their wait began ~1400


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "work", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def watchdog(rank: int) -> str:
    return (f"[rank{rank}]:[E ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=6151, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
            "for 600084 milliseconds before timing out.")


def incident(*rank0: tuple[float, str]) -> list[Finding]:
    found = [f for t, line in rank0 for f in logged(0, t, line)]
    for r in (1, 2, 3):
        found += logged(r, FIRED + r / 10, watchdog(r))
    return found


WRITE = "INFO bergson: writing factors to /shared/runs/ekfac-64k/hessians"
EVAL = "INFO - EvalCallback: 6400/12000 samples done"


def test_a_rank_writing_its_own_file_well_inside_the_wait_held_its_peers():
    rc = analyse(incident((1200.0, "INFO bergson: eigendecomposing 96 matrices"), (1800.0, WRITE)), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 0
    assert rc.fields["waiting"] == [1, 2, 3] and rc.fields["phase"] == "lifecycle.own_work.writing"
    assert rc.fields["timeout_s"] == TIMEOUT_S and round(rc.fields["inside_s"]) == 400   # from the last watchdog


def test_an_evaluation_going_on_inside_the_wait_held_its_peers():
    rc = analyse(incident((1100.0, "Running evaluation"), (1800.0, EVAL)), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank" and rc.rank == 0, rc


def test_a_save_line_at_the_moment_the_wait_began_keeps_the_hang_reading():
    """Rank 0 said it saves and then nothing: stuck on its storage looks the same."""
    began = FIRED + 0.1 - TIMEOUT_S
    found = incident((began + INSIDE_SECONDS - 60, WRITE))
    assert working_rank(found, waits(found, [f for f in found if f.rank != 0])) is None
    rc = analyse(found, world=4).root_cause
    assert rc is None or rc.rule_id != "collective.busy_rank", rc


def test_the_same_work_on_a_waiting_rank_is_nothing_of_one_ranks_own():
    found = incident((1800.0, EVAL)) + logged(2, 1700.0, EVAL)
    rc = analyse(sorted(found, key=lambda f: (f.time, f.seq)), world=4).root_cause
    assert rc is None or rc.rule_id != "collective.busy_rank", rc


def test_a_working_rank_with_an_error_of_its_own_is_no_busy_rank():
    found = incident((1800.0, WRITE)) + logged(0, 1900.0, "RuntimeError: CUDA error: an illegal memory access was "
                                               "encountered")
    rc = analyse(sorted(found, key=lambda f: (f.time, f.seq)), world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.busy_rank", rc


def test_work_rules_are_the_packs_own_work_rules():
    assert {r.id for r in RULES if "own_work" in r.tags} == WORK_RULES


LOADED = "INFO rank 0: finished loading training data (812 shards)"


def test_a_rank_still_loading_its_input_well_inside_the_wait_held_its_peers():
    """Every rank reads its whole input at start-up (each process its own copy): the one that said
    it finished loading well inside its peers' first collective wait was in its own work then."""
    rc = analyse(incident((100.0, "Start loading data"), (1800.0, LOADED)), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank" and rc.rank == 0, rc
    assert rc.fields["phase"] == "lifecycle.own_work.data_loading"


def test_a_waiting_ranks_own_loading_line_dates_its_wait():
    """The waiting ranks said they finished loading at 1500, then called the collective: their wait
    began no earlier than that, although their watchdog lines (as a replay dates an unstamped one)
    put its start at 1400. Rank 0's line at 1850 is then well inside it, not work they did too."""
    found = incident((100.0, "Start loading data"), (1850.0, LOADED))
    for r in (1, 2, 3):
        found += logged(r, 1500.0 + r, LOADED)
    rc = analyse(sorted(found, key=lambda f: (f.time, f.seq)), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank" and rc.rank == 0, rc


def test_a_loading_line_just_after_the_waiting_ranks_own_is_no_busy_rank():
    found = incident((1650.0, LOADED))
    for r in (1, 2, 3):
        found += logged(r, 1500.0 + r, LOADED)
    rc = analyse(sorted(found, key=lambda f: (f.time, f.seq)), world=4).root_cause
    assert rc is None or rc.rule_id != "collective.busy_rank", rc
