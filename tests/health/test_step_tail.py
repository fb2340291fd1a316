"""The step tap reads a chunk's tail once a stream's ranks are known (``ftwatch.rules.steptail``,
issue 16): a bounded number of step lines per rank and chunk, a full pass for the first chunk, a
new rank, a refresh every ``FULL_EVERY``-th chunk, a head and a tail of a stream's first chunk,
Megatron's straggler reports wherever they are, and the straggler verdicts still found."""

from __future__ import annotations

import pytest

from ftwatch.clock import FakeClock
from ftwatch.config.health import StragglerConfig
from ftwatch.events import Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.rules.steptail import FULL_EVERY, REFRESH_FIRST, TAIL_PER_RANK
from ftwatch.rules.stragglers import StepTracker

MEGATRON = ("[rank{r}]: [2026-11-21 09:00:00] iteration {n:8d}/ 1000000 | consumed samples: 64 | "
            "elapsed time per iteration (ms): {ms:.1f} | lm loss: 7.1E+00 |\n")
DETECTOR = ("[rank0]: [2024-03-14 23:07:00] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 9000.00ms/5 | "
            "MnPwr/Rnk: 601796W/8 | MxPwr/Rnk: 683801W/18 | MnTmp/Rnk: 52C/0 | MxTmp/Rnk: 65C/21\n")


@pytest.fixture(scope="module")
def rules():
    return load_rules([], builtin=True)


def chunk(first: int, steps: int, ranks: range, ms=lambda r: 1000.0) -> bytes:
    """``steps`` iterations from ``first``, every rank of ``ranks`` printing each one."""
    return "".join(MEGATRON.format(r=r, n=n, ms=ms(r)) for n in range(first, first + steps) for r in ranks).encode()


def feed(tails: bool, rules, chunks: list[bytes]) -> tuple[StepTracker, list]:
    tracker = StepTracker(StragglerConfig(min_steps=5), clock=FakeClock(0.0), tails=tails)
    engine = Engine(rules, steps=tracker)
    origin = Origin("combined", None, "job1", "n", "stdout", "replay")
    found = []
    for data in chunks:
        found += engine.feed(origin, data, 100.0, sim_step=0.001)
    return tracker, found


def test_after_the_first_chunk_each_rank_takes_only_its_last_lines(rules):
    tracker, _ = feed(True, rules, [chunk(1, 40, range(4)), chunk(41, 40, range(4))])
    seen = {name: rank.seen for name, rank in tracker.jobs["job1"].ranks.items()}
    assert seen == {f"rank{r}": 40 + TAIL_PER_RANK for r in range(4)}
    untailed, _ = feed(False, rules, [chunk(1, 40, range(4)), chunk(41, 40, range(4))])
    assert {r.seen for r in untailed.jobs["job1"].ranks.values()} == {80}   # without tails: every line


def test_a_rank_new_to_the_stream_takes_a_full_pass(rules):
    tracker, _ = feed(True, rules, [chunk(1, 40, range(2)), chunk(41, 40, range(3))])
    seen = {name: rank.seen for name, rank in tracker.jobs["job1"].ranks.items()}
    assert seen == {"rank0": 80, "rank1": 80, "rank2": 40}


def test_every_full_every_th_chunk_of_a_stretch_shorter_than_the_refresh_is_read_whole(rules):
    chunks = [chunk(1 + 20 * k, 20, range(2)) for k in range(FULL_EVERY + 1)]
    assert all(len(c) < REFRESH_FIRST for c in chunks)
    tracker, _ = feed(True, rules, chunks)
    # the first chunk whole, then FULL_EVERY - 1 tails, then a whole one, then a tail
    want = 20 + (FULL_EVERY - 1) * TAIL_PER_RANK + 20
    assert {rank.seen for rank in tracker.jobs["job1"].ranks.values()} == {want}


def test_a_refresh_reads_a_stretch_that_fills_each_ranks_window_as_a_full_pass_would(rules):
    """The FULL_EVERY-th chunk, far longer than a window of 8 ranks' lines: the refresh reads a
    last stretch, yet every rank's window (its last ``window`` step times) is the one reading
    every line leaves; a rank that printed only at the chunk's start leaves the known ranks."""
    ms = lambda r: 1000.0 + r                                    # noqa: E731 - per rank, so windows differ
    step = 1 + 20 * FULL_EVERY
    big = chunk(step, 5, range(9), ms) + chunk(step + 5, 600, range(8), lambda r: 900.0 + r)
    assert len(big) > 4 * REFRESH_FIRST
    # the first chunk whole, FULL_EVERY - 1 tails, then the refresh
    chunks = [chunk(1 + 20 * k, 20, range(9), ms) for k in range(FULL_EVERY)] + [big]
    tailed, _ = feed(True, rules, chunks)
    whole, _ = feed(False, rules, chunks)
    ranks, every = tailed.jobs["job1"].ranks, whole.jobs["job1"].ranks
    for r in range(8):
        assert list(ranks[f"rank{r}"].samples) == list(every[f"rank{r}"].samples), r
        assert ranks[f"rank{r}"].seen < every[f"rank{r}"].seen      # fewer lines read
    stream = tailed.tails.streams[Origin("combined", None, "job1", "n", "stdout", "replay")]
    assert stream.known == set(range(8)) and stream.chunks == 0


def state(rank) -> tuple:
    """What the verdicts read of a rank: its window, recent window, baseline, last step."""
    return list(rank.samples), list(rank.recent), list(rank.baseline), rank.base_median, rank.last[0]


def test_a_long_first_chunk_reads_a_head_and_a_tail_that_leave_every_rank_as_a_full_pass_does(rules):
    """A first chunk far longer than 8 ranks' windows, slower at its start (the baseline) than at
    its end: each rank's window, recent window and baseline are those of reading every line."""
    first = chunk(1, 20, range(8), lambda r: 2000.0 + r) + chunk(21, 600, range(8), lambda r: 1000.0 + r) \
        + DETECTOR.encode() + chunk(621, 200, range(8), lambda r: 900.0 + r)
    assert len(first) > 8 * REFRESH_FIRST
    tailed, found = feed(True, rules, [first])
    whole, found_whole = feed(False, rules, [first])
    ranks, every = tailed.jobs["job1"].ranks, whole.jobs["job1"].ranks
    for r in range(8):
        assert state(ranks[f"rank{r}"]) == state(every[f"rank{r}"]), r
        assert ranks[f"rank{r}"].seen < every[f"rank{r}"].seen
    assert [(f.rule_id, f.rank) for f in found] == [(f.rule_id, f.rank) for f in found_whole]


def test_a_slowdown_inside_the_first_chunk_of_a_one_rank_job_is_still_found(rules):
    """One rank prints (Megatron's last rank): its baseline is its first step times, so a job that
    slowed down 3x within its first chunk is found with a head and tail as with every line."""
    first = chunk(1, 300, range(1)) + chunk(301, 5000, range(1), lambda r: 3000.0)
    assert len(first) > 8 * REFRESH_FIRST
    for tails in (True, False):
        _, found = feed(tails, rules, [first])
        assert [f.rule_id for f in found] == ["straggler.job_slowdown"], tails


def test_a_slow_rank_is_still_found_from_the_tails(rules):
    chunks = [chunk(1, 40, range(8))] + [chunk(41 + 40 * k, 40, range(8), ms=lambda r: 3000.0 if r == 5 else 1000.0)
                                         for k in range(20)]
    for tails in (True, False):
        _, found = feed(tails, rules, chunks)
        assert [(f.rule_id, f.rank) for f in found] == [("straggler.step_time", 5)], tails


def test_straggler_reports_outside_the_tail_still_count(rules):
    chunks = [chunk(1, 40, range(2))] + [DETECTOR.encode() + chunk(41 + 40 * k, 40, range(2)) for k in range(3)]
    _, found = feed(True, rules, chunks)
    assert [(f.rule_id, f.rank) for f in found] == [("straggler.megatron_detector", 5)]


def test_a_sparse_rank_does_not_make_the_tail_grow(rules):
    """A key with few step lines in the last full pass (here unprefixed ``step N`` lines) stays
    known but is not waited for: the tail stops once the busy ranks have their lines (before,
    it read on to the chunk's start to find the sparse key's lines)."""
    sparse = b"step 7 loss 1.0\nstep 8 loss 1.0\n"
    tracker = StepTracker(StragglerConfig(min_steps=5), clock=FakeClock(0.0))
    stream = Origin("combined", None, "job1", "n", "stdout", "replay")
    first = sparse + chunk(1, 40, range(4))
    tracker.tails.find(stream, first, len(first), ())                      # the full pass
    assert tracker.tails.streams[stream].sparse == {None}
    second = sparse + chunk(41, 20, range(4))
    hits, groups = tracker.tails.find(stream, second, len(second), ())
    assert None not in groups                                              # the chunk's start not read
    assert {key: len(mine) for key, mine in groups.items()} == {r: TAIL_PER_RANK for r in range(4)}


def test_the_straggler_report_pass_finds_what_the_full_gate_finds(rules):
    data = chunk(1, 10, range(2)) + DETECTOR.encode() + chunk(11, 10, range(2))
    lines = StepTracker(StragglerConfig()).lines
    inexact = frozenset(i for i, exact in enumerate(lines.exact) if not exact)
    every = [hit for hit in lines.find(data, len(data)) if hit[1] in inexact]
    assert every and lines.find(data, len(data), only=inexact) == every
    assert lines.find(chunk(1, 10, range(2)), 10 ** 6, only=inexact) == []


def test_a_first_chunks_lines_of_each_rank_stay_in_line_order(rules):
    """Head, the straggler reports between, then the end stretch: each rank's lines in line order
    (the tap takes them so), also for the rank whose report sits in the middle."""
    first = chunk(1, 400, range(8)) + DETECTOR.encode() + chunk(401, 400, range(8))
    tracker = StepTracker(StragglerConfig(min_steps=5))
    stream = Origin("combined", None, "job1", "n", "stdout", "replay")
    hits, groups = tracker.tails.find(stream, first, len(first), ())
    for key, mine in groups.items():
        starts = [hit[0] for hit in mine]
        assert starts == sorted(starts), key
    assert len(hits) < len(tracker.lines.find(first, len(first)))       # not every line was read
    report = first.rfind(b"\n", 0, first.index(b"MnRtt")) + 1
    assert report in [hit[0] for hit in groups[0]]
