"""The step tap with one step line per rank per chunk (thousands of ranks interleaved in a replay,
``watch`` with 1,000 pods): no stamp parsed per line, no verdict for a rank that cannot be slow,
the same findings as feeding the lines one chunk at a time (issue 16: decision time linear in ranks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ftwatch.clock import FakeClock
from ftwatch.config.health import StragglerConfig
from ftwatch.events import Origin
from ftwatch.parsers import fields
from ftwatch.rules.engine import Engine
from ftwatch.rules.lineclock import LineClock
from ftwatch.rules.loader import load_rules
from ftwatch.rules import stragglers
from ftwatch.rules.stragglers import StepTracker

MEGATRON = ("[rank{r}]: [2026-11-21 09:{m:02d}:{s:02d}] iteration {n:8d}/     100 | consumed samples: 64 | "
            "elapsed time per iteration (ms): {ms:.1f} | lm loss: 7.1E+00 |\n")
DEEPSPEED = "[rank{r}]: [2026-11-21 09:{m:02d}:{s:02d}] [INFO] [logging.py:96:log_dist] step={n}, skipped=0, lr=[1e-4]\n"


@pytest.fixture(scope="module")
def rules():
    return load_rules([], builtin=True)


def replay_clock(data: bytes) -> LineClock:
    """A replay's clock of one chunk (``sim_step`` set), on an engine of no carried block."""
    engine = SimpleNamespace(_year=2026, _carry_end=0, _carry_time=0.0)
    return LineClock(engine, data, 1000.0, 0.001)   # type: ignore[arg-type]


def unread(rank) -> bool:
    """The rank's last step line's time is still to be read (a reader, not a time)."""
    return callable(rank.last[1]) and rank.last[2] >= 0


def test_a_replayed_line_time_asked_for_later_is_parsed_only_when_read(monkeypatch):
    data = (MEGATRON.format(r=0, m=0, s=5, n=1, ms=1.0) + "[rank1]: no stamp here\n").encode()
    second = data.index(b"[rank1]")
    want = [replay_clock(data)(0), replay_clock(data)(second)]
    calls = []
    real = fields.parse_timestamp
    monkeypatch.setattr(fields, "parse_timestamp", lambda *a: calls.append(a[0]) or real(*a))
    clock = replay_clock(data)
    first, untimed = clock.later(0), clock.later(second)
    assert calls == []
    assert [first(0), untimed(second)] == want


def test_a_rank_missing_from_the_next_chunks_has_its_time_read_after_held_chunks(rules, monkeypatch):
    """A rank's last line's time stays unread while the rank keeps printing, and while it misses
    fewer than ``HELD_CHUNKS`` chunks (more ranks than a chunk has step lines: a rank prints in
    every second or third chunk, its stamp never parsed); once it missed that many it is read, so
    no more than ``HELD_CHUNKS`` chunks are kept for it."""
    tracker = StepTracker(StragglerConfig(min_steps=3), clock=FakeClock(0.0))
    engine = Engine(rules, steps=tracker)
    origin = Origin("combined", None, "job1", "n", "stdout", "replay")
    parsed = []
    real = fields.parse_timestamp
    monkeypatch.setattr(fields, "parse_timestamp", lambda *a: parsed.append(a[0]) or real(*a))
    both = "".join(MEGATRON.format(r=r, m=0, s=1, n=1, ms=1000.0) for r in (0, 1)).encode()
    engine.feed(origin, both, 100.0, sim_step=0.001)
    ranks = tracker.jobs["job1"].ranks
    assert all(unread(ranks[r]) for r in ("rank0", "rank1"))
    assert ranks["rank0"].last[1] is ranks["rank1"].last[1]         # one reader for the chunk's lines
    rank1_first = MEGATRON.format(r=1, m=0, s=1, n=1, ms=1000.0).split("]: ", 1)[1].strip()
    for n in range(2, 2 + stragglers.HELD_CHUNKS):
        assert unread(ranks["rank1"]) and rank1_first not in parsed
        engine.feed(origin, MEGATRON.format(r=0, m=0, s=n, n=n, ms=1000.0).encode(), 100.0, sim_step=0.001)
    assert rank1_first in parsed and unread(ranks["rank0"])
    assert ranks["rank1"].last[1] == 1795251601.0                 # its own stamp, 2026-11-21 09:00:01
    assert len(tracker._held) <= stragglers.HELD_CHUNKS


def test_a_duration_less_line_reads_the_previous_chunks_time(rules):
    """DeepSpeed states no duration: its step time is the time since the rank's last step line,
    read from the previous chunk's clock, the same with one line per rank per chunk as in one chunk."""
    lines = [DEEPSPEED.format(r=r, m=n // 60, s=n % 60, n=10 * n) for n in range(1, 12) for r in range(6)]
    origin = Origin("combined", None, "job1", "n", "stdout", "replay")

    def run(chunks: list[bytes]) -> list[list[float]]:
        tracker = StepTracker(StragglerConfig(min_steps=3), clock=FakeClock(0.0))
        engine = Engine(rules, steps=tracker)
        for chunk in chunks:
            engine.feed(origin, chunk, 100.0, sim_step=0.001)
        return [list(r.samples) for r in tracker.jobs["job1"].ranks.values()]

    whole = run(["".join(lines).encode()])
    per_rank_line = run([line.encode() for line in lines])
    assert whole == per_rank_line and whole[0] == [1.0 / 10] * 10


def test_only_ranks_that_may_be_slow_are_judged(rules, monkeypatch):
    """One step line per rank per chunk: a rank well under ``factor`` x the others' median is not
    judged at all; the slow rank is, and is found."""
    tracker = StepTracker(StragglerConfig(min_steps=3), clock=FakeClock(0.0))
    engine = Engine(rules, steps=tracker)
    judged = []
    real = stragglers.judge                    # the verdict on one rank (rules/stepverdicts.py)
    monkeypatch.setattr(stragglers, "judge",
                        lambda cfg, names, job, who, rank, line: judged.append(who.rank) or
                        real(cfg, names, job, who, rank, line))
    origin = Origin("combined", None, "job1", "n", "stdout", "replay")
    found = []
    for n in range(1, 6):
        for r in range(64):
            line = MEGATRON.format(r=r, m=0, s=n, n=n, ms=3000.0 if r == 7 else 1000.0 + r)
            found += engine.feed(origin, line.encode(), 100.0, sim_step=0.001)
    assert [(f.rank, f.fields["slowdown"]) for f in found] == [(7, 2.99)]
    assert judged.count(0) == 1                 # the first with a median: no other rank yet (a slowdown test)
    assert set(judged) == {0, 7}


def test_medians_made_again_for_most_ranks_equal_the_ones_kept_rank_by_rank(rules, monkeypatch):
    """``Job.set_medians`` with 600 ranks on 2 nodes, each rank's median changed per chunk (one line
    each): the same sorted lists and findings as setting them one by one."""
    from ftwatch.rules import stepranks
    singles = []
    real = stepranks.Job.set_median
    monkeypatch.setattr(stepranks.Job, "set_median", lambda job, rank, m: singles.append(1) or real(job, rank, m))

    def run() -> tuple[list, list, list, dict, dict]:
        tracker = StepTracker(StragglerConfig(min_steps=3), clock=FakeClock(0.0))
        engine = Engine(rules, steps=tracker)
        found = []
        for n in range(1, 8):
            for node in range(2):
                origin = Origin(f"pod-{node}", None, "job1", f"node-{node}", "stdout", "replay")
                chunk = "".join(MEGATRON.format(r=r, m=0, s=n, n=n, ms=(1000.0 + (r * 37 + n * 11) % 90) *
                                                (3.0 if r == 5 or node == 1 and n > 4 else 1.0))
                                for r in range(node * 300, node * 300 + 300)).encode()
                found += engine.feed(origin, chunk, 100.0, sim_step=0.001)
        job = tracker.jobs["job1"]
        return ([(f.origin.instance, f.fields["slowdown"]) for f in found], job.medians, job.node_medians,
                job.node_ranks, job.node_median)

    bulk = run()
    assert len(singles) < 600                     # the lists were made again, not set rank by rank
    monkeypatch.setattr(stepranks, "BULK_RANKS", 10**9)
    one_by_one = run()
    assert bulk == one_by_one
    assert bulk[0] and len(bulk[1]) == 600 and len(bulk[3]) == 2


def test_live_a_rank_missing_from_the_next_chunk_keeps_its_time_unread(rules, monkeypatch):
    """Live (``watch``), a rank's last line's time holds only its line (``keeps_chunk`` false):
    a chunk that does not print the rank leaves it unread (no stamp parsed for a rank whose
    pattern states a duration), and a duration-less line that needs it reads it then, with the
    same step time as reading it at once."""
    origin = Origin("combined", None, "job1", "n", "stdout", "watch")

    def run(lazy: bool) -> list[list[float]]:
        tracker = StepTracker(StragglerConfig(min_steps=3), clock=FakeClock(0.0))
        engine = Engine(rules, steps=tracker)
        if not lazy:
            monkeypatch.setattr(LineClock, "keeps_chunk", property(lambda self: True))
        engine.feed(origin, "".join(DEEPSPEED.format(r=r, m=0, s=1, n=10) for r in (0, 1)).encode(), 100.0)
        engine.feed(origin, DEEPSPEED.format(r=0, m=0, s=2, n=20).encode(), 100.0)
        ranks = tracker.jobs["job1"].ranks
        assert callable(ranks["combined/rank1"].last[1])              # unread either way (a replay's: held)
        engine.feed(origin, DEEPSPEED.format(r=1, m=0, s=4, n=20).encode(), 100.0)
        monkeypatch.undo()
        return [list(r.samples) for r in ranks.values()]

    assert run(lazy=True) == run(lazy=False) == [[0.1], [0.3]]


def test_a_nodes_verdict_is_made_once_per_chunk_with_the_findings_of_judging_every_rank(rules, monkeypatch):
    """64 ranks on 4 nodes (40 on node-2), one step line each per chunk: a rank that cannot be slow gets only its
    node's verdict, and only the first such rank of each node (a second verdict of the node in
    one chunk finds and changes nothing); the findings (a slow node, found, recovered, found
    again; a slow rank) are those of judging every rank as before."""
    from ftwatch.rules.stepranks import sorted_median
    from ftwatch.rules.stepverdicts import judge

    def every_rank(self, job, members, line_of):         # the verdicts as they were: each rank judged
        cfg, ranks = self.config, job.ranks
        members = [p for p in members if len(p[1].samples) >= cfg.min_steps and ranks.get(p[0].instance) is p[1]]
        for rank in [p[1] for p in members]:
            if rank.ordered is None:
                rank.ordered = sorted(rank.samples)
        job.set_medians([p[1] for p in members], [sorted_median(p[1].ordered) for p in members])
        medians, node_median = job.medians, job.node_median
        bound = cfg.factor * sorted_median(medians[:-1]) * (1.0 - 1e-9) if len(medians) >= 2 else float("-inf")
        nodes = len(node_median) >= 2
        found = [judge(cfg, self.names, job, who, rank, line_of(who)) for who, rank in members
                 if rank.reported or rank.median >= bound or nodes and rank.node in node_median]
        return [f for f in found if f is not None]

    FIRST = [0, 8, 16, 56, 64]                              # node k's ranks: FIRST[k] .. FIRST[k + 1] - 1

    def ms(node: int, r: int, n: int) -> float:
        slow_node = node == 2 and (4 <= n <= 9 or n >= 14)       # slow, recovered, slow again
        return (1000.0 + (r * 37 + n * 11) % 90) * (3.0 if slow_node or r == 5 else 1.0)

    def run(old: bool) -> tuple[list, list]:
        tracker = StepTracker(StragglerConfig(min_steps=3, window=4), clock=FakeClock(0.0))
        if old:
            monkeypatch.setattr(StepTracker, "_verdicts", every_rank)
        calls = []                                          # verdicts made, of ranks and of nodes
        real, real_judge = stragglers.node_verdict, stragglers.judge
        monkeypatch.setattr(stragglers, "node_verdict", lambda *a: calls.append(a[4].node) or real(*a))
        monkeypatch.setattr(stragglers, "judge", lambda *a: calls.append(a[4].node) or real_judge(*a))
        engine = Engine(rules, steps=tracker)
        found = []
        for n in range(1, 20):
            for node in range(4):
                origin = Origin(f"pod-{node}", None, "job1", f"node-{node}", "stdout", "forward")
                chunk = "".join(MEGATRON.format(r=r, m=n // 60, s=n % 60, n=n, ms=ms(node, r, n))
                                for r in range(FIRST[node], FIRST[node + 1])).encode()
                found += engine.feed(origin, chunk, 100.0)
        monkeypatch.undo()
        return [(f.kind, f.origin.instance, f.rank, f.time, f.fields) for f in found], calls

    expected, _ = run(old=True)
    got, calls = run(old=False)
    assert got == expected
    assert [f[1] for f in got if f[1].startswith("node")] == ["node node-2", "node node-2"]
    assert any(f[1] == "pod-0/rank5" for f in got)
    assert len(calls) < 19 * 64 // 4                       # not every rank of every chunk (19 x 64)
