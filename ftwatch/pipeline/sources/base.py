"""What shipped sources (Forward, HTTP, stdin, file tails) hand to ``ftwatch watch``.

A shipped source does not know the job, node or instance of a line: it hands over the
line and whatever metadata came with it (a fluent-bit record's fields, a file's path), and
``ftwatch.pipeline.sources.identity`` turns the metadata into an Origin. Lines still wrapped in a
container runtime's envelope (CRI, docker json-file) are unwrapped by
``ftwatch.parsers.envelopes`` before that.

Sources put their output on one bounded ``queue.Queue``: when it is full, ``put`` blocks the
source's thread, so a Forward connection stops being read (TCP backpressure) and a file tail
stops reading, instead of ftwatch buffering without limit.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Protocol

log = logging.getLogger(__name__)

PUT_POLL = 0.25   # seconds between checks for a stop while the queue is full


@dataclass(frozen=True, slots=True)
class Shipped:
    """One log line as a shipped source received it.

    Attributes:
        time: epoch seconds (the record's own time where the protocol carries one, else receipt).
        line: the log text, without its trailing newline; may still be a CRI/docker envelope
            when ``meta["envelope"]`` says so.
        meta: the record's other fields (fluent-bit: ``stream``, ``kubernetes`` {``pod_name``,
            ``namespace_name``, ``host``, ``labels``, ``container_name``}; ``tag``; a file
            source: ``path``; ``envelope``: ``cri`` | ``docker`` | absent).
    """

    time: float
    line: bytes
    meta: Mapping[str, Any] = field(default_factory=dict)


class Position(NamedTuple):
    """A source's position after a batch, for the consumer to store with the batch's effects.

    Attributes:
        key: which source's position (a file tail's: ``offsets/<name>.json``); one row per key.
        seq: rises with every position the source writes (a newer one replaces an older one).
        document: the position itself, opaque to the consumer (a file tail's offsets file).
    """

    key: str
    seq: int
    document: bytes


class ChunkMark(NamedTuple):
    """A Forward request's ``chunk`` id (spec v1 "option"), for the consumer to store with the
    effects of the request's records: the same id sent again (its ack was lost) is then acked
    and skipped (``ForwardSource``, issue 17).

    Attributes:
        source: the source's name (ids are kept per source).
        chunk: the id as the client sent it (fluent-bit: 32 hex digits of the SHA-512 of the
            chunk's data, the same on every resend; fluentd: the buffer chunk's unique id).
        keep: ids the store keeps at most (``limits.forward_chunks_kept``).
        keep_seconds: how long the store keeps an id (``limits.forward_chunk_seconds``).
    """

    source: str
    chunk: str
    keep: int
    keep_seconds: float


class ShippedBatch(list):
    """A ``list[Shipped]`` the consumer acknowledges with :meth:`ack` once it has handled the lines
    durably; the source's position is committed with that acknowledgement.

    Attributes:
        commit: called by :meth:`ack`, in the consumer's thread, before it returns (a file tail
            makes the offsets after these lines its saved ones: one rename); returns whether it
            committed. None: nothing to commit.
        committed: what ``commit`` returned (False before the ack, or when it raised).
        position: the source's position after these lines (:class:`Position`), or None. A
            consumer with a transactional store writes it in the transaction that stores the
            lines' effects, before the ack; the source resumes from it at its next start when it
            is newer than its own (the process died between that transaction and the ack), so a
            batch is never handled twice (``ftwatch watch``, issue 17).
        chunk: the Forward ``chunk`` id of the request these lines came in (:class:`ChunkMark`),
            or None; written like ``position``, so the request sent again is skipped.
    """

    __slots__ = ("_acked", "commit", "committed", "position", "chunk")

    def __init__(self, items: Any = (), commit: Callable[[], bool] | None = None,
                 position: Position | None = None, chunk: ChunkMark | None = None):
        super().__init__(items)
        self._acked = threading.Event()
        self.commit = commit
        self.committed = False
        self.position = position
        self.chunk = chunk

    def ack(self) -> None:
        """The lines are handled: commit the source's position, then tell the source. Idempotent."""
        if self._acked.is_set():
            return
        if self.commit is not None:
            try:
                self.committed = bool(self.commit())
            except Exception:        # the lines are handled; the source records them later
                log.exception("committing a batch's position failed")
        self._acked.set()

    @property
    def acked(self) -> bool:
        """Whether :meth:`ack` was called."""
        return self._acked.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`ack`; returns :attr:`acked`."""
        return self._acked.wait(timeout)

    def wait_acked(self, stopping: threading.Event) -> bool:
        """Wait for :meth:`ack`; False if ``stopping`` was set first."""
        while not self._acked.wait(PUT_POLL):
            if stopping.is_set():
                return False
        return True


class ShippedSource(Protocol):
    """A source that puts ``list[Shipped]`` batches on a queue until stopped."""

    name: str

    def start(self) -> None:
        """Start its thread(s); returns at once. Raises SourceError if it cannot start."""

    def stop(self) -> None:
        """Stop and join its threads; idempotent."""


def put_until_stopped(out: queue.Queue, batch: list, stopping: threading.Event) -> bool:
    """Put ``batch`` on ``out``, waiting while it is full (backpressure); False if ``stopping`` was
    set first (the batch was not queued, so the sender must not be acknowledged)."""
    while not stopping.is_set():
        try:
            out.put(batch, timeout=PUT_POLL)
            return True
        except queue.Full:
            continue
    return False


def record_line(record: Mapping[str, Any], text: Any, errors: str) -> bytes:
    """The log line of a shipped record: its ``log``/``message`` text (given as ``text``), else
    the record (or the odd value) as JSON; UTF-8 with ``errors``, one trailing newline removed.

    Shared by the Forward and HTTP sources so a record means the same line whichever way it came.
    """
    if type(text) is bytes:
        line = text
    elif type(text) is str:
        line = _encode(text, errors)
    else:
        try:
            dumped = json.dumps(record if text is None else text, ensure_ascii=False, default=_jsonable)
        except (TypeError, ValueError):       # e.g. bytes map keys
            dumped = repr(record if text is None else text)
        line = _encode(dumped, errors)
    return line[:-1] if line.endswith(b"\n") else line


def _encode(text: str, errors: str) -> bytes:
    try:
        return text.encode("utf-8", errors)
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, Mapping):
        return dict(value)
    return repr(value)
