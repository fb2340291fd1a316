"""One scan for many origins (``Engine.scan_many``, what ``watch`` feeds a batch with): the same
hits and the same findings as scanning each origin's chunk alone."""

from __future__ import annotations

import random

import pytest

from ftwatch.config.health import StragglerConfig
from ftwatch.events import Origin
from ftwatch.parsers import fields
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.rules.stragglers import StepTracker

from engine_samples import GLOO_TB, KEYERROR_TB, NCCL_INFO, STEP, T0, WATCHDOG, XID79

PIECES = [[STEP], [NCCL_INFO], [XID79], [WATCHDOG], KEYERROR_TB, GLOO_TB, ["plain text", "more text"],
          ["\x1b[31mRuntimeError: NCCL error: unhandled system error\x1b[0m"], KEYERROR_TB[:2]]


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def batches(seed: int, origins: int = 40, rounds: int = 6):
    """Rounds of (origin, chunk) parts: random pieces per origin, blocks cut across rounds."""
    rnd = random.Random(seed)
    out = []
    for _ in range(rounds):
        parts = []
        for k in rnd.sample(range(origins), rnd.randint(1, origins)):
            origin = Origin(f"w{k}", k, f"job{k % 3}", f"node-{k // 8}", "stderr", "forward")
            text = [line for piece in rnd.choices(PIECES, k=rnd.randint(1, 4)) for line in piece]
            parts.append((origin, ("\n".join(text) + "\n").encode()))
        out.append(parts)
    return out


def test_scan_many_gives_each_chunk_its_own_scan(rules):
    engine = Engine(rules)
    for parts in batches(1):
        chunks = [data for _, data in parts] + [b"", b"no newline at the end"]
        for data, hits in zip(chunks, engine.scan_many(chunks)):
            if hits is None:
                assert not data.endswith(b"\n") or b"\x1b" in data
            else:
                assert hits == engine.matcher.scan(data)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_feeding_with_batch_hits_makes_the_same_findings(rules, seed):
    alone = Engine(rules, steps=StepTracker(StragglerConfig()))
    together = Engine(rules, steps=StepTracker(StragglerConfig()), like=alone)
    for n, parts in enumerate(batches(seed)):
        t = T0 + n
        expected = [alone.feed(origin, data, t) for origin, data in parts]
        scans = together.scan_many([data for _, data in parts])
        got = [together.feed(origin, data, t, hits=hits) for (origin, data), hits in zip(parts, scans)]
        assert got == expected
    assert together.stats == alone.stats


def test_a_fault_code_candidate_without_a_code_builds_no_record(rules):
    """The fault-code candidate pattern hits "error: deadbeef..." but no code is in it: the cheap
    confirm (``FaultTables.extract``) drops the line before a Record is made; a real code still
    makes its finding."""
    engine = Engine(rules)
    origin = Origin("w0", 0, "job1", "node-a", "stderr", "forward")
    assert engine.matcher.scan(b"error: deadbeefcafe1234\n")
    assert engine.feed(origin, b"error: deadbeefcafe1234\n", T0) == []
    assert engine.stats.records == 0
    (finding,) = engine.feed(origin, b"dsmi fault code 0x80E01801 occurred\n", T0 + 1)
    assert finding.kind == "fault_code" and engine.stats.records == 1


def step_rounds():
    """9 batches of 12 origins: ranks 0-7 print a step line each (rank 5 three times slower), the
    rest plain text; per batch its ``(origin, chunk)`` parts and each rank's chunk time."""
    for n in range(1, 10):
        parts = [(Origin(f"w{r}", r, "job1", "node-a", "stderr", "forward"),
                  f"step {n}/100 loss 0.5\n".encode() if r < 8 else b"plain text\n") for r in range(12)]
        yield parts, {r: T0 + n * (0.3 if r == 5 else 0.1) for r in range(12)}


def test_a_batch_finds_its_step_lines_in_one_pass(rules, monkeypatch):
    """``scan_many`` also finds the batch's step lines, once for all origins: feeding each chunk
    with its hits makes the straggler that chunks fed alone make, and the tap looks for step
    lines once per batch, not once per origin (nothing at all for an origin without one)."""
    alone = Engine(rules, steps=StepTracker(StragglerConfig(min_steps=5)))
    tracker = StepTracker(StragglerConfig(min_steps=5))
    together = Engine(rules, steps=tracker, like=alone)
    passes = []
    real = tracker.lines.find
    monkeypatch.setattr(tracker.lines, "find", lambda *a: passes.append(len(a[0])) or real(*a))
    expected, got = [], []
    for parts, t in step_rounds():
        expected += [f for origin, data in parts for f in alone.feed(origin, data, t[origin.rank])]
        scans = together.scan_many([data for _, data in parts])
        got += [f for (origin, data), hits in zip(parts, scans) for f in together.feed(origin, data, t[origin.rank],
                                                                                         hits=hits)]
    assert [(f.kind, f.rank) for f in got] == [(f.kind, f.rank) for f in expected] == [("straggler", 5)]
    assert len(passes) == 9                                  # one pass per batch of 12 origins


@pytest.mark.parametrize("seed", [1, 2])
def test_line_times_asked_in_any_order_are_those_asked_in_order(rules, seed):
    """The step tap asks a chunk's line times rank by rank, out of line order: each answer is
    the one ``_base_time`` gives in line order (the last stamp before it plus ``sim_step`` per
    line, or the chunk's time plus ``sim_step`` per line before the first stamp)."""
    from ftwatch.rules.lineclock import LineClock
    rnd = random.Random(seed)
    lines = [f"[2026-11-21 09:00:{rnd.randint(0, 59):02d}] stamped" if rnd.random() < 0.2 else f"plain {i}"
             for i in range(200)]
    data = ("\n".join(lines) + "\n").encode()
    starts = [0] + [i + 1 for i, b in enumerate(data[:-1]) if b == 10]
    engine = Engine(rules)
    engine._year = 2026
    in_order = [engine._base_time(data, s, T0, 0.01) for s in starts]
    clock = LineClock(engine, data, T0, 0.01)
    asked = list(range(len(starts)))
    rnd.shuffle(asked)
    got = {i: clock(starts[i]) for i in asked}
    for i, line in enumerate(lines):
        if not line.startswith("["):                      # a stamped line answers its own stamp
            assert got[i] == pytest.approx(in_order[i]), i


def test_step_only_chunks_of_many_origins_in_one_call_take_what_feed_takes(rules):
    """``Engine.feed_steps`` (a batch's chunks that only the step tap hit, many origins at once):
    the same step times per rank as feeding each chunk alone, lines without a duration timed by
    their own chunk's time, the same straggler; chunks with a rule hit or an open block are not
    step-only."""
    alone = Engine(rules, steps=StepTracker(StragglerConfig(min_steps=5)))
    together = Engine(rules, steps=StepTracker(StragglerConfig(min_steps=5)), like=alone)
    expected, got = [], []
    for parts, t in step_rounds():
        expected += [f for origin, data in parts for f in alone.feed(origin, data, t[origin.rank])]
        scans = together.scan_many([data for _, data in parts])
        step_only = [(o, d, t[o.rank], h) for (o, d), h in zip(parts, scans) if together.steps_only(o, h)]
        assert len(step_only) == 8
        for (o, d), h in zip(parts, scans):
            if not together.steps_only(o, h):
                assert together.count_if_quiet(o, d, h)
        got += together.feed_steps(step_only)
    assert [(f.kind, f.rank) for f in got] == [(f.kind, f.rank) for f in expected] == [("straggler", 5)]
    for instance, rank in alone.steps.jobs["job1"].ranks.items():
        assert list(together.steps.jobs["job1"].ranks[instance].samples) == pytest.approx(list(rank.samples))
    assert together.stats.lines == alone.stats.lines and together.stats.bytes == alone.stats.bytes
    assert together.stats.findings == alone.stats.findings == 1          # the straggler, counted either way
    origin = Origin("w0", 0, "job1", "node-a", "stderr", "forward")
    data = b"step 10/100 loss 0.5\nRuntimeError: NCCL error: unhandled system error\n"
    assert not together.steps_only(origin, together.scan_many([data])[0])      # a rule hit: feed it


def test_a_batch_clock_reads_the_year_once_where_every_chunk_is_in_one_and_per_chunk_across_new_year(monkeypatch):
    """``BatchClock`` dates a stamp without a year in its chunk's year: one ``year_of`` pair for a
    batch within one year, each chunk's own across a new year; and ``StreamAt.each`` names the
    streams of many offsets as calling it for each does."""
    from datetime import datetime, timezone

    from ftwatch.parsers import fields
    from ftwatch.rules.batches import BatchClock, StreamAt

    line = b"I0101 00:00:05.000000 140 file.cc:12] step 1\n"
    data = line * 3
    bounds = [0, len(line), 2 * len(line)]
    dec31, jan1 = (datetime(y, m, d, 23, 59, tzinfo=timezone.utc).timestamp()
                   for y, m, d in ((2026, 12, 31), (2027, 1, 1)))
    calls = []
    real = fields.year_of
    monkeypatch.setattr(fields, "year_of", lambda t: calls.append(t) or real(t))
    across = BatchClock(data, bounds, [dec31, jan1, jan1], 0)
    got = [across(b) for b in bounds]
    want = [datetime(y, 1, 1, 0, 0, 5, tzinfo=timezone.utc).timestamp() for y in (2026, 2027, 2027)]
    assert got == want
    calls.clear()
    within = BatchClock(data, bounds, [jan1, jan1 + 1, jan1 + 2], 0)
    assert [within(b) for b in bounds] == [want[1]] * 3 and len(calls) == 2
    origins = [Origin(f"w{k}", k, "job1") for k in range(3)]
    streams = StreamAt(bounds, origins)
    starts = [0, 5, len(line), 2 * len(line) + 1]
    assert streams.each(starts) == [streams(s) for s in starts] == [origins[0], origins[0], origins[1], origins[2]]


@pytest.mark.parametrize("seed", [3, 4])
def test_untimed_hit_line_times_count_the_lines_since_the_last_stamp(rules, seed):
    """``Engine._base_time`` in a replay: an untimed line's time is the last stamp before it plus
    ``sim_step`` per line between them (else the chunk's time plus ``sim_step`` per line before
    it), asked in line order with now and then a line before the last one asked (a block's first
    line), as ``feed`` asks; the lines since the stamp are counted from the last ask, not again
    from the stamp for every hit line (issue 16)."""
    rnd = random.Random(seed)
    lines = [f"[2026-11-21 09:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}] stamped" if rnd.random() < 0.05
             else f"plain {i}" for i in range(400)]
    data = ("\n".join(lines) + "\n").encode()
    starts = [0] + [i + 1 for i, b in enumerate(data[:-1]) if b == 10]
    engine = Engine(rules)
    engine._year = 2026
    engine._stamped, engine._line_pos, engine._line_no = (0, None, 0), 0, 0   # as ``feed`` starts a chunk
    asked = sorted(rnd.sample(range(len(starts)), 150))
    for k in range(10, len(asked), 10):                    # a block's first line, before the last hit
        asked.insert(k, max(0, asked[k - 1] - rnd.randint(1, 5)))
    for i in asked:
        start = starts[i]
        before = [j for j in range(i) if lines[j].startswith("[")]
        if before:
            j = before[-1]
            stamp = fields.parse_timestamp(lines[j], 2026)
            want = stamp + (i - j) * 0.01
        else:
            want = T0 + i * 0.01
        assert engine._base_time(data, start, T0, 0.01) == pytest.approx(want), i
