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
  end; a followed file truncated while down is salvaged from its copy as above.
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

Size: over 400 lines because one pass (scan, reconcile, open, pump, deliver) works on one table
of followed files under one lock; what needs none of that state lives beside it: one file's
position (``tailed``), where its lines went after a rotation (``rotated``), the offsets on disk
(``checkpoints``).
"""

from __future__ import annotations

import glob as globmod
import logging
import os
import queue
import stat
import threading
import time
from typing import Any, Callable

from ftwatch.pipeline.sources.base import Shipped, ShippedBatch, put_until_stopped
from ftwatch.pipeline.sources.checkpoints import (
    FINGERPRINT_BYTES, Commit, OffsetEntry, OffsetStore, read_fingerprint,
)
from ftwatch.pipeline.sources.rotated import (
    Known, is_copy, known_of, mark_at, open_moved, salvage, truncated_at,
)
from ftwatch.pipeline.sources.tailed import TailedFile, tail_start

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
        self._files: dict[tuple[int, int], TailedFile] = {}
        self._scanned = False
        self._failed: set[str] = set()  # paths whose open failed (logged once)
        self._known_paths = {e.path for e in offsets.entries()}  # paths followed by the last run
        self._copies: set[tuple[int, int]] = set()  # followed files opened as copies (from their end)
        self._truncated_while_down: list[Known] | None = None   # at the first scan, see _copy_of
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
            for f in self._files.values():
                os.close(f.fd)
            self._files.clear()
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
            first = not self._scanned
            self._reconcile(self._scan(), first)
            if first:
                for e in self._offsets.entries():
                    if (e.dev, e.ino) not in self._files and not self._resume_moved(e):
                        self._offsets.forget(e.dev, e.ino)
                self._scanned = True
            self._flush_offsets()  # where new files start, before any wait on the queue
            emitted = 0
            for f in list(self._files.values()):
                if self._stop.is_set():
                    break
                try:
                    emitted += self._pump(f)
                except OSError as e:
                    self.stats["errors"] += 1
                    log.warning("file tail %s: reading %s failed: %s", self.name, f.path, e)
            self._flush_offsets()
            self.stats["files"] = len(self._files)
            return emitted

    def _scan(self) -> dict[str, tuple[int, int]]:
        """Returns {path: (dev, ino)} of the regular files the globs match now."""
        found: dict[str, tuple[int, int]] = {}
        for pattern in self.globs:
            for path in sorted(globmod.glob(pattern, recursive=True)):
                if path in found:
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found[path] = (st.st_dev, st.st_ino)
        return found

    def _reconcile(self, found: dict[str, tuple[int, int]], first: bool) -> None:
        """Notices files that left their path (rotated, deleted) and opens files not followed yet."""
        by_key: dict[tuple[int, int], str] = {}
        for path, key in found.items():
            by_key.setdefault(key, path)
        for key, f in self._files.items():
            if f.rotated_at is not None or f.deleted or found.get(f.path) == key:
                continue
            if key in by_key:  # renamed to another matching name: follow it there
                f.path = by_key[key]
                continue
            try:
                nlink = os.fstat(f.fd).st_nlink
            except OSError:
                nlink = 0
            if nlink:
                f.rotated_at = self._clock()
                self.stats["rotations"] += 1
                log.info("file tail %s: %s rotated; reading the old file for %.1fs more",
                         self.name, f.path, self.rotate_wait)
            else:
                f.deleted = True
                if f.path in found:
                    self.stats["rotations"] += 1
        for key, path in by_key.items():
            if key not in self._files:
                self._open(path, key, first)

    def _open(self, path: str, key: tuple[int, int], first: bool) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            if path not in self._failed:
                self._failed.add(path)
                self.stats["errors"] += 1
                log.warning("file tail %s: cannot open %s: %s", self.name, path, e)
            return
        self._failed.discard(path)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)  # the path may have been rotated since the stat
            if key in self._files:
                os.close(fd)
                return
            fp = read_fingerprint(fd)
            saved = self._offsets.get(st.st_dev, st.st_ino, fp)
            entry = self._offsets.entry(st.st_dev, st.st_ino)
            salvage_from = None
            copy = False
            if entry is not None and entry.path == path and (saved is None or saved > st.st_size):
                self.stats["truncations"] += 1     # truncated (copytruncate) or rewritten while down
                salvage_from = Known(key, entry.fingerprint, entry.offset, entry.mark)
                pos = 0
            elif saved is not None and saved > st.st_size:
                self.stats["truncations"] += 1
                pos = 0
            elif saved is not None:
                pos = saved
            elif self._copy_of(fd, st.st_size, key, first):
                pos, copy = st.st_size, True       # a copy of what was delivered: never read again
            elif first and not self.read_from_head and path not in self._known_paths:
                pos = tail_start(fd, st.st_size, self.chunk_bytes)
            else:
                pos = 0
        except OSError as e:
            os.close(fd)
            self.stats["errors"] += 1
            log.warning("file tail %s: cannot read %s: %s", self.name, path, e)
            return
        f = TailedFile(st.st_dev, st.st_ino, path, fd, pos, fp)
        f.salvage = salvage_from                   # read in its first pump, once every copy is known
        self._files[key] = f
        if copy:
            self._copies.add(key)
        if salvage_from is None:   # a restart before the first line must resume here, not skip to the end
            self._save(f)          # (a salvage keeps the old entry until its lines are delivered: a
                                   #  restart before then salvages them again)
        log.info("file tail %s: following %s from offset %d", self.name, path, pos)

    def _resume_moved(self, e: OffsetEntry) -> bool:
        """Follows a saved file that the first scan did not find, if it was rotated beside its path.

        Returns:
            True when it was found by its inode (it is read on from its offset, as a rotated
            file); False when it is gone or no longer the saved content.
        """
        found = open_moved(known_of(e), e.path)
        if found is None:
            return False
        moved, fd, fp = found
        f = TailedFile(e.dev, e.ino, e.path, fd, e.offset, fp)   # its lines keep the path they had
        f.saved, f.mark = e.offset, e.mark
        f.rotated_at = self._clock()
        self._files[(e.dev, e.ino)] = f
        self.stats["rotations"] += 1
        log.info("file tail %s: %s was rotated to %s while ftwatch was down; reading it on from offset %d",
                 self.name, e.path, moved, e.offset)
        return True

    def _copy_of(self, fd: int, size: int, key: tuple[int, int], first: bool) -> bool:
        """Whether a newly found file is a copy, up to its delivered offset, of a followed file
        that was truncated (or, at the first scan, of a saved one truncated while ftwatch was down).

        Only a truncated original counts: a sibling that begins with the same bytes as a followed
        file (a common banner) is no copy and is read like any new file.
        """
        known = [Known((f.dev, f.ino), f.fp, f.saved, f.mark) for f in self._files.values()
                 if f.salvage is not None or self._truncated(f)]
        if first:
            if self._truncated_while_down is None:
                self._truncated_while_down = [known_of(e) for e in self._offsets.entries()
                                              if truncated_at(known_of(e), e.path)]
            known += self._truncated_while_down
        return any(is_copy(fd, size, key, k) for k in known)

    def _truncated(self, f: TailedFile) -> bool:
        """Whether a followed file is shorter than the read position or no longer begins as it did."""
        try:
            st = os.fstat(f.fd)
            return st.st_size < f.pos or (st.st_size != f.size_seen and not self._same_start(f))
        except OSError:
            return False

    def _salvage(self, path: str, known: Known) -> list[bytes]:
        """The lines after ``known.offset`` read from a copy of the truncated file ``path`` (never
        from a file followed in its own right)."""
        def followed(key: tuple[int, int]) -> bool:
            return key in self._files and key not in self._copies
        lines, copy = salvage(os.path.dirname(path), known, followed)
        if copy is not None:
            self.stats["salvaged"] += len(lines)
            log.info("file tail %s: %s was truncated; %d unread lines taken from its copy %s",
                     self.name, path, len(lines), copy)
        return lines

    def _pump(self, f: TailedFile) -> int:
        """Reads one file's growth, delivers its batch, saves its offset. Returns lines emitted."""
        st = os.fstat(f.fd)
        if self._truncated(f):
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
            batch.extend([Shipped(now, self._cut(line), meta) for line in self._salvage(f.path, f.salvage)])
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
            os.close(f.fd)
            del self._files[(f.dev, f.ino)]
            self._copies.discard((f.dev, f.ino))
            if not committed:
                self._offsets.forget(f.dev, f.ino)
            log.info("file tail %s: closed %s (%s)", self.name, f.path,
                     "deleted" if f.deleted else "rotated")
        elif committed:
            f.saved, f.mark = f.offset, mark
        else:
            self._save(f, mark)
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

    def _same_start(self, f: TailedFile) -> bool:
        """Whether the file still begins with the bytes it began with (else it was truncated and rewritten)."""
        return not f.fp or os.pread(f.fd, len(f.fp), 0) == f.fp

    def _deliver(self, batch: list[Shipped]) -> bool:
        """Puts a batch (and waits for its ack with require_ack); False if stop() came first."""
        if not put_until_stopped(self._out, batch, self._stop):
            return False
        return not isinstance(batch, ShippedBatch) or batch.wait_acked(self._stop)

    def _save(self, f: TailedFile, mark: bytes | None = None) -> None:
        if f.offset != f.saved:
            f.mark = mark_at(f.fd, f.offset) if mark is None else mark
            self._offsets.set(f.dev, f.ino, f.fp, f.offset, f.path, f.mark)
            f.saved = f.offset

    def _flush_offsets(self) -> None:
        try:
            self._offsets.flush()
        except OSError as e:
            self.stats["errors"] += 1
            log.warning("file tail %s: cannot save offsets to %s: %s", self.name, self._offsets.path, e)
