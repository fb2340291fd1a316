"""Ranks that stated unequal batch counts right before a job hang (ftwatch.policy.rankcounts, read by
ftwatch.policy.leftpath.left_before_hang; issue 12 item 3): the uneven inputs of PyTorch's Join
tutorial ("if a rank has fewer inputs, then the other ranks will hang"), the program's data split.
Counts that agree, or a lone rank's count, say nothing of the hang."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.rankcounts import RANK_BATCHES, unequal_counts
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())


def logged(t: float, *lines: str, rank: int | None = None) -> list[Finding]:
    o = Origin(f"worker-{rank}" if rank is not None else "combined", rank, "counts", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def job_hang(t: float, silent: float = 1800.0) -> Finding:
    o = Origin("combined", None, "counts", "node-0", "stderr", "process")
    return Finding("hang.job", "hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR, o,
                   f"no output from any of 1 instance for {silent:.0f} s", T0 + t, 10_000,
                   fields={"silent_for": silent, "instances": 1})


def epoch(counts: list[int], t: float = 0.0) -> list[Finding]:
    return [f for r, n in enumerate(counts) for f in logged(t + r, f"INFO - run - Rank {r}, epoch 5: number of batches {n}")]


def test_a_job_hang_right_after_the_ranks_stated_unequal_counts_is_their_uneven_inputs():
    rc = analyse(epoch([4, 4, 8, 4]) + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.fields["phase"] == RANK_BATCHES and rc.fields["counts"] == {0: 4, 1: 4, 2: 8, 3: 4}


def test_a_lone_rank_with_the_fewest_is_named():
    rc = analyse(epoch([8, 8, 3, 8]) + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.fields["left"] == 2


def test_counts_that_agree_keep_the_hang_reading():
    rc = analyse(epoch([4, 4, 4, 4]) + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def test_an_earlier_epochs_counts_are_not_compared_with_the_latest():
    """Rank 2 had 8 an epoch ago; every rank now has 4: the latest counts agree."""
    found = epoch([4, 4, 8, 4], t=0.0) + epoch([4, 4, 4, 4], t=3600.0)
    rc = analyse(found + [job_hang(5400.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def test_unequal_counts_long_before_the_hang_keep_the_hang_reading():
    rc = analyse(epoch([4, 4, 8, 4]) + [job_hang(7200.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"



def test_the_counts_read_from_the_lines_of_two_wordings():
    found = logged(0.0, "[2021-10-07 08:11:50] rank 0: sampled training shards: 4410 batches this epoch")
    found += logged(1.0, "[2021-10-07 08:11:50] rank 1: sampled training shards: 4427 batches this epoch")
    last = max((f for f in found if f.rule_id == RANK_BATCHES), key=lambda f: (f.time, f.seq))
    assert unequal_counts(last, found) == {0: 4410, 1: 4427}
    assert unequal_counts(last, found[-1:]) is None        # one rank's count alone compares with nothing
