"""The shipped queue's batches as its consumer (``ftwatch watch``) takes them: a backlog taken
together, its lines grouped per origin, the source positions it carries.

Sources put ``list[Shipped]`` (a file tail's :class:`~ftwatch.pipeline.sources.base.ShippedBatch`)
on one bounded queue (``ftwatch.pipeline.sources.base``). :func:`take_backlog` takes the next
batch and the batches queued behind it as one :class:`MergedBatch` (issue 16), which acknowledges
each of them; :func:`group_lines` groups a batch's resolved lines per origin (the chunks the
engine scans); :func:`positions_of` reads the offsets a batch's sources commit with its effects
and :func:`chunks_of` the Forward chunk ids stored with them (issue 17). Used by :mod:`ftwatch.pipeline.watch`.
"""

from __future__ import annotations

import itertools
import queue
import time
from typing import Callable, Iterable

from ftwatch.events import Origin
from ftwatch.pipeline.sources.base import Shipped

MERGE_LINES = 24576     # a backlog's batches are taken together up to about this many lines (issue 16)
GATHER_SECONDS = 0.1    # a consumer that found its queue full waits at most this long in all for more


class MergedBatch(list):
    """Batches that were queued together, as one ``list[Shipped]`` for ``Watcher.ingest``
    (their lines in queue order); :meth:`ack` acknowledges each of them (``ShippedBatch.ack``).

    Taken with a ``resolve`` (:func:`take_backlog`), it holds the batches' resolved lines
    instead, ``(origin, line, time)`` each (:attr:`resolved` is True), and of the batches only
    those carrying an ack, a position or a chunk id: a plain list's Shipped and their metadata
    maps are freed as soon as it is taken.

    Args:
        batches: the batches, in queue order (with ``resolved``: those to acknowledge).
        resolved: their resolved lines, in queue order; None: hold the batches' Shipped.
        taken: how many Shipped the batches held (``resolved`` given; its lines may be fewer:
            split lines joined, partial ones held back).
    """

    def __init__(self, batches: list[list[Shipped]], resolved: list[tuple[Origin, bytes, float]] | None = None,
                 taken: int = 0):
        super().__init__(itertools.chain.from_iterable(batches) if resolved is None else resolved)
        self.batches = batches
        self.resolved = resolved is not None
        self.taken = taken if resolved is not None else len(self)

    def __bool__(self) -> bool:
        """True when a Shipped was taken (to be ingested and acknowledged), even if none of them
        resolved to a complete line yet."""
        return self.taken > 0

    def ack(self) -> None:
        """Acknowledge every batch that carries an ``ack`` (a file tail's), in queue order."""
        for batch in self.batches:
            ack = getattr(batch, "ack", None)
            if ack is not None:
                ack()


def take_backlog(q: queue.Queue, timeout: float,
                 resolve: Callable[[list[Shipped]], Iterable[tuple[Origin, bytes, float]]] | None = None,
                 ) -> list[Shipped] | None:
    """The next queued batch, waiting up to ``timeout`` seconds (None: none came), and with it the
    batches queued behind it, up to :data:`MERGE_LINES` lines in all, as one :class:`MergedBatch`
    (a batch alone is returned as it is).

    Taking what is queued already adds no wait, unless the queue (bounded, of 2 or more batches)
    was full: then its sources are blocked on this consumer, which has fallen behind, and it
    also waits for the batches they send next, until :data:`MERGE_LINES` lines or
    :data:`GATHER_SECONDS` after it took the first (a trickle cannot hold it longer). A lagging
    monitor so ingests backlogs about ``MERGE_LINES`` long even where the queue's bound holds
    fewer lines (``bench_ingest``: 8 batches of 1,000 records from 1,000 pods), and every cost
    paid once per origin and batch (its chunk's handling, the step tap's per-rank work, the
    progress reads) is paid once per ~24 lines of a pod, not once per ~8. The wait costs a
    behind monitor no throughput: its sources fill the queue meanwhile. At 0.05 s a wait ended
    before ``MERGE_LINES`` (``bench_ingest``: backlogs of ~17,000 lines, 11 or 12 per 200,000
    records); at 0.1 s they reach it (8 to 10 per 200,000), ~6 % more records per CPU-second
    with the same memory bound, for at most 0.05 s more latency while the monitor is behind.

    With ``resolve`` (``Watcher.next_batch``: the identity's), a backlog's batches are resolved
    as they are taken, each in turn (the same calls, in the same order, as resolving the merged
    batch), and only their lines kept (:class:`MergedBatch`): in flight, a Forward record costs
    its line, not also its record map with Kubernetes metadata (~0.8 KB), so twice the lines
    are taken together in less memory than before (issue 16). Memory in flight: up to
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
    resolved: list[tuple[Origin, bytes, float]] | None = None
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
        if resolved is None:                    # a backlog after all: the first batch's lines first
            resolved = list(resolve(batch))
            batches = [batch] if _carries(batch) else []
            batch = None
        resolved += resolve(more)
        if _carries(more):
            batches.append(more)
        more = None                             # its Shipped go now, its lines stay
    if resolved is not None:
        return MergedBatch(batches, resolved, lines)
    return batch if len(batches) == 1 else MergedBatch(batches)


def _carries(batch: list[Shipped]) -> bool:
    """Whether ``batch`` carries what its consumer acknowledges or stores (an ``ack``, a
    ``position``, a Forward ``chunk``): else only its lines matter."""
    return any(getattr(batch, name, None) is not None for name in ("ack", "position", "chunk"))


def group_lines(resolved: Iterable[tuple[Origin, bytes, float]]) -> dict[Origin, tuple[list[bytes], float]]:
    """Groups ``(origin, line, time)`` triples per origin, in one pass: what ``Watcher.ingest``
    feeds the engine.

    Returns:
        origin -> (its lines in input order, its latest time), origins in order of first line.
    """
    # Lines are gathered per Origin *object* first (id() hashes in C; an Origin's own hash runs
    # Python code), and each new object is looked up once by value, so equal Origins that are
    # different objects still share one list and no line changes places.
    by_id: dict[int, list] = {}
    by_value: dict[Origin, list] = {}
    for origin, line, t in resolved:
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
    return {origin: (slot[1], slot[0]) for origin, slot in by_value.items()}


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
