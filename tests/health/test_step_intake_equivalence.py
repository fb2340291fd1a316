"""The step tap's chunk intake (issue 16 item 1) against the intake it replaced, on random streams.

The intake now keeps a step line's match groups (a tuple) instead of its ``re.Match``, builds a
pattern's hits in C (no Python step per line), matches rank prefixes with one repeat
(``stepranks.PREFIX_CHAIN``) and converts a run's step times with ``map``. The reference below
is the intake as it was (``re.Match`` kept, ``fields.RANK_PREFIXES_BYTES``, one line at a time):
fed the same chunks, both trackers must make the same findings and leave every rank in the same
state, chunk after chunk (several ranks and prefixes, mixed patterns, lines with and without a
duration, vetoed lines, other bars, clock jumps, a batch of many streams).
"""

from __future__ import annotations

import bisect
import random
import re
import statistics

import pytest

from ftwatch.clock import FakeClock
from ftwatch.config.health import StragglerConfig
from ftwatch.events import Origin
from ftwatch.parsers import fields
from ftwatch.rules import stragglers
from ftwatch.rules.steplines import _NOT_A_STEP_BYTES, StepLines, _plain_ok
from ftwatch.rules.stepranks import PREFIX_CHAIN
from ftwatch.rules.stragglers import StepTracker

# -- the reference: the intake before issue 16's bulk intake -----------------------------------


def ref_find(lines, data: bytes, end: int, skip=()):
    """``StepLines.find`` as it was: every hit with its ``re.Match`` (groups compared later)."""
    found = []
    rfind = data.rfind
    for index, rx in enumerate(lines.regexes):
        veto, exact = lines._vetoes[index], lines.exact[index]
        hits = [(rfind(b"\n", 0, m.start()) + 1, index, m) for m in rx.finditer(data, 0, end)]
        if veto is _plain_ok:
            hits = [h for h in hits if _NOT_A_STEP_BYTES.search(data, h[0], h[2].start()) is None
                    or veto(data, h[0], h[2])]
        elif veto is not None:
            hits = [h for h in hits if veto(data, h[0], h[2])]
        hits = [(s, i, m if exact else None) for s, i, m in hits if s not in skip]
        if hits:
            found.append(hits)
    merged = []
    for hits in reversed(found):
        merged += hits
    merged.sort(key=lambda h: h[0])
    return merged


def ref_by_rank(data: bytes, hits, stream_at=None):
    """``stepranks.by_rank`` as it was: one line at a time, ``fields.RANK_PREFIXES_BYTES``."""
    out: dict = {}
    for hit, nxt in zip(hits, hits[1:] + [(-1, 0, None)]):
        if nxt[0] == hit[0]:
            continue
        m = fields.RANK_PREFIXES_BYTES.match(data, hit[0])
        rank = None if m is None else int(m.group(1) or m.group(2))
        out.setdefault(rank if stream_at is None else (stream_at(hit[0]), rank), []).append(hit)
    return out


def ref_take_lines(rank, min_steps, hits, readers, time_at) -> int:
    """``stepranks._take_each`` as it was, line by line on ``re.Match`` objects (no bulk run): a
    frozen copy on purpose (the reference must not follow the code it checks), changed once since
    for what a step time is, not how it is taken: lines dated alike widen one step time
    (``stepranks``' module doc; the stamps here are of whole seconds, so streams have them)."""
    took = -1
    for start, index, match in hits:
        step_group, total_group, durations = readers[index]
        if total_group:
            total = match.group(total_group)
            if total is not None:
                total = total.decode() if isinstance(total, bytes) else total
                if rank.total is None:
                    rank.total = total
                elif total != rank.total:
                    continue
        seconds = None
        for kind, group in durations:
            value = match.group(group)
            if value:
                try:
                    number = float(value)
                except ValueError:
                    break
                seconds = number / 1000.0 if kind == "ms" else number if kind != "its" else \
                    1.0 / number if number > 0 else None
                break
        if step_group:
            step = match.group(step_group)
            if step is not None:
                step_no, prev = int(step), rank.last
                if seconds is None and prev is not None and step_no > prev[0]:
                    before = prev[1] if prev[1] is not None else time_at(prev[2])
                    before = before() if callable(before) else before
                    time = time_at(start)
                    rank.last = (step_no, time, start)
                    if time > before:
                        seconds = (time - before) / (step_no - prev[0])
                        rank.ref = (prev[0], before, rank.last, rank.seen + 1)
                    elif time == before and rank.ref is not None and rank.ref[2] is prev \
                            and rank.ref[3] == rank.seen:     # dated alike: the last step time widened
                        seconds = (time - rank.ref[1]) / (step_no - rank.ref[0])
                        rank.ref = (*rank.ref[:2], rank.last, rank.ref[3])
                        rank.ordered = None
                        rank.samples[-1] = rank.recent[-1] = seconds
                        if rank.seen <= min_steps:
                            rank.baseline[-1] = seconds
                            if len(rank.baseline) == min_steps:
                                rank.base_median = statistics.median(rank.baseline)
                        rank.index = index
                        took = start
                        continue
                else:
                    rank.last = (step_no, None, start)
        if seconds is None:
            continue
        rank.ordered = None
        rank.samples.append(seconds)
        rank.recent.append(seconds)
        rank.seen += 1
        rank.index = index
        if len(rank.baseline) < min_steps:
            rank.baseline.append(seconds)
            if len(rank.baseline) == min_steps:
                rank.base_median = statistics.median(rank.baseline)
        took = start
    return took


def reference_tracker(monkeypatch, config: StragglerConfig) -> StepTracker:
    """A tracker whose intake is the reference (patched into ``stragglers`` for this test). Its
    tails are off (``steptail``): this test compares the intake of every step line, line by line."""
    tracker = StepTracker(config, clock=FakeClock(1000.0), tails=False)
    tracker.lines.find = lambda data, end, skip=(): ref_find(tracker.lines, data, end, skip)
    return tracker


# -- random step streams -------------------------------------------------------------------

PREFIXES = ["[rank{r}]: ", "[rank0{r}]: ", "[rank{r}]:", "{r}: ", "[default0]:[rank{r}]: ", "[rank{r}]: 7: ", "", "[x_-y{r}]: "]


def _line(rng: random.Random, step: int, clock: list[float]) -> str:
    clock[0] += rng.choice([0.5, 1.0, 1.0, 2.0, 9.0]) if rng.random() > 0.05 else -rng.uniform(5, 60)  # jumps back
    s = int(clock[0]) % 86400
    stamp = f"[2026-11-21 {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}] " if rng.random() < 0.8 else ""
    ms = rng.choice([1000.0, 1200.5, 1500.0, 3000.0, 9000.0, 0.0])
    rate = rng.choice(["4.50", "1.20", "0.00", "0.30"])
    total = rng.choice([100, 100, 100, 11])
    return rng.choice([
        f"{stamp}iteration {step:>8}/ 1000 | consumed samples: 1 | elapsed time per iteration (ms): {ms} | loss 2.0 |",
        f"{stamp}iteration {step:>8}/ 1000 | elapsed time per iteration (ms): {ms} | x | elapsed time per "
        f"iteration (ms): {ms * 2} |",
        f"{stamp}[Rank 0] step={step}, skipped=0, lr=[0.0001]",
        f" {step % 100}%|####5     | {step}/{total} [00:10<00:12,  {rate}it/s]",
        f"\r  3%|#         | {step}/{total} [00:04<02:26,  {rate}s/it]\r  4%|#         | {step + 1}/{total} "
        f"[00:05<02:26,  {rate}s/it]",
        f"Validation DataLoader 0:  45%|####5     | {step}/11 [00:01<00:01,  4.50it/s]",
        f"Epoch 0/9  ━━━━━━━ {step}/{total} 0:00:10 • 0:00:12 {rate}it/s v_num: 0",
        f"{stamp}step {step}/30 loss 0.43", f"{stamp}global_step={step} loss=0.43", f"Saving checkpoint at step {step}",
        f"{stamp}| MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: {rng.choice(['3468.20', '9000.00'])}ms/{rng.randrange(4)} |",
        "nothing here", f"{stamp}a line with no step in it", "stepped into the loop",
    ])


def stream(seed: int, lines: int = 600) -> bytes:
    rng = random.Random(seed)
    ranks = rng.randint(1, 6)
    steps = {r: 0 for r in range(ranks)}
    clocks = {r: [rng.uniform(0, 80000)] for r in range(ranks)}
    prefix = {r: rng.choice(PREFIXES) for r in range(ranks)}
    out = []
    for _ in range(lines):
        r = rng.randrange(ranks)
        steps[r] += rng.choice([1, 1, 1, 2, 0, -3])
        out.append(prefix[r if rng.random() > 0.05 else 0].format(r=r) + _line(rng, max(1, steps[r]), clocks[r]))
    return ("\n".join(out) + "\n").encode()


def chunks(data: bytes, rng: random.Random) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        cut = data.find(b"\n", min(len(data) - 1, pos + rng.randint(1, 4000))) + 1
        out.append(data[pos:cut])
        pos = cut
    return out


def time_at_of(data: bytes, base: float):
    """A line's time: its stamp, else the chunk's time plus a microsecond per byte before it."""
    def time_at(start: int) -> float:
        line = data[start:data.find(b"\n", start)].decode()
        stamp = fields.parse_timestamp(fields.split_rank_prefix(line)[1], 2026)
        return stamp if stamp is not None else base + start * 1e-6
    return time_at


def state(tracker: StepTracker) -> list:
    return [(j, i, list(r.samples), list(r.recent), r.baseline, r.base_median, r.seen, r.last, r.ref, r.total, r.median,
             r.reported, r.index, sorted(r.samples) if r.ordered is None else r.ordered)
            for j, job in sorted(tracker.jobs.items()) for i, r in job.ranks.items()] + [
        (j, job.medians, job.node_medians, sorted(job.nodes_reported), job.detector, sorted(job.detector_reported),
         job.slowdown_reported) for j, job in sorted(tracker.jobs.items())]


def finding(f) -> tuple:
    return (f.rule_id, f.kind, f.origin, f.line, f.time, f.seq, f.evidence, f.fields)


@pytest.mark.parametrize("seed", range(12))
def test_the_bulk_intake_leaves_what_the_line_by_line_intake_left(monkeypatch, seed):
    rng = random.Random(seed)
    config = StragglerConfig(min_steps=rng.choice([3, 5]), window=rng.choice([5, 50]), factor=1.5)
    # every step line of each chunk, as the reference takes them (the tails read a chunk's tail only)
    new = StepTracker(config, clock=FakeClock(1000.0), tails=False)
    ref = reference_tracker(monkeypatch, config)
    data = stream(seed)
    origins = [Origin(f"w{k}", None, f"job{k % 2}", f"node-{k}", "stdout", "file") for k in range(3)]
    new_seq, ref_seq = iter(range(10**6)), iter(range(10**6))
    for n, chunk in enumerate(chunks(data, rng)):
        skip = {s for s in (0, chunk.find(b"\n") + 1) if rng.random() < 0.2}
        if n % 3 == 2:                              # a batch of many streams (watch)
            bases = sorted({0} | {chunk.find(b"\n", rng.randrange(len(chunk))) + 1 for _ in range(2)} - {len(chunk)})
            origin = (lambda start, b=bases: origins[bisect.bisect_right(b, start) - 1])
            skip = set()
        else:
            origin = origins[n % 3]
        time_at = time_at_of(chunk, 1000.0 + n)
        got = new.take_chunk(origin, chunk, len(chunk), skip, time_at, lambda: next(new_seq))
        with monkeypatch.context() as patch:
            patch.setattr(stragglers, "by_rank", ref_by_rank)
            patch.setattr(stragglers, "take_lines", ref_take_lines)
            want = ref.take_chunk(origin, chunk, len(chunk), skip, time_at, lambda: next(ref_seq))
        assert [finding(f) for f in got] == [finding(f) for f in want]
        assert state(new) == state(ref)
    assert any(r.seen for job in new.jobs.values() for r in job.ranks.values())


def _prefix_token(rng: random.Random) -> str:
    return rng.choice([f"[rank{rng.randrange(10**rng.randint(1, 8))}]:", f"[{rng.choice(['a', 'A_', 'x-y', '_'])}"
                       f"{rng.randrange(100)}]:", f"{rng.randrange(10**rng.randint(1, 7))}:", "[2026-11-21", "[12]:",
                       "abc:", "[rank]:", "[ra1nk2]:", "7"]) + rng.choice([" ", "", "  "])


@pytest.mark.parametrize("seed", range(5))
def test_the_prefix_chain_matches_the_stacked_prefixes_regex(seed):
    """``PREFIX_CHAIN`` gives the rank and the end that ``fields.RANK_PREFIXES_BYTES`` gives."""
    rng = random.Random(seed)
    for _ in range(3000):
        text = ("".join(_prefix_token(rng) for _ in range(rng.randint(0, 6))) + rng.choice(["msg", "", "[x]"])).encode()
        want, got = fields.RANK_PREFIXES_BYTES.match(text), PREFIX_CHAIN.match(text)
        assert (want is None) == (got is None), text
        if want is not None:
            assert (int(want.group(1) or want.group(2)), want.end()) == (int(got.group(got.lastindex)), got.end()), text


@pytest.mark.parametrize("lines", [2, 3, 7, 8, 20])
def test_short_and_long_runs_leave_the_state_of_one_line_at_a_time(lines):
    """``take_lines`` sends a run of fewer than ``TAKE_ALL_LINES`` lines through the per-line loop
    (``watch`` with 1,000 pods: a rank's few step lines a batch) and a longer one to ``take_all``:
    either way the rank holds what taking each line alone leaves (``ordered``: sorted samples)."""
    from collections import deque

    from ftwatch.rules import stepranks
    rx = re.compile(rb"iteration\s+(?P<step>\d+)/\s*\d+ \| elapsed time per iteration \(ms\): (?P<ms>[\d.]+)")
    readers = [stepranks.reader(rx)]
    hits = [(100 * i, 0, (str(i + 1).encode(), f"{100 + 7 * (i % 5)}.5".encode())) for i in range(lines)]
    bulk, each = (stepranks.Rank(deque(maxlen=10), deque(maxlen=4)) for _ in range(2))
    assert stepranks.take_lines(bulk, 4, hits, readers, lambda start: 0.0) == hits[-1][0]
    for hit in hits:
        stepranks._take_each(each, 4, [hit], readers, lambda start: 0.0)
    for name in ("samples", "recent", "baseline", "base_median", "seen", "last", "index"):
        assert getattr(bulk, name) == getattr(each, name), name
    assert sorted(bulk.samples) == (bulk.ordered if bulk.ordered is not None else sorted(each.samples))
    assert (bulk.ordered is None) == (lines >= stepranks.TAKE_ALL_LINES)


def test_step_trackers_of_one_process_share_the_compiled_gate_each_with_its_own_scratch():
    """One tracker per replay (each case of an evaluation): the gate is compiled once per set of
    patterns, not per tracker; the scratch, which a scan may not share, is each tracker's own."""
    from ftwatch.rules import steplines
    if steplines._hs is None:
        pytest.skip("hyperscan not installed")
    steplines._gate_db.cache_clear()
    a, b = StepLines(["megatron", "deepspeed"]), StepLines(["megatron", "deepspeed"])
    assert steplines._gate_db.cache_info().misses == 1
    assert a._gate[0] is b._gate[0] and a._gate[1] is not b._gate[1]
    chunk = b"[rank0]: step=10, skipped=0, lr=[1e-4]\n"
    assert a.find(chunk, len(chunk)) == b.find(chunk, len(chunk)) != []
