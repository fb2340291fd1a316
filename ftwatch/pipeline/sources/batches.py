"""The shipped queue's batches as its consumer (``ftwatch watch``) takes them: a backlog taken
together, its lines grouped per origin, the source positions it carries.

Sources put ``list[Shipped]`` (a file tail's :class:`~ftwatch.pipeline.sources.base.ShippedBatch`)
on one bounded queue (``ftwatch.pipeline.sources.base``). :func:`take_backlog` takes the next
batch and the batches queued behind it as one :class:`MergedBatch` (issue 16), or, resolving them
as it takes them, as one :class:`GroupedBacklog` of their lines grouped per origin, either of which
acknowledges each of them; :func:`group_lines` groups a batch's resolved lines per origin (the
chunks the engine scans); :func:`positions_of` reads the offsets a batch's sources commit with its effects
and :func:`chunks_of` the Forward chunk ids stored with them (issue 17). Used by :mod:`ftwatch.pipeline.watch`.
"""

from __future__ import annotations

import itertools
import queue
import time
from typing import Callable, Iterable

from ftwatch.events import Origin
from ftwatch.pipeline.sources.base import Shipped

MERGE_LINES = 49152     # a backlog's batches are taken together up to about this many lines (issue 16)
GATHER_SECONDS = 0.2    # a consumer that found its queue full waits at most this long in all for more


class MergedBatch(list):
    """Batches that were queued together, as one ``list[Shipped]`` for ``Watcher.ingest``
    (their lines in queue order); :meth:`ack` acknowledges each of them (``ShippedBatch.ack``).

    Args:
        batches: the batches, in queue order.
    """

    def __init__(self, batches: list[list[Shipped]]):
        super().__init__(itertools.chain.from_iterable(batches))
        self.batches = batches
        self.taken = len(self)

    def ack(self) -> None:
        """Acknowledge every batch that carries an ``ack`` (a file tail's), in queue order."""
        _ack_each(self.batches)


class GroupedBacklog:
    """Batches that were queued together, taken with a ``resolve`` (:func:`take_backlog`): only
    their resolved lines, grouped per origin as each batch was resolved (:class:`LineGroups`),
    what ``Watcher.ingest`` feeds the engine; of the batches only those carrying an ack, a
    position or a chunk id. No ``(origin, line, time)`` triple is kept per line: in flight a
    line costs its bytes and a list slot (~130 B for a Forward record's), not also a tuple the
    garbage collector tracks and a float (~90 B more), and the grouping pass ``ingest`` made
    over the triples is the one made while taking them.

    Attributes:
        batches: the batches to acknowledge (and whose positions and chunk ids are stored).
        groups: origin -> (its lines in queue order, its latest time), origins in order of
            first line (:func:`group_lines` of the batches' resolved lines, in queue order).
        taken: how many Shipped the batches held (their lines may be fewer: split lines
            joined, partial ones held back).
    """

    def __init__(self, batches: list[list[Shipped]], groups: dict[Origin, tuple[list[bytes], float]],
                 taken: int, lines: int):
        self.batches, self.groups, self.taken, self._lines = batches, groups, taken, lines

    def __len__(self) -> int:
        """The resolved lines held."""
        return self._lines

    def __bool__(self) -> bool:
        """True when a Shipped was taken (to be ingested and acknowledged), even if none of them
        resolved to a complete line yet."""
        return self.taken > 0

    def ack(self) -> None:
        """Acknowledge every batch that carries an ``ack`` (a file tail's), in queue order."""
        _ack_each(self.batches)


def _ack_each(batches: list[list[Shipped]]) -> None:
    for batch in batches:
        ack = getattr(batch, "ack", None)
        if ack is not None:
            ack()


class LineGroups:
    """``(origin, line, time)`` triples grouped per origin as they come, over many calls of
    :meth:`add` (a backlog's batches, each resolved in turn): what :func:`group_lines` makes of
    them all at once.
    """

    def __init__(self) -> None:
        # Lines are gathered per Origin *object* first (id() hashes in C; an Origin's own hash runs
        # Python code), and each new object is looked up once by value, so equal Origins that are
        # different objects still share one list and no line changes places.
        self._by_id: dict[int, list] = {}
        self._by_value: dict[Origin, list] = {}
        self.lines = 0

    def add(self, resolved: Iterable[tuple[Origin, bytes, float]]) -> None:
        """Group ``resolved`` after the lines added before."""
        by_id, by_value, n = self._by_id, self._by_value, 0
        for origin, line, t in resolved:
            n += 1
            slot = by_id.get(id(origin))
            if slot is None:
                slot = by_value.get(origin)
                if slot is None:
                    slot = by_value[origin] = [t, []]
                by_id[id(origin)] = slot
                slot.append(origin)      # holds the object, so its id is not reused meanwhile
            if not slot[0] > t:          # max(t, latest), as max() treats ties and NaN
                slot[0] = t
            slot[1].append(line)
        self.lines += n

    def groups(self) -> dict[Origin, tuple[list[bytes], float]]:
        """origin -> (its lines in input order, its latest time), origins in order of first line."""
        return {origin: (slot[1], slot[0]) for origin, slot in self._by_value.items()}


def take_backlog(q: queue.Queue, timeout: float,
                 resolve: Callable[[list[Shipped]], Iterable[tuple[Origin, bytes, float]]] | None = None,
                 ) -> list[Shipped] | None:
    """The next queued batch, waiting up to ``timeout`` seconds (None: none came), and with it the
    batches queued behind it, up to :data:`MERGE_LINES` lines in all, as one :class:`MergedBatch`
    (with ``resolve``: one :class:`GroupedBacklog`; a batch alone is returned as it is).

    Taking what is queued already adds no wait, unless the queue (bounded, of 2 or more batches)
    was full: then its sources are blocked on this consumer, which has fallen behind, and it
    also waits for the batches they send next, until :data:`MERGE_LINES` lines or
    :data:`GATHER_SECONDS` after it took the first (a trickle cannot hold it longer). A lagging
    monitor so ingests backlogs about ``MERGE_LINES`` long even where the queue's bound holds
    fewer lines (``bench_ingest``: 8 batches of 1,000 records from 1,000 pods), and every cost
    paid once per origin and batch (its chunk's handling, the step tap's per-rank work and
    verdicts, the progress reads) is paid once per ~49 lines of a pod, not once per ~8. The wait
    costs a behind monitor no throughput: its sources fill the queue meanwhile. Measured
    (``bench_ingest``, 200,000 records, 10,000 rules, 2 cores): 24,576 lines and 0.1 s gave
    ~137 k records per CPU-second, ingest ~3.5 us a record; 49,152 lines and 0.2 s (the
    backlogs reach it) ~153 k, ingest ~2.8 us, RSS 124 -> 136 MB (the goal: <= 150), for at most
    0.1 s more latency while the monitor is behind. Backlogs of ~98,000 lines gained another ~3 %
    for 0.4 s and RSS close to the goal.

    With ``resolve`` (``Watcher.next_batch``: the identity's), a backlog's batches are resolved
    as they are taken, each in turn (the same calls, in the same order, as resolving the merged
    batch), and only their lines kept, grouped per origin as they come (:class:`GroupedBacklog`):
    in flight, a Forward record costs its line, not also its record map with Kubernetes
    metadata (~0.8 KB) nor an ``(origin, line, time)`` tuple. Memory in flight: up to
    ``MERGE_LINES`` lines taken, plus the queue's bound of batches.
    """
    try:
        batch = q.get(timeout=timeout)
    except queue.Empty:
        return None
    lines = len(batch)
    if lines >= MERGE_LINES:
        return batch
    behind = 1 < q.maxsize <= q.qsize() + 1     # it was full: its sources wait on this consumer
    deadline = time.monotonic() + GATHER_SECONDS if behind else None
    batches = [batch]
    grouped: LineGroups | None = None
    while lines < MERGE_LINES:
        try:
            left = 0.0 if deadline is None else deadline - time.monotonic()
            more = q.get(timeout=left) if left > 0 else q.get_nowait()
        except queue.Empty:
            break
        lines += len(more)
        if resolve is None:
            batches.append(more)
            continue
        if grouped is None:                     # a backlog after all: the first batch's lines first
            grouped = LineGroups()
            grouped.add(resolve(batch))
            batches = [batch] if _carries(batch) else []
            batch = None
        grouped.add(resolve(more))
        if _carries(more):
            batches.append(more)
        more = None                             # its Shipped go now, its lines stay
    if grouped is not None:
        return GroupedBacklog(batches, grouped.groups(), lines, grouped.lines)
    return batch if len(batches) == 1 else MergedBatch(batches)


def _carries(batch: list[Shipped]) -> bool:
    """Whether ``batch`` carries what its consumer acknowledges or stores (an ``ack``, a
    ``position``, a Forward ``chunk``): else only its lines matter."""
    return any(getattr(batch, name, None) is not None for name in ("ack", "position", "chunk"))


def group_lines(resolved: Iterable[tuple[Origin, bytes, float]]) -> dict[Origin, tuple[list[bytes], float]]:
    """Groups ``(origin, line, time)`` triples per origin, in one pass: what ``Watcher.ingest``
    feeds the engine (:class:`LineGroups`, all at once).

    Returns:
        origin -> (its lines in input order, its latest time), origins in order of first line.
    """
    grouped = LineGroups()
    grouped.add(resolved)
    return grouped.groups()


def positions_of(batch: list[Shipped]) -> list:
    """The source positions (``ShippedBatch.position``) a batch carries; of a batch made of
    several (``batches``), each one's."""
    return _carried(batch, "position")


def chunks_of(batch: list[Shipped]) -> list:
    """The Forward chunk ids (``ShippedBatch.chunk``, a ``ChunkMark``) a batch carries, stored
    with its effects (issue 17); of a batch made of several (``batches``), each one's."""
    return _carried(batch, "chunk")


def _carried(batch: list[Shipped], name: str) -> list:
    """Attribute ``name`` of the batch, or of each batch a merged one is made of, where not None."""
    parts = getattr(batch, "batches", None) or (batch,)
    return [x for x in (getattr(b, name, None) for b in parts) if x is not None]
