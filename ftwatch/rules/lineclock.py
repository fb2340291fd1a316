"""The time of a chunk's line at an offset, for the step tap (``Engine.feed`` hands its chunk's
``LineClock`` to ``StepTap.take_chunk``): the line's own timestamp, else the time ``Engine.feed``
gives an untimed hit line (``Engine._base_time``: live, the chunk's time; in a replay, the last
stamp before it plus ``sim_step`` per line). Split from ``ftwatch.rules.engine``, which keeps the
feed's state this reads (the carried block's end and time, the feed's year, the stamp search).
"""

from __future__ import annotations

import bisect
import functools
import re
from typing import TYPE_CHECKING, Callable

from ftwatch.parsers import chunks, fields
from ftwatch.rules.judge import line_at

if TYPE_CHECKING:
    from ftwatch.rules.engine import Engine

#: A line needs a time of day for ``fields.parse_timestamp`` to find a stamp in it (every format
#: has one), or a non-ASCII byte (a decoded ``\d`` may be a non-ASCII digit), or an escape (its
#: removal may join one): a line with none of them is read as untimed without decoding it.
NON_ASCII = re.compile(rb"[\x80-\xff]")


class LineClock:
    """The time of a chunk's line at an offset, asked in any order (the step tap asks rank by
    rank): its own timestamp, else ``Engine._base_time``'s answer, with the stamp search resumed
    from the nearest line asked before it, so each search covers only the lines between two asks
    (a bisection over the chunk's times of day, found once: ``chunks.Stamps``). A line is decoded
    and parsed for its own stamp only where it holds a time of day (or, in a chunk that is not
    plain ASCII, a byte that decoding could make one of)."""

    def __init__(self, engine: Engine, data: bytes, time: float, sim_step: float):
        self.engine, self.data, self.time, self.sim_step = engine, data, time, sim_step
        self.marks = [0]                                              # offsets asked, sorted
        #: an offset asked -> (its line's number, the last stamp before it (its line's start, time)
        #: and that line's number): each count of lines, like each stamp search, covers only the
        #: lines since the nearest offset asked before it (issue 16: thousands of ranks' untimed
        #: step lines each counted from the chunk's start, 15 of 20 s of a 120,000-line replay)
        self.before: dict[int, tuple[int, tuple[int, float] | None, int]] = {0: (0, None, 0)}
        self.stamps = chunks.Stamps(data, engine._year)                # its times of day, found once
        self._plain: bool | None = None

    @property
    def plain(self) -> bool:
        """The chunk is ASCII without an escape; found at the first line asked that holds no time
        of day (two passes over the chunk, ~0.1 ms a MiB: most chunks are asked nothing, a step
        line that states its own duration needs no time, issue 16)."""
        if self._plain is None:
            self._plain = self.data.isascii() and b"\x1b" not in self.data
        return self._plain

    @property
    def keeps_chunk(self) -> bool:
        """Whether what :meth:`later` returns holds the chunk until called (a replay's ``Later``;
        live it holds the line only): the step tap reads those a few chunks on
        (``stragglers.HELD_CHUNKS``) where no later line of the rank replaced them."""
        return bool(self.sim_step)

    def later(self, start: int) -> Callable[[int], float]:
        """A reader of the time of the line at ``start``, read only when called with that start
        again (a rank's last step line, whose time a later duration-less line may need). In a
        replay (``keeps_chunk``) it reads any line of the chunk (``functools.partial`` of
        :meth:`at` in this chunk's year), so the step tap asks for one per chunk and shares it
        among the ranks: with thousands of ranks a chunk holds one step line per rank, and an
        object made per rank and chunk was a tenth of the step tap's CPU (4,096 ranks, issue 16).
        Its answer is the one a call now gives (``sim_step`` needs the lines before it), and it
        holds the chunk until the step tap reads those still unread a few chunks on
        (``stragglers.HELD_CHUNKS``). Live, the line and the chunk's time are kept, not the chunk
        (the argument is not needed then). Reading each rank's last line's stamp at once cost a
        parse per line that a duration-stating pattern never uses."""
        if self.sim_step:                   # (not kept here: the reader holds the clock, no cycle)
            return functools.partial(self.at, year=self.engine._year)
        engine = self.engine
        line = line_at(self.data, start)
        default = engine._carry_time if start < engine._carry_end else self.time
        year = engine._year
        return lambda _start: own_time(line, year, default)

    def __call__(self, start: int) -> float:
        return self.at(start, self.engine._year)

    def at(self, start: int, year: int) -> float:
        """The time of the line at ``start`` (``__call__``), stamps without a year read in ``year``."""
        engine, data = self.engine, self.data
        stop = data.find(b"\n", start)
        stop = len(data) if stop < 0 else stop
        if self.stamps.has_clock(start, stop) or not self.plain and (
                data.find(b"\x1b", start, stop) >= 0 or NON_ASCII.search(data, start, stop) is not None):
            stamp = fields.parse_timestamp(fields.split_rank_prefix(fields.clean(line_at(data, start)))[1], year)
            if stamp is not None:
                return stamp
        if not self.sim_step:
            return engine._carry_time if start < engine._carry_end else self.time
        marks = self.marks
        i = bisect.bisect_right(marks, start)
        pos = marks[i - 1]
        line, found, found_line = self.before[pos]
        if pos < start:
            newer = self.stamps.last(pos, start)
            if newer is not None:
                found, found_line = newer, line + chunks.newlines(data, pos, newer[0])
                line = found_line + chunks.newlines(data, newer[0], start)
            else:
                line += chunks.newlines(data, pos, start)
            marks.insert(i, start)
            self.before[start] = (line, found, found_line)
        if found is not None:
            return found[1] + (line - found_line) * self.sim_step
        return self.time + line * self.sim_step                          # the line's number


def own_time(line: str, year: int, default: float) -> float:
    """The timestamp of ``line`` (cleaned, rank prefix removed), else ``default`` (epoch s)."""
    stamp = fields.parse_timestamp(fields.split_rank_prefix(fields.clean(line))[1], year)
    return default if stamp is None else stamp
