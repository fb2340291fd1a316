"""A chunk of complete lines read as a whole, not line by line: how many lines it holds
(:func:`newlines`) and where its timestamps are (:func:`last_clock`, :func:`last_timestamp`,
:class:`Stamps`), for the replay's clock and the engine's, the progress reader's and the step
tap's. Each line found is read by ``ftwatch.parsers.fields`` (one line's fields); what is here
keeps that cheap over a MiB: searches in C over the whole chunk, a line parsed only where it holds
a time of day.

Split from ``ftwatch.parsers.fields`` (issue 16), whose job is one line.
"""

from __future__ import annotations

import bisect
import re

from ftwatch.parsers import fields

__all__ = ["newlines", "last_clock", "last_timestamp", "Stamps"]

# Every timestamp format ``fields.parse_timestamp`` reads has its time of day within the first
# _HEAD_BYTES of its line (rank prefixes and a plog head included): a candidate line is parsed from
# its start that far, and a later time of day in it is no stamp.
_HEAD_BYTES = 240
_MAX_TRIES = 16  # lines with a time of day but no timestamp tried before giving up
_REPLACE_FROM = 2048       # ``newlines``: spans of this many bytes and more are counted by a replace


def newlines(data: bytes, start: int = 0, end: int | None = None) -> int:
    """``data.count(b"\\n", start, end)``, faster for a long span.

    ``bytes.count`` of one byte compares byte by byte (CPython 3.11: ~0.33-0.54 ms a MiB, the
    most of a bench replay's line counting: a chunk's lines are counted whole for the metrics and
    the engine, issue 16); ``bytes.replace`` finds the newlines with ``memchr`` and copies what
    is between them, ~4x faster over a MiB (0.13 ms) even with its copy and the span's, and
    faster from a few KiB on (measured: 4 KiB 2.6 against 1.1 us). The copies live only during
    the call. Shorter spans are counted in place.

    Args:
        data: the bytes.
        start, end: the span, as for ``bytes.count`` (offsets within ``data``; ``end`` None: its end).
    """
    size = len(data)
    if end is None or end > size:
        end = size
    if start < 0 or end - start < _REPLACE_FROM:
        return data.count(b"\n", start, end)
    part = data if start == 0 and end == size else data[start:end]
    return len(part) - len(part.replace(b"\n", b""))


def last_timestamp(data: bytes, lo: int, hi: int, year: int | None) -> tuple[int, float] | None:
    """Finds the last line starting in ``data[lo:hi]`` that carries a timestamp.

    The candidates (lines with a time of day near their start) are found from the end by
    :func:`last_clock` (regex searches in C); only they are decoded and parsed
    (``fields.parse_timestamp``), at most 16 of them (a clock that ends a longer count, tqdm's ETA
    ``<104:10:00``, is none and costs no try: more than 16 such bars once hid the stamp before
    them). So a chunk's lines that carry no timestamp cost no Python work.

    Args:
        data: complete lines (``b"\\n"``-separated), ANSI escapes removed or not.
        lo: where the search starts: 0 or the start of a line.
        hi: where it ends (exclusive): the start of the line whose predecessor is wanted, or
            ``len(data)``.
        year: the year for stamps without one (glog, syslog); None: those do not count.

    Returns:
        (the line's start offset, epoch seconds), or None when no line there has a timestamp.
    """
    if _CLOCK_COLON.search(data, lo + 2, hi) is None:
        # no time of day wholly in the span (its first colon, two digits on each side after it):
        # found by one forward search led by the colon, without :func:`last_clock`'s windows
        # (issue 16: most lines between two hits of a traceback hold none, ~8 us a record)
        return None
    end = hi
    tries = 0
    while tries < _MAX_TRIES:
        if end <= lo:
            return None
        clock = last_clock(data, lo, end)
        if clock < 0:
            return None
        if clock > lo and data[clock - 1] in _DIGIT_BYTES:
            end = clock             # the tail of a longer count (tqdm's ETA ``<104:10:00``): no time of
            continue                # day and no try; the line before it may still hold its stamp
        tries += 1
        line = data.rfind(b"\n", lo, clock)
        line = lo if line < 0 else line + 1
        head = line + _HEAD_BYTES
        eol = data.find(b"\n", line, head)      # the line's head: a later time of day is no stamp
        stamp = fields.parse_timestamp(fields.clean(data[line:eol if eol >= 0 else head]), year)
        if stamp is not None:
            return line, stamp
        end = line
    return None


_FEW = 256                 # ``Stamps``: questions answered by regex before the times of day are listed
_CLOCK_COLON = re.compile(rb":(?=\d\d:\d\d)")   # the first colon of a time of day (its digits before it)
_DIGIT_BYTES = frozenset(b"0123456789")
_FIRST_LOOK = 256          # ``last_clock``: bytes before ``hi`` searched first, then 4x as many each time


def last_clock(data: bytes, lo: int, hi: int) -> int:
    """The offset of the last time of day (``\\d\\d:\\d\\d:\\d\\d``, its eight bytes) wholly in
    ``data[lo:hi]``, -1 when none is: what ``re.match(rb"(?s).*(\\d\\d:\\d\\d:\\d\\d)", ...)``'s
    group 1 starts at, found faster.

    That regex backtracks from ``hi`` byte by byte (~10-20 ns a byte in ``re``): a search back over
    lines without a clock (a traceback's frames, untimed step lines) cost ~60 us per 6 KB, ~6 % of a
    bench replay (issue 16). Here windows that end at ``hi`` and grow 4x each time (from
    :data:`_FIRST_LOOK` bytes, each overlapping the one after it by seven, so that no clock across
    their border is missed) are searched forward by :data:`_CLOCK_COLON`, led by its literal colon
    (~1-2 ns a byte), the last hit whose two bytes before are digits taken: about 10x faster far
    from the clock, and no slower near it.

    Args:
        data: the bytes.
        lo: where the span starts (its first clock may start there).
        hi: where it ends (exclusive; a clock must end by it).
    """
    end, width, digits = hi, _FIRST_LOOK, _DIGIT_BYTES
    while True:
        start = max(lo, end - width)
        found = -1
        for m in _CLOCK_COLON.finditer(data, start + 2, end):
            colon = m.start()
            if data[colon - 2] in digits and data[colon - 1] in digits:
                found = colon
        if found >= 0:
            return found - 2
        if start <= lo:
            return -1
        end, width = min(hi, start + 7), width * 4


class Stamps:
    """:func:`last_timestamp` asked many times over one chunk (the step tap's and the progress
    reader's clocks): past its first few questions (regex searches, as :func:`last_timestamp`'s),
    the chunk's times of day are listed once, in one C pass (a search led by a colon, ~20 ms per
    30 MB), and each search is a bisection over them; each line tried is parsed once.
    :meth:`last` answers exactly what :func:`last_timestamp` answers.

    Args:
        data: complete lines, as for :func:`last_timestamp`.
        year: the year for stamps without one.
    """

    def __init__(self, data: bytes, year: int | None):
        self.data, self.year = data, year
        self._clocks: list[int] | None = None
        self._asked = 0                          # the first ``_FEW`` questions are answered by regex
        self._parsed: dict[int, float | None] = {}

    def clocks(self) -> list[int]:
        """The offsets of every time of day (``\\d\\d:\\d\\d:\\d\\d``, overlapping ones too), sorted."""
        if self._clocks is None:
            data, digits = self.data, _DIGIT_BYTES
            self._clocks = [c for c in (m.start() - 2 for m in _CLOCK_COLON.finditer(data))
                            if c >= 0 and data[c] in digits and data[c + 1] in digits]
        return self._clocks

    def _few(self) -> bool:
        """Whether to answer by a regex search (a chunk asked a few times, e.g. once per rank, need
        not have its times of day listed)."""
        self._asked += 1
        return self._clocks is None and self._asked <= _FEW

    def has_clock(self, lo: int, hi: int) -> bool:
        """Whether a time of day lies wholly in ``data[lo:hi]``."""
        if self._few():
            return last_clock(self.data, lo, hi) >= 0
        clocks = self.clocks()
        i = bisect.bisect_left(clocks, lo)
        return i < len(clocks) and clocks[i] + 8 <= hi

    def last(self, lo: int, hi: int) -> tuple[int, float] | None:
        """``last_timestamp(data, lo, hi, year)``."""
        few = self._few()
        data, clocks = self.data, None if few else self.clocks()
        end = hi
        for _ in range(_MAX_TRIES):
            if end <= lo:
                return None
            if few:
                clock = last_clock(data, lo, end)
                if clock < 0:
                    return None
            else:
                i = bisect.bisect_right(clocks, end - 8) - 1    # the last time of day ending by ``end``
                if i < 0 or clocks[i] < lo:
                    return None
                clock = clocks[i]
            line = data.rfind(b"\n", lo, clock)
            line = lo if line < 0 else line + 1
            stamp = self._parsed.get(line, self)
            if stamp is self:
                head = line + _HEAD_BYTES
                eol = data.find(b"\n", line, head)      # the line's head: a later time of day is no stamp
                text = fields.clean(data[line:eol if eol >= 0 else head])
                stamp = self._parsed[line] = fields.parse_timestamp(text, self.year)
            if stamp is not None:
                return line, stamp
            end = line
        return None
