"""A batch of many streams' chunks through one engine (``watch``: the chunks of every origin of a
batch, carried beside their bytes): one matcher scan and one step-line pass for them all
(:func:`scan_many`, each chunk's hits a :class:`ScanHits`), and the chunks that only the step tap
hit handed to it in one call (:func:`feed_steps`, their lines dated by :class:`BatchClock`).
``Engine.scan_many`` and ``Engine.feed_steps`` call these; ``Engine.feed`` takes a chunk's
``ScanHits`` as its ``hits``. Split from ``ftwatch.rules.engine`` (this module's one job: the
batch), which keeps one stream's feed and its carried blocks.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from typing import TYPE_CHECKING, Callable, Sequence

from ftwatch.events import Finding, Origin
from ftwatch.parsers import chunks, fields
from ftwatch.rules.judge import line_at
from ftwatch.rules.lineclock import own_time

if TYPE_CHECKING:
    from ftwatch.rules.engine import Engine


class ScanHits(list):
    """One chunk's rule hits from ``Engine.scan_many`` (``(line_start, pattern_id)`` pairs), and
    in ``steps`` its step lines found in the same batch pass (None: the tap finds them itself).

    Attributes:
        whole: the batch's chunks joined, as ``scan_many`` scanned them.
        base: where this chunk starts in ``whole``.
        found: its step lines with offsets into ``whole`` (a slice of the batch's; None: no tap),
            what ``Engine.feed_steps`` hands the tap as they are; ``steps`` makes them the chunk's.
    """

    whole: bytes = b""
    base: int = 0
    found: list | None = None

    @property
    def steps(self) -> list | None:
        """The chunk's step lines, offsets its own (``feed``'s)."""
        found, base = self.found, self.base
        if not found or not base:
            return found
        return [(start - base, pid, match) for start, pid, match in found]


class StreamAt:
    """The stream of a line of a batch's joined buffer, by the line's offset (``feed_steps``: the
    step tap's ``origin`` for a chunk of many streams).

    Args:
        bases: where each stream's chunk starts in the buffer (sorted).
        origins: the stream of each chunk.
    """

    def __init__(self, bases: list[int], origins: list[Origin]):
        self.bases, self.origins = bases, origins

    def __call__(self, start: int) -> Origin:
        return self.origins[bisect.bisect_right(self.bases, start) - 1]

    def each(self, starts: Sequence[int]) -> list[Origin]:
        """The streams of the lines at ``starts``, in C (no Python call per line)."""
        return list(map(self.origins.__getitem__,
                        map(operator.sub, map(bisect.bisect_right, itertools.repeat(self.bases), starts),
                            itertools.repeat(1))))


class BatchClock:
    """``LineClock`` for a chunk made of many streams' chunks (``Engine.feed_steps``; live, no
    block carried): a line's own timestamp, else the time of the chunk it came in.

    Args:
        data: the chunks joined.
        bounds: where each chunk starts in ``data`` (sorted).
        times: each chunk's time (epoch s); its year dates stamps that carry none.
        year: the engine's fixed year, or 0 (then each chunk's time's).
    """

    def __init__(self, data: bytes, bounds: list[int], times: list[float], year: int):
        if not year and times and all(map(math.isfinite, times)):
            try:                                     # every chunk's time in one (UTC) year: read it once,
                low, high = fields.year_of(min(times)), fields.year_of(max(times))   # not once per chunk
            except (OverflowError, OSError, ValueError):
                low = high = 0
            year = low if low == high else 0
        self.data, self.bounds, self.times, self.year = data, bounds, times, year
        self.years: dict[int, int] = {}              # chunk index -> its time's year, once asked

    def _at(self, start: int) -> tuple[str, int, float]:
        k = bisect.bisect_right(self.bounds, start) - 1
        time, year = self.times[k], self.year or self.years.get(k)
        if not year:
            year = self.years[k] = fields.year_of(time)
        return line_at(self.data, start), year, time

    def __call__(self, start: int) -> float:
        return own_time(*self._at(start))

    keeps_chunk = False   # ``later`` holds the line only (``LineClock.keeps_chunk``)

    def later(self, start: int) -> Callable[[int], float]:
        """A reader of the time of the line at ``start``, read only if called (``LineClock.later``,
        live: it holds the line, and its argument is not needed)."""
        line, year, time = self._at(start)
        return lambda _start: own_time(line, year, time)


def scan_many(engine: Engine, parts: Sequence[bytes]) -> list[list[tuple[int, int]] | None]:
    """One matcher scan for many chunks (``watch``: the chunks of every origin of a batch,
    so 1,000 origins cost one scan, not 1,000): per chunk its hits, offsets into the chunk,
    as ``Matcher.scan`` would give them, for ``feed``'s ``hits``.

    Args:
        parts: chunks of complete lines, each ending with ``b"\\n"``.

    Returns:
        Per chunk its sorted ``(line_start, pattern_id)`` pairs, or None for a chunk that
        ``feed`` must scan itself (empty, not newline-terminated, or holding ANSI escapes,
        which ``feed`` removes first). With a step tap, each list (a ``ScanHits``) also
        carries the chunk's step lines, found in one pass over the batch as well, so a
        chunk of 1,000 origins' without a step line costs the tap nothing.
    """
    out: list[list[tuple[int, int]] | None] = [None] * len(parts)
    joined: list[bytes] = []
    bounds: list[int] = []                      # where each joined chunk starts
    index: list[int] = []                       # its position in ``parts``
    pos = 0
    for k, data in enumerate(parts):
        if not data or not data.endswith(b"\n") or b"\x1b" in data:
            continue
        joined.append(data)
        bounds.append(pos)
        index.append(k)
        out[k] = ScanHits()
        pos += len(data)
    if not joined:
        return out
    whole = joined[0] if len(joined) == 1 else b"".join(joined)
    hits = engine.matcher.scan(whole)
    for k, base in zip(index, bounds):
        out[k].whole, out[k].base = whole, base
    if engine.steps is not None:
        found = engine.steps.find(whole)
        starts = [hit[0] for hit in found]
        cut = bisect.bisect_left
        for k, base, end in zip(index, bounds, bounds[1:] + [pos]):   # each chunk's slice
            out[k].found = found[cut(starts, base):cut(starts, end)]
    j, last = 0, len(bounds) - 1
    upper = bounds[1] if last else pos
    base, mine = 0, out[index[0]]
    for start, pid in hits:                     # sorted by offset: walk the chunks once
        if start >= upper:
            while start >= upper:
                j += 1
                upper = bounds[j + 1] if j < last else pos
            base, mine = bounds[j], out[index[j]]
        mine.append((start - base, pid))
    return out


def step_part(hits: ScanHits, end: int, skip: set[int]) -> ScanHits:
    """The step lines of a chunk that ``Engine.feed`` judged (its ``defer``): those before ``end``
    (chunk offsets; the rest is carried) that no block took (``skip``: chunk offsets), as a
    ``ScanHits`` for :func:`feed_steps` (offsets into ``whole``, as ``found`` holds them)."""
    part = ScanHits()
    part.whole, part.base = hits.whole, hits.base
    base, stop = hits.base, hits.base + end
    part.found = [hit for hit in hits.found if hit[0] < stop and hit[0] - base not in skip]
    return part


def feed_steps(engine: Engine, parts: Sequence[tuple[Origin, bytes, float, ScanHits]]) -> list[Finding]:
    """The step lines of many origins' chunks in one step-tap call (``watch``: a batch's
    chunks that :meth:`steps_only` passed, and the step lines that ``Engine.feed`` of the
    chunks a rule hit deferred, :func:`step_part`): the same step times as :meth:`feed` of each
    chunk, its findings (stragglers) after them all, the ranks' verdicts once for the
    batch, not once per chunk. The tap reads the batch's joined buffer as ``scan_many``
    scanned it, at the offsets found there: nothing is copied or joined again.

    Args:
        parts: ``(origin, data, time, hits)`` per chunk, in any order, ``hits`` from one
            :meth:`scan_many` call (or :func:`step_part` of it); ``time`` the chunk's time
            (epoch s, live); ``data`` is counted here (``b""``: counted by ``feed`` already).

    Returns:
        The step tap's findings.
    """
    if not parts:
        return []
    parts = sorted(parts, key=lambda part: part[3].base)   # batch order (already, from a desk)
    whole = parts[0][3].whole
    bases = [hits.base for _, _, _, hits in parts]
    origins = [p[0] for p in parts]
    found = list(itertools.chain.from_iterable(hits.found for _, _, _, hits in parts))
    for _, data, _, _ in parts:
        engine.stats.bytes += len(data)
        engine.stats.lines += chunks.newlines(data)

    findings = engine.steps.take_chunk(StreamAt(bases, origins), whole, len(whole), (),
                                       BatchClock(whole, bases, [p[2] for p in parts], engine.year or 0),
                                       engine.next_seq, found)
    engine.stats.findings += len(findings)          # counted as ``feed`` counts its step findings
    return findings
