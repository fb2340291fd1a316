"""Reads log lines from standard input (or any binary stream) until EOF (SPEC S4).

``some-launcher | ftwatch watch --config c.yaml`` with a ``stdin`` source: one thread reads
the stream in chunks (``read1``: whatever a pipe has, up to ``READ_SIZE`` bytes, without
waiting for more), splits the complete lines, and puts each chunk's lines on the queue as
one ``list[Shipped]`` (time: when read; meta: the configured one, e.g. ``{"instance":
"launcher", "job": "mnist"}``). A partial line waits for the next chunk; it is handed out
at EOF, or once it reaches ``MAX_LINE`` bytes (then the rest follows as further lines), so
a 10 MB line or binary garbage without newlines cannot grow memory without bound (Q1).
Lines are bytes as read, without their ``\\n``; decoding happens later. A bare ``\\r`` also ends a
line (``process.line_end``): a progress bar's ``\\r``-separated updates are seen while it runs.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from typing import Any, BinaryIO, Mapping

from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.process import line_end

__all__ = ["StdinSource"]

log = logging.getLogger(__name__)

READ_SIZE = 65536
MAX_LINE = 16 * 1024 * 1024
PUT_POLL = 0.5        # seconds between checks for stop() while the queue is full


class StdinSource:
    """Puts the lines of a binary stream on a queue as ``list[Shipped]`` batches until EOF.

    Args:
        out: the bounded queue; a full queue holds the reader (the writer then blocks on its pipe).
        stream: a binary stream with ``read1`` or ``read`` (default: ``sys.stdin.buffer``).
        meta: the ``meta`` of every line (copied once; shared, read-only, by all lines).
        name: the source's name.

    Attributes:
        ended: set once EOF was reached and the last batch is on the queue (or on ``stop``).
        lines: lines queued so far.
        error: the exception that ended reading early, if any (logged, not raised).
    """

    def __init__(self, out: queue.Queue, stream: BinaryIO | None = None,
                 meta: Mapping[str, Any] | None = None, name: str = "stdin"):
        self.out = out
        self.stream = stream if stream is not None else sys.stdin.buffer
        self.meta: Mapping[str, Any] = dict(meta or {})
        self.name = name
        self.ended = threading.Event()
        self.lines = 0
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts the reader thread; returns at once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"ftwatch-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Asks the reader to stop and waits up to ``timeout`` s; idempotent.

        A read already blocked on an idle pipe cannot be interrupted: the daemon thread then
        ends with the process (or at the pipe's EOF). ``ended`` is set either way.
        """
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.ended.set()

    def _run(self) -> None:
        read = getattr(self.stream, "read1", None) or self.stream.read
        pending: list[bytes] = []      # pieces of the line not yet ended (no b"\n" in them)
        size = 0
        try:
            while not self._stopping.is_set():
                chunk = read(READ_SIZE)
                if not chunk:
                    break
                now = time.time()
                end = line_end(chunk)          # a bare \r too: progress-bar updates (process.py)
                if end < 0:
                    pending.append(chunk)
                    size += len(chunk)
                    if size >= MAX_LINE:
                        if not self._put([Shipped(now, b"".join(pending), self.meta)]):
                            return
                        pending, size = [], 0
                    continue
                head = chunk[:end]
                if pending:
                    head = b"".join(pending) + head
                    pending, size = [], 0
                rest = chunk[end + 1:]
                if rest:
                    pending, size = [rest], len(rest)
                if not self._put([Shipped(now, line, self.meta) for line in head.split(b"\n")]):
                    return
            if pending and not self._stopping.is_set():
                self._put([Shipped(time.time(), b"".join(pending), self.meta)])
        except Exception as exc:  # noqa: BLE001 - a closed or broken stream ends the source, logged
            self.error = exc
            log.warning("%s: reading stopped: %s", self.name, exc)
        finally:
            self.ended.set()

    def _put(self, batch: list[Shipped]) -> bool:
        """Puts a batch, waiting while the queue is full; False when stopped first."""
        while not self._stopping.is_set():
            try:
                self.out.put(batch, timeout=PUT_POLL)
                self.lines += len(batch)
                return True
            except queue.Full:
                continue
        return False
