"""Which step lines of a chunk the straggler tap reads: a bounded tail of it, per stream (issue 16).

A straggler verdict reads each rank's last ``window`` step times; it does not need every step
line. So for a stream whose ranks are known, :meth:`Tails.find` reads only the chunk's *tail*:
the step lines of a last stretch of the chunk (found by ``StepLines.find`` on that stretch, in
C as before), grown backwards (doubling) until every rank known on this stream has
``TAIL_PER_RANK`` step lines in it, or the stretch holds ``TAIL_SPAN`` x ``TAIL_PER_RANK`` x
(known ranks) step lines, or it reaches the chunk's start. Of each rank's lines in the stretch its
last ``TAIL_PER_RANK`` are taken (in line order: a duration-less pattern's step time is then the
time since the rank's previous taken line over the steps between, an average over the lines
passed over). Megatron's straggler reports (the one built-in pattern whose lines are not
``exact``) are rare and each one counts (``detector_reports`` in a row): those are looked for in
the whole chunk, always.

A full pass (every step line of the chunk, the intake as it was) is taken for a chunk whose
tail shows a rank not known on the stream (it joins the known ranks), and always where a pattern
is a custom regex (those only propose lines) or the tails are switched off. Every
``FULL_EVERY``-th chunk of a stream is a *refresh*: the known ranks start again from the step
lines of a last stretch of the chunk (a rank that stopped printing leaves them), grown backwards
from ``REFRESH_FIRST`` bytes (doubling) until each rank in it has ``window`` step lines, but for
sparse ones, or it reaches the chunk's start. A stream's first chunk with step lines reads such
a last stretch and, before it, a *head* stretch grown forwards from the chunk's start until each
rank in it has ``min_steps`` step lines (the baseline of ``slowdown``, the first bar's length):
the whole chunk where the two meet. A window keeps the last ``window`` step times and a baseline
the first ``min_steps``, so each rank whose lines fill both stretches is left exactly as a full
pass leaves it; only its count of step times seen grows by less (a duration-less pattern's first
line after the gap takes the average over the lines passed over, as in a tail). Megatron's
straggler reports are looked for in the rest of the chunk, as for a tail.

A rank that printed fewer than one step line for every ``TAIL_SPAN`` of the busiest rank's in the
last full pass, refresh or first chunk is *sparse* (``Stream.sparse``; a stream's unprefixed lines, an occasional trainer's
line): it stays known (its lines start no full pass), but the stretch does not grow to find
``TAIL_PER_RANK`` of its lines; it stops once the other known ranks have theirs (a sparse rank
would otherwise make every tail read up to its ``TAIL_SPAN`` bound, ~4x the stretch, issue 16).
It takes the lines it has in that stretch, and those in a refresh's stretch (one that holds none
leaves the known ranks, and the next tail that shows it is a full pass).

What this means for the statistics: a rank gets at most ``TAIL_PER_RANK`` step times per chunk
(1 MiB in ``replay``; where that holds fewer than ``TAIL_PER_RANK`` of each rank's, longer:
:meth:`Tails.width`), so its window of ``window`` step times spans the last ``window /
TAIL_PER_RANK`` chunks, not the last ``window`` steps, and ``min_steps`` step times need a few
chunks after the first (whose head and end usually give them at once). A rank that prints less
often than the others (say one line for every ``TAIL_SPAN`` of theirs, or fewer) may fall outside
the stretch: it gets no step time from that chunk, but still one wherever its line is in the
tail, and a refresh whose stretch misses it makes its next line in a tail a full pass; its window
just moves more slowly. Chunks of one or a few lines (``run``, ``watch``,
``observe``) lose nothing: their tail is the whole chunk. Verdicts are those of the same
statistics over the step times taken (``ftwatch.rules.stragglers``).

Cost: a full pass for a new rank; wherever the stretch the known
ranks need is the whole chunk (thousands of ranks: one step line each per chunk), the whole chunk;
otherwise a few regex passes over the tail stretch (a few times ``TAIL_PER_RANK`` x ranks lines)
and one literal pass for the straggler reports, whatever the chunk's number of step lines, and
every ``FULL_EVERY`` chunks the refresh's stretch (``window`` x ranks lines: a quarter of a MiB of
Megatron lines of 8 ranks, ~1.5 ms against the full pass's ~6 ms), and a stream's first chunk
its two stretches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Container

from ftwatch.bounded import BoundedDict
from ftwatch.config.limits import MAX_INSTANCES_PER_JOB
from ftwatch.rules.stepranks import Hit, by_rank
from ftwatch.rules.steplines import StepLines

TAIL_PER_RANK = 4        # step lines per rank taken from a chunk's tail
TAIL_SPAN = 4            # the stretch stops growing at this x TAIL_PER_RANK x known ranks step lines
#: every this many chunks of a stream, a refresh. A full pass of a MiB of Megatron lines costs
#: ~4 ms, ~20 tails; at 16 such refreshes were a third of the tap's CPU in a bench replay (issue 16)
FULL_EVERY = 32
FIRST_STRETCH = 4096     # bytes: the least stretch read first
REFRESH_FIRST = 64 << 10  # bytes: the first stretch of a refresh, and of a first chunk's head and tail

#: A chunk's step lines by rank (``stepranks.by_rank``'s keys), each rank's in line order.
Groups = dict[Any, list[Hit]]


@dataclass
class Stream:
    """What the tails of one stream go by."""

    known: set = field(default_factory=set)   # rank keys seen since (and at) the last full pass
    sparse: frozenset = frozenset()           # of those, the ones the stretch does not wait for
    chunks: int = 0                           # tails since the last full pass
    density: float = 256.0                    # bytes of chunk per step line, last seen


class Tails:
    """A chunk's step lines for the tap: the tail of a stream with known ranks, else all of them.

    Args:
        lines: the tap's chunk pass (``StepLines``).
        enabled: False for a full pass on every chunk (the intake as it was; custom patterns).
        window: step times a rank's window keeps (``health.straggler.window``): what a refresh
            reads for each rank.
        head: step times of a rank's baseline (``health.straggler.min_steps``): what a stream's
            first chunk reads for each rank from its start.
    """

    def __init__(self, lines: StepLines, enabled: bool = True, window: int = 50, head: int = 10):
        self.lines = lines
        self.enabled = enabled
        self.need = max(window, head)     # lines per rank a refresh (a first chunk's end) reads
        self.head = head
        self.inexact = frozenset(i for i, exact in enumerate(lines.exact) if not exact)
        self.reset()

    def reset(self) -> None:
        """Forget every stream (a new attempt)."""
        self.streams: BoundedDict[Any, Stream] = BoundedDict(MAX_INSTANCES_PER_JOB, "step_tail_stream")

    def width(self, stream: Any) -> int:
        """Bytes of ``stream`` whose tail holds ``TAIL_PER_RANK`` step lines of each rank known on it
        (by the last chunk's bytes per step line, with half again to spare): where a chunk is
        shorter, :meth:`find` reads the whole chunk. 0 where no rank is known (or tails are off)."""
        state = self.streams.get(stream) if self.enabled else None
        return _stretch_bytes(state) if state is not None and state.known else 0

    def find(self, stream: Any, data: bytes, end: int, skip: Container[int]) -> tuple[list[Hit], Groups]:
        """The step lines of ``data``'s lines before ``end`` (not in ``skip``) that the tap takes.

        Args:
            stream: the chunk's stream (a hashable ``Origin``): whose known ranks.
            data, end, skip: as ``StepLines.find``.

        Returns:
            (the hits taken, in line order; the same by rank, keys in order of first line).
        """
        state = self.streams.get(stream) if self.enabled else None
        if state is None and self.enabled:
            return self._first(stream, data, end, skip)
        if state is None or not state.known:
            return self._full(stream, data, end, skip)
        if state.chunks + 1 >= FULL_EVERY:
            return self._refresh(stream, data, end, skip)
        state.chunks += 1
        known, need = state.known, TAIL_PER_RANK
        wanted = [key for key in known if key not in state.sparse] if state.sparse else known
        bound = TAIL_SPAN * need * len(known)
        width = max(FIRST_STRETCH, _stretch_bytes(state))
        if width >= end:                              # the tail is the whole chunk (thousands of ranks)
            state.chunks -= 1
            return self._full(stream, data, end, skip)
        groups: Groups = {}
        cut, count = end, 0
        while cut > 0:
            lo = max(0, end - width)
            lo = data.rfind(b"\n", 0, lo) + 1 if lo > 0 else 0
            if lo >= cut:
                width *= 2
                continue
            part = self.lines.find(data, cut, skip, begin=lo)
            cut, count = lo, count + len(part)
            ranks = by_rank(data, part)
            if not known.issuperset(ranks):          # a rank new to the stream: read everything
                return self._full(stream, data, end, skip)
            _join(groups, ranks, first=True)
            if count >= bound or all(len(groups.get(key, ())) >= need for key in wanted):
                break
            width *= 2
        if count:
            state.density = max(1.0, (end - cut) / count)
        _join(groups, self._reports(data, 0, cut, skip), first=True)
        taken: Groups = {}
        for key, mine in sorted(groups.items(), key=lambda item: item[1][0][0]):
            exact = [hit for hit in mine if hit[2] is not None]
            if len(exact) > need:
                first = exact[-need][0]
                mine = [hit for hit in mine if hit[2] is None or hit[0] >= first]
            taken[key] = mine
        hits = sorted((hit for mine in taken.values() for hit in mine), key=lambda hit: hit[0])
        return hits, taken

    def _full(self, stream: Any, data: bytes, end: int, skip: Container[int]) -> tuple[list[Hit], Groups]:
        """Every step line of the chunk; the stream's known ranks start again from them."""
        hits = self.lines.find(data, end, skip)
        groups = by_rank(data, hits)
        if self.enabled and groups:
            self._know(stream, groups, end / len(hits))
        return hits, groups

    def _first(self, stream: Any, data: bytes, end: int, skip: Container[int]) -> tuple[list[Hit], Groups]:
        """A stream's first chunk: each rank's first ``head`` step lines (its baseline, a bar's
        length) and a last stretch holding its last ``window`` (sparse ranks aside, both), the
        straggler reports between; the whole chunk where the two meet. Each such rank's state is
        then what a full pass leaves, but for its count of step times seen."""
        head, cut = self._stretch(data, 0, end, skip, self.head, forward=True)
        if cut >= end:
            return self._known(stream, head, end)
        tail, lo = self._stretch(data, cut, end, skip, self.need)
        groups = dict(head)
        _join(groups, self._reports(data, cut, lo, skip))
        _join(groups, tail)
        if tail:
            self._know(stream, groups, (end - lo) / sum(map(len, tail.values())))
            return self._in_order(groups)
        return self._known(stream, groups, end)

    def _refresh(self, stream: Any, data: bytes, end: int, skip: Container[int]) -> tuple[list[Hit], Groups]:
        """The step lines of a last stretch holding ``window`` of every rank's in it (sparse ones
        aside), or of the whole chunk, and the straggler reports before it; the stream's known
        ranks start again from the stretch's."""
        groups, cut = self._stretch(data, 0, end, skip, self.need)
        if not groups:
            return [], {}
        self._know(stream, groups, (end - cut) / sum(map(len, groups.values())))
        _join(groups, self._reports(data, 0, cut, skip), first=True)
        return self._in_order(groups)

    def _stretch(self, data: bytes, lo: int, hi: int, skip: Container[int], need: int,
                 forward: bool = False) -> tuple[Groups, int]:
        """The step lines by rank of a stretch of the lines in ``[lo, hi)`` ending at ``hi`` (from
        ``lo`` with ``forward``), grown from ``REFRESH_FIRST`` bytes (doubling) until every rank in
        it has ``need`` lines, but for sparse ones (fewer than one of ``TAIL_SPAN`` of the busiest
        rank's), or it is the whole range. Returns (the groups, where the stretch stops: its
        start, or with ``forward`` its end)."""
        width, groups = REFRESH_FIRST, {}
        done = hi if not forward else lo                 # the stretch read so far ends (starts) here
        while (done > lo) if not forward else (done < hi):
            if forward:
                at = min(hi, lo + width)
                at = data.find(b"\n", at - 1) + 1 if at < hi else hi
                at = at if at > 0 else hi
                part, done_next = self.lines.find(data, at, skip, begin=done), at
            else:
                at = max(lo, hi - width)
                at = data.rfind(b"\n", 0, at) + 1 if at > lo else lo
                at = max(at, lo)
                part, done_next = (self.lines.find(data, done, skip, begin=at), at) if at < done else ([], done)
            width *= 2
            if done_next == done:
                continue
            done = done_next
            _join(groups, by_rank(data, part), first=not forward)
            if groups:
                busiest = max(map(len, groups.values()))
                if all(len(mine) >= need or len(mine) * TAIL_SPAN < busiest for mine in groups.values()):
                    break
        return groups, done

    def _reports(self, data: bytes, lo: int, hi: int, skip: Container[int]) -> Groups:
        """Megatron's straggler reports among the lines in ``[lo, hi)`` by rank (every one counts,
        wherever it is)."""
        if hi <= lo or not self.inexact:
            return {}
        return by_rank(data, self.lines.find(data, hi, skip, begin=lo, only=self.inexact))

    def _known(self, stream: Any, groups: Groups, end: int) -> tuple[list[Hit], Groups]:
        """Every step line by rank of a first chunk whose lines end at ``end``: the stream's known
        ranks from them, and the hits in line order."""
        if groups:
            self._know(stream, groups, end / sum(map(len, groups.values())))
        return self._in_order(groups)

    @staticmethod
    def _in_order(groups: Groups) -> tuple[list[Hit], Groups]:
        """(the hits in line order, the groups with keys in order of first line)."""
        groups = dict(sorted(groups.items(), key=lambda item: item[1][0][0]))
        return sorted((hit for mine in groups.values() for hit in mine), key=lambda hit: hit[0]), groups

    def _know(self, stream: Any, groups: Groups, density: float) -> None:
        """The stream's known ranks from a pass's step lines by rank (``density``: bytes of chunk per
        step line): a rank with fewer than one of ``TAIL_SPAN`` of the busiest rank's is sparse."""
        busiest = max(map(len, groups.values()))
        sparse = frozenset(key for key, mine in groups.items() if len(mine) * TAIL_SPAN < busiest) \
            if busiest > TAIL_SPAN else frozenset()   # (none with at most that: a chunk of thousands of ranks)
        self.streams[stream] = Stream(set(groups), sparse, 0, max(1.0, density))


def _stretch_bytes(state: Stream) -> int:
    """Bytes of a stretch holding ``TAIL_PER_RANK`` step lines of each of ``state``'s known ranks, with
    half again to spare (``Stream.density``: bytes per step line, last seen)."""
    return int(state.density * TAIL_PER_RANK * len(state.known) * 1.5)


def _join(groups: Groups, part: Groups, first: bool = False) -> None:
    """Each rank's lines of ``part`` into ``groups``: before the lines it holds with ``first``
    (``part`` is earlier in the chunk), else after them."""
    for key, mine in part.items():
        before = groups.get(key)
        groups[key] = mine if before is None else (mine + before if first else before + mine)
