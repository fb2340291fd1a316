"""Exactly once for Forward requests with a ``chunk`` id (``require_ack``, ``ftwatch watch``, issue 17).

A request with a ``chunk`` option is queued as a ``ShippedBatch`` carrying its id
(``ChunkMark``), and answered ``{"ack": chunk}`` only once the consumer has acknowledged it
(``ShippedBatch.ack``): ``watch`` stores the id in the transaction of the records' findings and
events (``SqliteStore`` table ``chunks``). The connection waits for that ack before it reads on
(one chunk in flight per connection, as fluent-bit's ``out_forward`` with
``Require_ack_response`` sends them). A request whose id ``seen`` says is stored (the client sent
it again because a kill lost the ack), or whose id another connection is handling right now, is
acked without queueing its records again, counted ``repeated`` and reported to
``repeated(name, records)``. Ids are compared per source, as sent: fluent-bit's is the first 16
bytes of the SHA-512 of the chunk's data in hex (plugins/out_forward/forward_format.c,
``append_options``), fluentd's its buffer chunk's unique id; both are the same on every resend.

``ftwatch.pipeline.sources.forward`` owns the sockets and hands such requests to
:meth:`ChunkAcks.deliver`.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from typing import Callable

from ftwatch.pipeline.sources.base import ChunkMark, Shipped, ShippedBatch, put_until_stopped
from ftwatch.pipeline.sources.forward_protocol import pack_ack

log = logging.getLogger(__name__)

ACK_POLL = 0.25           # seconds between checks for a stop while a chunk awaits its consumer's ack
KEEP_CHUNKS = 1_000_000   # the limits config's defaults (ftwatch.config.limits says why)
KEEP_CHUNK_SECONDS = 3600.0


class ChunkAcks:
    """One Forward source's chunk ids: those in flight, the acks after the consumer's, the repeats.

    Args:
        name: the source's name (the ids' scope in the store, and in logs).
        out: the source's bounded queue.
        stopping: set when the source stops (a wait for an ack gives up then).
        count: the source's counters, called with keyword deltas (``messages``, ``entries``,
            ``acks``, ``repeated``).
        seen: ``(name, chunk) -> bool``: whether the consumer's store holds that chunk id
            (``SqliteStore.chunk_seen``); None: none is stored.
        keep_chunks: how many chunk ids the store keeps (``ChunkMark.keep``).
        keep_chunk_seconds: how long the store keeps a chunk id (``ChunkMark.keep_seconds``).
        repeated: called with ``(name, records)`` for each request skipped as sent before, or None.
    """

    def __init__(self, name: str, out: queue.Queue, stopping: threading.Event, count: Callable[..., None],
                 seen: Callable[[str, str], bool] | None = None, keep_chunks: int = KEEP_CHUNKS,
                 keep_chunk_seconds: float = KEEP_CHUNK_SECONDS,
                 repeated: Callable[[str, int], None] | None = None):
        self.name, self.out, self._stopping, self._count = name, out, stopping, count
        self.seen = seen
        self.keep_chunks = keep_chunks
        self.keep_chunk_seconds = keep_chunk_seconds
        self.repeated = repeated
        self._lock = threading.Lock()
        self._in_flight: dict[str, ShippedBatch] = {}   # chunk id -> its batch, queued and not acked

    def deliver(self, sock: socket.socket, chunk: str, records: int, convert: Callable[[], list[Shipped]]) -> None:
        """A request with ``chunk`` id and ``records`` entries (``convert`` makes its Shipped):
        queued and acked once its consumer acknowledged it, or acked at once and skipped when its
        id is stored or in flight.

        Raises:
            OSError: the source is stopping before the batch was acknowledged (no ack is sent; the
                client sends it again), or the ack cannot be sent.
        """
        batch = ShippedBatch(chunk=ChunkMark(self.name, chunk, self.keep_chunks, self.keep_chunk_seconds))
        with self._lock:
            earlier = self._in_flight.setdefault(chunk, batch)
        if earlier is not batch:              # sent again while the first copy is being handled
            if not self._wait(earlier):
                raise OSError("stopping")
            return self._repeat(sock, chunk, records)
        try:
            if self.seen is not None and self.seen(self.name, chunk):
                return self._repeat(sock, chunk, records)
            batch.extend(convert())
            if not put_until_stopped(self.out, batch, self._stopping) or not self._wait(batch):
                raise OSError("stopping")     # not handled: no ack; the client sends it again
        finally:
            with self._lock:
                self._in_flight.pop(chunk, None)
        self._count(messages=1, entries=len(batch), acks=1)
        sock.sendall(pack_ack(chunk))

    def _wait(self, batch: ShippedBatch) -> bool:
        """Wait for the consumer's ack of ``batch``; False when the source stops first."""
        while not batch.wait(ACK_POLL):
            if self._stopping.is_set():
                return False
        return True

    def _repeat(self, sock: socket.socket, chunk: str, records: int) -> None:
        """Ack a chunk handled before and skip its ``records`` (counted)."""
        self._count(repeated=1, acks=1)
        if self.repeated is not None:
            self.repeated(self.name, records)
        log.warning("%s: chunk %s was handled before: acked again, %d records skipped", self.name, chunk, records)
        sock.sendall(pack_ack(chunk))
