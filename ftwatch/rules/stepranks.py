"""The step tap's per-rank state and how step lines go into it (``ftwatch.rules.stragglers``).

Per job (:class:`Job`) and rank (:class:`Rank`) the tap keeps the last ``window`` step times
(``samples``), the last ``min_steps`` of them (``recent``: the slowdown's window), the first
``min_steps`` (``baseline``), the count taken (``seen``) and the rank's last step line (its step
number, and its time once read), which a step line of a pattern that prints no duration needs:
its step time is the time since that line divided by the steps between them.

Lines the clock dates alike make one step time, not one per line: ``ftwatch run`` dates every
line of a busy stream's hand-over alike (its reader lingers ``LINGER``, 80 ms, between them:
``sources.process``), ``watch`` every line of a pod in a batch (``sources.batches``), and a stamp
of whole seconds every step of that second. Read line by line, a rank printing a step every 50 ms
took step times of 0 s and of the whole gap since the last hand-over by turns, its median set by
where the hand-overs fell, so a fast rank could be called a straggler beside its peer (3 ranks of
local SGD, one slow: a fast one flagged too in 10 to 17 of 60 simulated runs, and in ``make
test`` under load). So a line dated as the line before, which took the last step time, widens
that step time instead (``Rank.ref``): the time since the line it was measured from, divided by
the steps since. A group's step time runs from the last line of the group before to its own last.

A chunk's step lines go to their ranks (:func:`by_rank`: one prefix match a line,
``PREFIX_CHAIN``); taking a step line is O(1) and makes no verdict (``StepTracker`` judges once
per chunk). A line's match arrives as its groups (``m.groups()``, a tuple the garbage collector
leaves alone: ``steplines.StepHit``):

* :func:`take`: one line's match (on ``str`` from ``observe``);
* :func:`take_lines`: one rank's step lines of a chunk, all matched on the chunk's bytes, in one
  tight loop (no call per line); where they are all of one pattern that states a duration and
  no bar length (Megatron), at once: the step times converted in C (``map``, no Python step per
  line) and appended with one ``extend`` (:func:`take_all`).

All three leave exactly the state that taking the lines one by one leaves: the same samples in
the same order; only ``ordered`` (``samples`` sorted) may be left to sort again (None).
A line's time is read (``time_at(start)``) only where its pattern states no duration, and only
when the rank's previous step line has a lower step number.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from ftwatch.parsers import fields
from ftwatch.rules.stepstats import replace_sorted, sorted_median

#: Which groups of a step pattern hold what: (step group, total group, ((duration kind, group), ...)
#: in ``step_seconds``'s order); 0: no such group.
Reader = tuple[int, int, tuple[tuple[str, int], ...]]

#: ``Job.set_medians``: from this many ranks at once (and half the job's), the sorted lists are made again.
BULK_RANKS = 256

#: :func:`take_lines`: a run of one pattern's lines goes to :func:`take_all` from this many lines;
#: a shorter one (``watch`` with 1,000 pods: a rank's 1 to 3 step lines a batch) costs less
#: through :func:`_take_each`'s loop than through ``take_all``'s dozen column passes. The same
#: state either way.
TAKE_ALL_LINES = 8

#: A chunk's step line: (line start, pattern index, the match's groups, group ``g`` at ``g - 1``
#: (``steplines.StepHit``); None: read the line again).
Hit = tuple[int, int, "tuple[bytes | str | None, ...] | None"]


_START, _PATTERN, _GROUPS = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)

#: ``fields.RANK_PREFIXES_BYTES`` in one repeat: the same match (1 to 4 stacked prefixes, the
#: innermost's rank: the group that closed last, ``m.group(m.lastindex)``) without trying the
#: chain twice (``P{0,3}Q`` takes three prefixes, fails its last one and backs up: a third of
#: the step tap's per-line cost). Each prefix reads one way only (its name holds no digit), so
#: greedy and lazy, one repeat or two, match the same text.
PREFIX_CHAIN = re.compile(rb"(?:%s|(\d{1,6}): |%s){1,4}"
                          % ((fields.RANK_BRACKET % r"(\d{1,7})").encode(), fields.MPI_CTIME.encode()))


def reader(rx: re.Pattern) -> Reader:
    """Where a step pattern's match holds the step, the bar length and the duration."""
    groups = rx.groupindex
    return (groups.get("step", 0), groups.get("total", 0),
            tuple((kind, groups[kind]) for kind in ("ms", "s", "sit", "its") if kind in groups))


@dataclass(slots=True)
class Rank:
    """One rank's step times (module docstring)."""

    samples: deque
    recent: deque                           # the last ``min_steps`` samples
    baseline: list[float] = field(default_factory=list)
    base_median: float | None = None        # of ``baseline``, once it is full
    seen: int = 0                           # step times taken
    #: (step number, time, line start): the time None where not read yet (the line start in this
    #: chunk gives it), or a reader called with the line start (``LineClock.later``); start -1: none
    last: tuple[int, float | Callable[[int], float] | None, int] | None = None
    #: the last step time's measure, where a time difference gave it: (the step number and time it
    #: was measured from, the ``last`` it was measured at, ``seen`` then); a line dated as that
    #: ``last`` (the same object still) widens that step time instead of taking one of 0 s
    ref: tuple[int, float, tuple, int] | None = None
    total: str | None = None                # the length of the rank's (first) progress bar
    median: float | None = None
    reported: bool = False
    node: str = ""
    index: int = 0                          # the pattern of its last step time
    ordered: list[float] | None = field(default_factory=list)   # ``samples`` sorted; None: to sort again


@dataclass
class Job:
    """One job's ranks, and the sorted lists of their medians (per job and per node) that the
    verdicts read in O(1) (``ftwatch.rules.stepstats``)."""

    ranks: dict[str, Rank] = field(default_factory=dict)
    touched: float = 0.0
    slowdown_reported: bool = False
    detector: list[tuple[int, float]] = field(default_factory=list)   # (slowest rank, max/min) run
    detector_reported: set[int] = field(default_factory=set)
    nodes_reported: set[str] = field(default_factory=set)
    medians: list[float] = field(default_factory=list)                # every rank's median, sorted
    node_ranks: dict[str, list[float]] = field(default_factory=dict)  # node -> its ranks' medians, sorted
    node_median: dict[str, float] = field(default_factory=dict)       # node -> median of node_ranks
    node_medians: list[float] = field(default_factory=list)           # node_median's values, sorted

    def set_medians(self, ranks: list[Rank], medians: list[float]) -> None:
        """:meth:`set_median` of each of ``ranks`` (none twice, all in ``self.ranks``) to the
        same place in ``medians``. Where most of the job's ranks changed (one step line per rank
        per chunk: thousands of ranks), the sorted lists are made again, one sort each, not an
        insert into a list of every rank per rank (O(ranks) each): the same lists either way."""
        if len(ranks) < BULK_RANKS or 2 * len(ranks) < len(self.medians):
            for rank, median in zip(ranks, medians):
                self.set_median(rank, median)
            return
        for rank, median in zip(ranks, medians):
            rank.median = median
        known = [rank for rank in self.ranks.values() if rank.median is not None]
        self.medians = sorted([rank.median for rank in known])
        by_node: dict[str, list[float]] = {}
        for rank in known:
            if rank.node:
                mine = by_node.get(rank.node)
                if mine is None:
                    by_node[rank.node] = [rank.median]
                else:
                    mine.append(rank.median)
        for mine in by_node.values():
            mine.sort()
        self.node_ranks = by_node
        self.node_median = {node: sorted_median(mine) for node, mine in by_node.items()}
        self.node_medians = sorted(self.node_median.values())

    def set_median(self, rank: Rank, median: float | None) -> None:
        """A rank's median changed (None: the rank is forgotten, ``limits``): keep the sorted lists
        of ranks' and nodes' medians (a node without ranks left leaves them)."""
        old = rank.median
        if old == median:                       # the same lists (a step time that left the median as it was)
            return
        rank.median = median
        medians = self.medians                  # ``replace_sorted``, inlined: once per rank and chunk
        if old is not None:
            del medians[bisect.bisect_left(medians, old)]
        if median is not None:
            bisect.insort(medians, median)
        node = rank.node
        if not node:
            return
        mine = self.node_ranks.get(node)
        if mine is None:
            mine = self.node_ranks[node] = []
        replace_sorted(mine, old, median)
        node_old, node_new = self.node_median.pop(node, None), sorted_median(mine) if mine else None
        if node_new is None:
            del self.node_ranks[node]
        else:
            self.node_median[node] = node_new
        if node_old != node_new:
            replace_sorted(self.node_medians, node_old, node_new)


def by_rank(data: bytes, hits: list[Hit], stream_at: Callable[[int], Any] | None = None) -> dict[Any, list[Hit]]:
    """A chunk's step lines by the rank of their prefix (None: none), each rank's in line order;
    of hits with the same start (sorted), the last counts (a line's last match). With
    ``stream_at`` (a line's offset -> its stream: ``watch`` feeds one buffer of many streams;
    its ``each(starts)``, where it has one, gives the streams of many offsets in C) the key is
    ``(stream, rank)``, so two streams' rank 0 stay apart. Keys in order of first line.

    Per line only the prefix's match and an append: the lines are grouped by the prefix's digits
    as they are (bytes), and by their stream object's ``id`` (an Origin's own hash runs Python
    code), made keys once per group; a line with several hits is found in C."""
    starts = list(map(_START, hits))
    if len(set(starts)) != len(starts):              # a line with several hits: its last counts
        keep = list(map(operator.ne, starts, starts[1:] + [-1]))
        hits, starts = list(itertools.compress(hits, keep)), list(itertools.compress(starts, keep))
    groups: dict[Any, list[Hit]] = {}
    match = PREFIX_CHAIN.match
    streams: dict[int, Any] = {}                     # id -> the stream, for the keys
    if stream_at is None:
        ids: Iterable[int | None] = itertools.repeat(None)
    else:
        each = getattr(stream_at, "each", None)
        of_hits = each(starts) if each is not None else list(map(stream_at, starts))
        ids = list(map(id, of_hits))
        streams = dict(zip(ids, of_hits))
    for hit, start, sid in zip(hits, starts, ids):
        m = match(data, start)
        digits = None if m is None else m[m.lastindex]
        key = digits if sid is None else (sid, digits)
        mine = groups.get(key)
        if mine is None:
            groups[key] = [hit]
        else:
            mine.append(hit)
    if stream_at is None:                             # digits -> rank, in one comprehension ...
        out: dict[Any, list[Hit]] = {None if key is None else int(key): mine for key, mine in groups.items()}
        if len(out) == len(groups):                   # ... where no rank is spelt two ways
            return out
    out = {}
    for key, mine in groups.items():                  # digits -> rank ("03" and "3" are one rank)
        if stream_at is None:
            key = None if key is None else int(key)
        else:
            key = (streams[key[0]], None if key[1] is None else int(key[1]))
        before = out.get(key)
        out[key] = mine if before is None else sorted(before + mine, key=_START)
    return out


def take(rank: Rank, min_steps: int, index: int, match: re.Match, read: Reader, start: int,
         time_at: Callable[[int], float]) -> bool:
    """A step line's match of pattern ``index`` (on ``str`` or bytes) into ``rank``'s windows:
    O(1), no verdict. The line's time is read (``time_at(start)``) only when its pattern states no
    duration. Returns whether a step time was taken."""
    return _take_each(rank, min_steps, [(start, index, match.groups())], {index: read}, time_at) >= 0


def take_all(rank: Rank, min_steps: int, hits: list[Hit], read: Reader) -> bool:
    """Step lines of one rank, all of one pattern matched on bytes, at once where that pattern
    states a duration and no bar length: the same state as :func:`take` line by line. False
    (nothing taken) where that does not hold."""
    step_group, total_group, durations = read
    if total_group or len(durations) != 1 or hits[0][2] is None:
        return False
    kind, group = durations[0]
    try:                                               # in C: no Python step per line
        numbers = list(map(float, map(operator.itemgetter(group - 1), map(_GROUPS, hits))))
    except ValueError:
        return False
    if kind == "ms":
        seconds = list(map(operator.truediv, numbers, itertools.repeat(1000.0)))
    elif kind == "its":
        if min(numbers) <= 0:
            return False
        seconds = list(map(operator.truediv, itertools.repeat(1.0), numbers))
    else:
        seconds = numbers
    rank.samples.extend(seconds)
    rank.ordered = None                                # sorted once, at the verdict
    rank.recent.extend(seconds)
    rank.seen += len(seconds)
    rank.index = hits[0][1]
    if step_group:
        rank.last = (int(hits[-1][2][step_group - 1]), None, hits[-1][0])
    need = min_steps - len(rank.baseline)
    if need > 0:
        rank.baseline.extend(seconds[:need])
        if len(rank.baseline) == min_steps:
            rank.base_median = statistics.median(rank.baseline)
    return True


def take_lines(rank: Rank, min_steps: int, hits: list[Hit], readers: list[Reader],
               time_at: Callable[[int], float]) -> int:
    """One rank's step lines of a chunk, in line order, every match on the chunk's bytes (none
    None): each run of consecutive lines of one pattern by :func:`take_all` where it can, else
    :func:`take` of each line, inlined (:func:`_take_each`). Returns the start of the last line
    that took a step time, or -1."""
    if len(hits) < TAKE_ALL_LINES:                       # watch: a stream's few step lines of a batch
        return _take_each(rank, min_steps, hits, readers, time_at)
    if hits[0][1] == hits[-1][1] and len(set(map(_PATTERN, hits))) == 1:
        runs: Iterable[list[Hit]] = (hits,)               # one pattern (the usual case): one run
    else:
        runs = (list(run) for _, run in itertools.groupby(hits, key=_PATTERN))
    took = -1
    for run in runs:
        if len(run) >= TAKE_ALL_LINES and take_all(rank, min_steps, run, readers[run[0][1]]):
            took = run[-1][0]
        else:
            took = max(took, _take_each(rank, min_steps, run, readers, time_at))
    return took


def _take_each(rank: Rank, min_steps: int, hits: list[Hit], readers: Sequence[Reader] | dict[int, Reader],
               time_at: Callable[[int], float]) -> int:
    """Each of ``hits`` (groups of matches on ``str`` or bytes) into ``rank``'s windows, in one loop (no call
    per line): a bar of another length (HF's evaluation bar) is no training step; the step time is
    the one the line states, else the time since the rank's last step line over the steps between.
    Returns the start of the last line that took a step time, or -1."""
    took = -1
    samples, recent, baseline = rank.samples, rank.recent, rank.baseline
    ordered, full = rank.ordered, samples.maxlen
    insort, bisect_left = bisect.insort, bisect.bisect_left
    for start, index, match in hits:
        step_group, total_group, durations = readers[index]
        if total_group:
            total = match[total_group - 1]
            if total is not None:
                if isinstance(total, bytes):
                    total = total.decode()
                if rank.total is None:
                    rank.total = total
                elif total != rank.total:      # another bar (HF's evaluation bar): not a training step
                    continue
        seconds = None
        for kind, group in durations:
            value = match[group - 1]
            if value:
                try:
                    number = float(value)
                except ValueError:
                    break
                seconds = number / 1000.0 if kind == "ms" else number if kind != "its" else \
                    1.0 / number if number > 0 else None
                break
        if step_group:
            step = match[step_group - 1]
            if step is not None:
                step_no = int(step)
                prev = rank.last
                if seconds is None and prev is not None and step_no > prev[0]:
                    before = prev[1]
                    if before is None:
                        before = time_at(prev[2])
                    elif callable(before):            # read now (``LineClock.later``)
                        before = before(prev[2])
                    time = time_at(start)
                    rank.last = last = (step_no, time, start)
                    ref = rank.ref
                    if time > before:
                        seconds = (time - before) / (step_no - prev[0])
                        rank.ref = (prev[0], before, last, rank.seen + 1)
                    elif time == before and ref is not None and ref[2] is prev and ref[3] == rank.seen:
                        # dated as the line before, which took the last step time: one step time
                        # for both, from the line that one was measured from (module doc)
                        seconds = (time - ref[1]) / (step_no - ref[0])
                        rank.ref = (ref[0], ref[1], last, ref[3])
                        old = samples[-1]
                        samples[-1] = recent[-1] = seconds
                        if ordered is not None:
                            del ordered[bisect_left(ordered, old)]
                            insort(ordered, seconds)
                        if rank.seen <= min_steps:
                            baseline[-1] = seconds
                            if len(baseline) == min_steps:
                                rank.base_median = statistics.median(baseline)
                        rank.index = index
                        took = start
                        continue
                else:
                    rank.last = (step_no, None, start)
        if seconds is None:
            continue
        if ordered is not None:
            if len(samples) == full:
                del ordered[bisect_left(ordered, samples[0])]
            insort(ordered, seconds)
        samples.append(seconds)
        recent.append(seconds)
        rank.seen += 1
        rank.index = index
        if len(baseline) < min_steps:
            baseline.append(seconds)
            if len(baseline) == min_steps:
                rank.base_median = statistics.median(baseline)
        took = start
    return took
