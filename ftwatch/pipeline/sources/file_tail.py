"""Tailing log files by glob: growth, new files, rotation, truncation, persisted offsets (SPEC S2, Q1).

:class:`FileTailSource` follows the regular files matching its globs. Each
:meth:`~FileTailSource.poll_once` (its thread calls it every ``poll_interval``; tests call it
directly) re-globs, opens new files, notices rotation, truncation and deletion, and puts each
file's new complete lines on the queue as one batch (``list[Shipped]``). Like fluent-bit in_tail:

- **Start.** A file with a saved offset resumes there. A file found by the first scan without one
  is read from its head if ``read_from_head``, else from just after its last newline, unless the
  offsets file knew its path with another inode (it replaced a followed file while ftwatch was
  down): then from its head. Files that appear later are always read from their head.
- **Rename rotation**: files are known by (device, inode). When a path holds another inode, or
  none, and the old inode still has a name, the old one is read on for ``rotate_wait`` seconds
  (lines written to it after the rename arrive), then to its end, its partial last line emitted,
  and closed; the new file is read from its head. A file renamed to a name the globs also match
  is just followed there, never read twice.
- **copytruncate / truncation**: a file shorter than the read position, or whose first bytes
  changed, is read again from 0 (``stats["truncations"]``); the lines after the delivered offset
  that were not read yet are first read from its copy beside it (``stats["salvaged"]``), and a
  copy the globs match is followed from its end, never read again
  (:mod:`ftwatch.pipeline.sources.rotated`). Lines written between logrotate's copy and its
  truncate are in neither file (fluent-bit documents the same window); prefer rename rotation.
  **Deleted** files are read to their end and closed.
- **Rotated while down** (or killed inside ``rotate_wait``): a saved file that the globs no
  longer find is looked for by its inode in its directory and read on from its offset to its
  end; a followed file truncated while down is salvaged from its copy as above, also when it
  was renamed after the truncation (found by its inode with other content and a copy of what was
  delivered beside it: read from its head after the copy's lines).
- **Long lines** (over ``max_line_bytes``) are emitted once, cut, with :data:`TRUNCATED_MARKER`,
  and the rest skipped up to the newline (``stats["long_lines"]``): no stall, bounded memory.
  Binary data and invalid UTF-8 pass through as bytes. Only complete lines are emitted; a partial
  last line waits for its newline (or the end of a rotated or deleted file).

Delivery. With ``require_ack=False`` (default) a batch's offset is saved (in memory; on disk by
one :meth:`OffsetStore.flush` per pass) once the batch is on the queue: a crash between ``put``
and the flush re-emits those batches, a crash after it loses batches the consumer had not taken
yet. With ``require_ack=True`` (``ftwatch watch``) batches are :class:`ShippedBatch` es whose
offsets are committed with their delivery (issue 17): before a batch is put on the queue the
offsets after it are written aside (:meth:`OffsetStore.prepare`, fsync'd), and the consumer's
``batch.ack()`` makes them current with one rename before it returns (one batch per source in
flight). A crash before the ack re-reads the batch, a crash after it does not: nothing is lost,
and nothing the consumer acknowledged is read again. The consumer's own window, between storing
the batch's effects and its ack, is closed by the batch's ``position`` (the offsets after it,
:class:`~ftwatch.pipeline.sources.base.Position`): ``ftwatch watch`` stores it in the same SQLite
transaction as the lines' findings and events, and at start the offsets store adopts it when it
is newer than the file (:meth:`OffsetStore.adopt`, called by
``ftwatch.pipeline.sources.build_source``). A kill -9 at any point then loses and repeats no line.

Not resumed after a restart: a restart while skipping an over-long line emits that line's
remainder as a line.

This module is the tail loop: the thread, one pass under one lock, each file's growth cut into
lines, delivered and its offset saved or committed. Beside it: which files are followed and
where each starts, rotation, deletion and truncation noticed (``followed``), one file's position
(``tailed``), where its lines went after a rotation (``rotated``), the offsets on disk
(``checkpoints``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from ftwatch.pipeline.sources.base import Shipped, ShippedBatch, put_until_stopped
from ftwatch.pipeline.sources.checkpoints import FINGERPRINT_BYTES, Commit, OffsetStore, read_fingerprint
from ftwatch.pipeline.sources.followed import FollowedFiles
from ftwatch.pipeline.sources.rotated import Known, mark_at
from ftwatch.pipeline.sources.tailed import TailedFile

log = logging.getLogger(__name__)

TRUNCATED_MARKER = b" [ftwatch: line truncated]"  # appended to a line cut at max_line_bytes
MiB = 1024 * 1024


class FileTailSource:
    """Follows files matching globs and puts their complete lines on a queue, with saved offsets.

    Args:
        globs: path patterns (``glob`` syntax, ``**`` allowed); only regular files are followed,
            symlinks are followed to their target.
        out: the bounded queue the batches go to; a full queue blocks the source.
        offsets: where read offsets persist; use one store per source (it drops the entries of
            files it does not find at its first scan).
        name: the source's name (thread name, logs).
        read_from_head: read files found by the first scan without a saved offset from their
            head, not their end (module docstring: "Start").
        poll_interval: seconds between passes when there is nothing left to read.
        rotate_wait: seconds a rotated file is still read after it left its path.
        max_line_bytes: longer lines are cut to this many bytes plus :data:`TRUNCATED_MARKER`.
        chunk_bytes: bytes per read; one pass emits at most ``16 * chunk_bytes`` bytes of lines
            per file (then :attr:`backlog` is set and the thread passes again at once).
        clock: monotonic seconds, for ``rotate_wait`` (tests pass a fake one).
        envelope: ``"cri"`` / ``"docker"`` when the files hold container-runtime envelopes; put in
            each line's meta.
        require_ack: put :class:`ShippedBatch` es and save a batch's offset only after the consumer
            acks it (see the module docstring for the guarantee).

    Attributes:
        stats: counters: ``files`` (followed now), ``lines``, ``bytes`` (read), ``rotations``,
            ``truncations``, ``salvaged`` (lines read from a copy after a copytruncate),
            ``long_lines``, ``errors`` (OS errors on a file, logged).
        backlog: True when the last pass stopped on the per-file budget with data left to read.

    Each emitted :class:`Shipped` has ``time`` = epoch seconds of receipt, ``line`` = the bytes
    without the newline, and ``meta`` = ``{"path", "inode", "envelope"?}``; the lines of one
    batch share one meta dict, which consumers must not change.
    """

    def __init__(self, globs: list[str], out: queue.Queue, offsets: OffsetStore, *, name: str = "file",
                 read_from_head: bool = False, poll_interval: float = 0.25, rotate_wait: float = 5.0,
                 max_line_bytes: int = 10 * MiB, chunk_bytes: int = 256 * 1024,
                 clock: Callable[[], float] = time.monotonic, envelope: str | None = None,
                 require_ack: bool = False):
        if isinstance(globs, (str, bytes)):
            raise TypeError("globs must be a list of patterns, not one string")
        if max_line_bytes < 1 or chunk_bytes < 1:
            raise ValueError("max_line_bytes and chunk_bytes must be positive")
        self.globs = list(globs)
        self.name = name
        self.read_from_head = read_from_head
        self.poll_interval = poll_interval
        self.rotate_wait = rotate_wait
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = chunk_bytes
        self.envelope = envelope
        self.require_ack = require_ack
        self.stats = {"files": 0, "lines": 0, "bytes": 0, "rotations": 0, "truncations": 0,
                      "salvaged": 0, "long_lines": 0, "errors": 0}
        self.backlog = False
        self._out = out
        self._offsets = offsets
        self._clock = clock
        self._followed = FollowedFiles(offsets, self.stats, clock, name=name, read_from_head=read_from_head,
                                       rotate_wait=rotate_wait, chunk_bytes=chunk_bytes)
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- thread ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the polling thread; returns at once. A second call is a no-op."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"ftwatch-tail-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops and joins the thread, saves offsets and closes the files; idempotent.

        A batch blocked on a full queue or waiting for its ack is abandoned unsaved (it is read
        again after a restart).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._poll_lock:
            self._flush_offsets()
            self._followed.close_all()
            self.stats["files"] = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # never let one bad pass end the source
                self.stats["errors"] += 1
                log.exception("file tail %s: pass failed", self.name)
            if not self.backlog:
                self._stop.wait(self.poll_interval)

    # -- one pass -------------------------------------------------------------------------------------

    def poll_once(self) -> int:
        """Makes one pass: re-globs, opens new files, reads growth, handles rotation and truncation.

        Puts at most one batch per file on the queue (blocking while it is full), then saves the
        offsets of what was delivered.

        Returns:
            The number of lines emitted.
        """
        with self._poll_lock:
            self.backlog = False
            self._followed.update(self.globs)
            self._flush_offsets()  # where new files start, before any wait on the queue
            emitted = 0
            for f in list(self._followed.files.values()):
                if self._stop.is_set():
                    break
                try:
                    emitted += self._pump(f)
                except OSError as e:
                    self.stats["errors"] += 1
                    log.warning("file tail %s: reading %s failed: %s", self.name, f.path, e)
            self._flush_offsets()
            self.stats["files"] = len(self._followed.files)
            return emitted

    def _pump(self, f: TailedFile) -> int:
        """Reads one file's growth, delivers its batch, saves its offset. Returns lines emitted."""
        st = os.fstat(f.fd)
        if self._followed.truncated(f):
            self.stats["truncations"] += 1
            log.info("file tail %s: %s truncated; reading it from the start", self.name, f.path)
            f.salvage = Known((f.dev, f.ino), f.fp, f.saved, f.mark)
            f.pos, f.carry, f.carried, f.skipping = 0, [], 0, False
            f.fp = read_fingerprint(f.fd)
        f.size_seen = st.st_size
        batch: list[Shipped] = ShippedBatch() if self.require_ack else []
        meta: dict[str, Any] = {"path": f.path, "inode": f.ino}
        if self.envelope is not None:
            meta["envelope"] = self.envelope
        if f.salvage is not None:
            now = time.time()
            batch.extend([Shipped(now, self._cut(line), meta) for line in self._followed.salvage(f.path, f.salvage)])
            f.salvage = None
        budget = 16 * self.chunk_bytes
        emitted_bytes = 0
        eof = False
        while emitted_bytes < budget:
            data = os.pread(f.fd, self.chunk_bytes, f.pos)
            if not data:
                eof = True
                break
            f.pos += len(data)
            self.stats["bytes"] += len(data)
            emitted_bytes += self._split(f, data, batch, meta, time.time())
        if not eof:
            self.backlog = True
        finished = eof and (f.deleted or (f.rotated_at is not None
                                          and self._clock() - f.rotated_at >= self.rotate_wait))
        if finished and f.carry and not f.skipping:
            batch.append(Shipped(time.time(), self._cut(b"".join(f.carry)), meta))
            f.carry, f.carried = [], 0
        if not finished and len(f.fp) < FINGERPRINT_BYTES and f.offset > len(f.fp):
            f.fp = read_fingerprint(f.fd)
        mark = b"" if finished else mark_at(f.fd, f.offset)
        if isinstance(batch, ShippedBatch) and batch:
            batch.commit = self._prepare(f, finished, mark)
            batch.position = batch.commit.position if batch.commit is not None else None
        if batch and not self._deliver(batch):
            return 0
        self.stats["lines"] += len(batch)
        committed = isinstance(batch, ShippedBatch) and batch.committed
        if finished:
            self._followed.close(f)
            if not committed:
                self._offsets.forget(f.dev, f.ino)
            log.info("file tail %s: closed %s (%s)", self.name, f.path,
                     "deleted" if f.deleted else "rotated")
        elif committed:
            f.saved, f.mark = f.offset, mark
        else:
            self._followed.save(f, mark)
        return len(batch)

    def _prepare(self, f: TailedFile, finished: bool, mark: bytes) -> Commit | None:
        """The commit of ``f``'s offset after its batch (its entry dropped when ``finished``), for the ack."""
        try:
            if finished:
                return self._offsets.prepare(f.dev, f.ino, forget=True)
            return self._offsets.prepare(f.dev, f.ino, f.fp, f.offset, f.path, mark)
        except OSError as e:        # the batch still goes; its offset is saved after the ack
            self.stats["errors"] += 1
            log.warning("file tail %s: cannot prepare offsets in %s: %s", self.name, self._offsets.path, e)
            return None

    def _split(self, f: TailedFile, data: bytes, batch: list[Shipped], meta: dict[str, Any], now: float) -> int:
        """Cuts a chunk into complete lines appended to ``batch``; keeps the partial rest. Returns bytes emitted."""
        if f.skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return 0
            f.skipping = False
            data = data[nl + 1:]
        cut = data.rfind(b"\n")
        if cut < 0:
            if data:
                f.carry.append(data)
                f.carried += len(data)
            if f.carried <= self.max_line_bytes:
                return 0
            head = b"".join(f.carry)
            f.carry, f.carried, f.skipping = [], 0, True
            batch.append(Shipped(now, self._cut(head), meta))
            return self.max_line_bytes
        body = data[:cut]
        if f.carry:
            body = b"".join(f.carry) + body
        rest = data[cut + 1:]
        f.carry, f.carried = ([rest], len(rest)) if rest else ([], 0)
        lines = body.split(b"\n")
        if len(body) > self.max_line_bytes:
            lines = [self._cut(line) for line in lines]
        batch.extend([Shipped(now, line, meta) for line in lines])
        if f.carried > self.max_line_bytes:  # only when chunk_bytes > max_line_bytes
            f.carry, f.carried, f.skipping = [], 0, True
            batch.append(Shipped(now, self._cut(rest), meta))
        return len(body)

    def _cut(self, line: bytes) -> bytes:
        if len(line) <= self.max_line_bytes:
            return line
        self.stats["long_lines"] += 1
        return line[:self.max_line_bytes] + TRUNCATED_MARKER

    def _deliver(self, batch: list[Shipped]) -> bool:
        """Puts a batch (and waits for its ack with require_ack); False if stop() came first."""
        if not put_until_stopped(self._out, batch, self._stop):
            return False
        return not isinstance(batch, ShippedBatch) or batch.wait_acked(self._stop)

    def _flush_offsets(self) -> None:
        try:
            self._offsets.flush()
        except OSError as e:
            self.stats["errors"] += 1
            log.warning("file tail %s: cannot save offsets to %s: %s", self.name, self._offsets.path, e)
