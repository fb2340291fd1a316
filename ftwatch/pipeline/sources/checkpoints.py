"""Read offsets of tailed files, kept on disk so a restarted monitor resumes where it stopped (SPEC S2).

An offset is keyed by the file's identity, ``(st_dev, st_ino)``, not by its path: a rotated
file keeps its offset under its new name, and a new file at an old path starts afresh. Because
a file system reuses the inode number of a deleted file, each entry also keeps a *fingerprint*:
the file's first bytes (up to :data:`FINGERPRINT_BYTES`) as they were when the offset was saved.
A file whose first bytes no longer agree with the fingerprint is a different file (or one that was
truncated and rewritten) and gets no offset.

The file is JSON, rewritten whole on :meth:`OffsetStore.flush` with the atomic protocol
(write ``<path>.tmp``, fsync it, ``os.replace`` it over ``<path>``, fsync the directory): after a
crash at any point the file holds either the previous complete set of offsets or the new one.
A file that cannot be read as such (a disk error, a hand edit) is moved aside to
``<path>.corrupt`` and the store starts empty, with a logged warning; it never stops the monitor.

Committing with delivery (issue 17). :meth:`OffsetStore.prepare` writes the set of offsets as it
will be once one batch is delivered to ``<path>.next`` (fsync'd) *before* the batch is handed on;
the returned :class:`Commit` makes it current with one ``os.replace`` when the consumer
acknowledges the batch (``ShippedBatch.ack`` calls it), so the offset of delivered lines is on
disk the moment the consumer says they are handled, and never before.

That rename is a second write after the consumer's own (``ftwatch watch``: the store's
transaction holding the lines' findings and events), so a kill between the two would read the
batch again. To close that window every write of the file carries a sequence number (``seq``,
rising with every change), and the :class:`Commit` carries its set of offsets as a
:class:`~ftwatch.pipeline.sources.base.Position` (the store's :attr:`OffsetStore.key`, its seq,
the document): the consumer stores it in the same transaction as the lines' effects, and at the
next start :meth:`OffsetStore.adopt` takes it when it is newer than the file (killed before the
rename). Either the effects and their offsets are both stored or neither is.

An entry also keeps a *mark*: the (up to 64) bytes just before its offset. A copy of the file
(logrotate's ``copytruncate``) is recognised by agreeing with both the fingerprint and the mark,
so the tail can read what it had not read yet from the copy, and never read the copy twice.

The store creates its directory (``<state-dir>/offsets/``) and checks that it can write there
when it is made: a monitor that cannot keep offsets fails at start instead of warning at every
pass and losing its place at the next restart.

Use one store per tail source (as fluent-bit's in_tail wants one ``db`` per input).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ftwatch.pipeline.sources.base import Position

log = logging.getLogger(__name__)

FINGERPRINT_BYTES = 64  # how many of a file's first bytes identify it beside (dev, inode)
FORMAT_VERSION = 1


def read_fingerprint(fd: int) -> bytes:
    """Returns the first bytes (at most :data:`FINGERPRINT_BYTES`) of an open file, without moving its position.

    Raises:
        OSError: the read failed.
    """
    return os.pread(fd, FINGERPRINT_BYTES, 0)


def fingerprints_agree(a: bytes, b: bytes) -> bool:
    """Tells whether two fingerprints may come from the same file: the shorter is a prefix of the longer.

    A fingerprint taken while the file was shorter than :data:`FINGERPRINT_BYTES` is a prefix of
    one taken after it grew; an empty one (an empty file) agrees with anything.
    """
    return a.startswith(b) if len(a) >= len(b) else b.startswith(a)


@dataclass(frozen=True, slots=True)
class OffsetEntry:
    """One file's saved read position.

    Attributes:
        dev: ``st_dev`` of the file.
        ino: ``st_ino`` of the file.
        path: the last path it was seen at (for people and for pruning; not part of the key).
        fingerprint: its first bytes (at most 64) when the offset was saved.
        offset: bytes from the start of the file up to which every line has been delivered.
        mark: the bytes (at most 64) just before ``offset`` (b"" when unknown).
    """

    dev: int
    ino: int
    path: str
    fingerprint: bytes
    offset: int
    mark: bytes = b""


class Commit:
    """Makes a prepared set of offsets current (see :meth:`OffsetStore.prepare`); call it once.

    Calling returns True when the prepared file became the offsets file, False when it could
    not (the store changed since, or the rename failed: logged); then the caller records the
    change again and the next flush writes it.
    """

    __slots__ = ("_store", "_generation", "_entries", "_pending", "position")

    def __init__(self, store: "OffsetStore", generation: int, entries: dict, pending: Path, document: bytes):
        self._store, self._generation, self._entries, self._pending = store, generation, entries, pending
        self.position = Position(store.key, generation, document)   # stored with the batch's effects

    def __call__(self) -> bool:
        return self._store._commit(self)


class OffsetStore:
    """Offsets of tailed files keyed by (device, inode), loaded at construction, saved atomically by :meth:`flush`.

    Thread-safe: every method takes one lock.

    Args:
        path: the JSON file; its directory is created when missing. A missing file means no
            offsets yet.

    Attributes:
        key: ``offsets/<file name>``: names this store's :class:`Position` s in the consumer's store.

    Raises:
        OSError: the directory cannot be created or written (the message names it).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, int], OffsetEntry] = {}
        self._dirty = False
        self._generation = 0       # bumped by every change: a prepared Commit is only valid for its own;
                                   # written as the file's seq, loaded from it (rises across restarts)
        self.key = f"offsets/{self.path.name}"
        _writable_dir(self.path.parent)
        self._load()

    # -- reading and changing -------------------------------------------------------------------------

    def get(self, dev: int, ino: int, fingerprint: bytes) -> int | None:
        """Returns the saved offset of a file, or None when there is none or the fingerprint disagrees.

        Args:
            dev: the file's ``st_dev``.
            ino: the file's ``st_ino``.
            fingerprint: its first bytes now (at most 64), see :func:`read_fingerprint`.

        Returns:
            Offset in bytes, or None (unknown file, or a reused inode / rewritten file).
        """
        with self._lock:
            entry = self._entries.get((dev, ino))
        if entry is None or not fingerprints_agree(entry.fingerprint, fingerprint):
            return None
        return entry.offset

    def set(self, dev: int, ino: int, fingerprint: bytes, offset: int, path: str, mark: bytes = b"") -> None:
        """Records a file's offset in memory; :meth:`flush` makes it durable.

        Args:
            dev: the file's ``st_dev``.
            ino: the file's ``st_ino``.
            fingerprint: its first bytes (at most 64; longer input is cut).
            offset: bytes delivered from the start of the file, ``>= 0``.
            path: where the file is now.
            mark: the bytes just before ``offset`` (at most 64 kept).

        Raises:
            ValueError: a negative offset.
        """
        entry = _entry(dev, ino, fingerprint, offset, path, mark)
        with self._lock:
            if self._entries.get((dev, ino)) != entry:
                self._entries[(dev, ino)] = entry
                self._dirty = True
                self._generation += 1

    def forget(self, dev: int, ino: int) -> None:
        """Drops a file's entry (it was deleted or finished after rotation); a no-op if absent."""
        with self._lock:
            if self._entries.pop((dev, ino), None) is not None:
                self._dirty = True
                self._generation += 1

    def entries(self) -> list[OffsetEntry]:
        """Returns a snapshot of every entry, in no particular order."""
        with self._lock:
            return list(self._entries.values())

    def entry(self, dev: int, ino: int) -> OffsetEntry | None:
        """Returns the entry of a file, or None."""
        with self._lock:
            return self._entries.get((dev, ino))

    # -- committing with delivery ---------------------------------------------------------------------

    def prepare(self, dev: int, ino: int, fingerprint: bytes = b"", offset: int = 0, path: str = "",
                mark: bytes = b"", *, forget: bool = False) -> Commit:
        """Writes the offsets as they will be after one change to ``<path>.next`` (fsync'd), not yet current.

        The caller hands its batch on and, once it is delivered, calls the returned
        :class:`Commit`: one ``os.replace`` (and a directory fsync) makes the prepared file the
        offsets file and the change the store's. Any other change (``set``, ``forget``,
        ``flush``, another prepare) in between makes the Commit refuse.

        Args:
            dev, ino, fingerprint, offset, path, mark: the file's entry after delivery (as :meth:`set`).
            forget: the change drops the file's entry instead (it was read to its end and closed).

        Raises:
            OSError: the prepared file could not be written.
            ValueError: a negative offset.
        """
        with self._lock:
            entries = dict(self._entries)
            if forget:
                entries.pop((dev, ino), None)
            else:
                entries[(dev, ino)] = _entry(dev, ino, fingerprint, offset, path, mark)
            self._generation += 1
            pending = self.path.with_name(self.path.name + ".next")
            document = _dump(entries.values(), self._generation)
            _write_file(pending, document)
            return Commit(self, self._generation, entries, pending, document)

    def _commit(self, commit: Commit) -> bool:
        with self._lock:
            if commit._generation != self._generation:
                return False
            try:
                os.replace(commit._pending, self.path)
            except OSError as e:
                log.warning("cannot commit offsets to %s: %s", self.path, e)
                return False
            self._entries = commit._entries
            self._dirty = False
            self._generation += 1
        _fsync_dir(self.path.parent)
        return True

    # -- disk -----------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Writes every entry to disk atomically if anything changed since the last flush.

        Raises:
            OSError: the file could not be written; the previous file is intact and the entries
                stay dirty, so the next flush tries again.
        """
        with self._lock:
            if not self._dirty:
                return
            self._generation += 1
            _write_atomically(self.path, _dump(self._entries.values(), self._generation))
            self._dirty = False

    def adopt(self, position: Position | None) -> bool:
        """At start, before the store is used: take the offsets the consumer stored with its last
        batch's effects when they are newer than the file (the process died between its store's
        commit and the rename of :class:`Commit`); they are written to the file at once.

        Args:
            position: what the consumer's store holds under :attr:`key` (None: nothing).

        Returns:
            True when the position was newer and taken; False when the file is as new or newer,
            or the position cannot be read (logged: the file's offsets stay).

        Raises:
            OSError: the file could not be written.
        """
        if position is None:
            return False
        with self._lock:
            if position.seq <= self._generation:
                return False
            try:
                entries, seq = _parse(position.document)
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                log.warning("offsets stored with the last batch of %s are unreadable (%s); keeping %s",
                            position.key, e, self.path)
                return False
            _write_atomically(self.path, _dump(entries.values(), seq))
            log.info("offsets of %s taken from the store: committed with the last stored batch (seq %d, "
                     "the file had %d)", self.path, seq, self._generation)
            self._entries, self._generation, self._dirty = entries, seq, False
            return True

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("offsets file %s unreadable (%s); starting with no offsets", self.path, e)
            return
        try:
            self._entries, self._generation = _parse(raw)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            corrupt = self.path.with_name(self.path.name + ".corrupt")
            try:
                os.replace(self.path, corrupt)
            except OSError:
                corrupt = self.path
            log.warning("offsets file %s is corrupt (%s); kept as %s, starting with no offsets",
                        self.path, e, corrupt)
            self._entries = {}


def _entry(dev: int, ino: int, fingerprint: bytes, offset: int, path: str, mark: bytes) -> OffsetEntry:
    if offset < 0:
        raise ValueError(f"negative offset {offset} for {path}")
    return OffsetEntry(dev, ino, str(path), bytes(fingerprint[:FINGERPRINT_BYTES]), offset,
                       bytes(mark[-FINGERPRINT_BYTES:]) if mark else b"")


def _dump(entries, seq: int) -> bytes:
    doc = {"version": FORMAT_VERSION, "seq": seq, "files": [
        {"dev": e.dev, "ino": e.ino, "path": e.path, "fingerprint": e.fingerprint.hex(),
         "offset": e.offset, **({"mark": e.mark.hex()} if e.mark else {})} for e in entries]}
    return json.dumps(doc, separators=(",", ":")).encode()


def _writable_dir(directory: Path) -> None:
    """Creates ``directory`` (and its parents) if missing and checks it can hold new files.

    Raises:
        OSError: it cannot be created, is not a directory, or is not writable.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot create the offsets directory {directory}: {e.strerror or e}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OSError(13, f"cannot write in the offsets directory {directory}")


def _parse(raw: bytes) -> tuple[dict[tuple[int, int], OffsetEntry], int]:
    """Parses the JSON document into (entries, seq; 0 when absent, as written before issue 17).
    Raises ValueError/TypeError/KeyError on anything malformed."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("files"), list):
        raise ValueError(f"not an ftwatch offsets file (version {FORMAT_VERSION})")
    seq = doc.get("seq", 0)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise ValueError(f"bad seq {seq!r}")
    entries: dict[tuple[int, int], OffsetEntry] = {}
    for item in doc["files"]:
        dev, ino, offset, path = item["dev"], item["ino"], item["offset"], item["path"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (dev, ino, offset)) or offset < 0:
            raise ValueError(f"bad entry {item!r}")
        if not isinstance(path, str):
            raise ValueError(f"bad path in {item!r}")
        fp = bytes.fromhex(item["fingerprint"])
        mark = bytes.fromhex(item.get("mark", ""))
        entries[(dev, ino)] = OffsetEntry(dev, ino, path, fp[:FINGERPRINT_BYTES], offset, mark[-FINGERPRINT_BYTES:])
    return entries, seq


def _write_atomically(path: Path, data: bytes) -> None:
    """Replaces ``path`` with ``data``: tmp file, fsync, ``os.replace``, directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    _write_file(tmp, data)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write_file(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` (created or truncated) and fsyncs it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    """Makes a rename in ``directory`` durable where the platform can open a directory."""
    try:
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # some platforms cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
