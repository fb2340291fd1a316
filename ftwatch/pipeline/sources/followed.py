"""The table of files a file tail follows (SPEC S2): found by glob, known by (device, inode), each
opened where its reading starts, and noticed when it leaves its path, is truncated or is a copy.

:class:`FollowedFiles` is the discovery half of :class:`~ftwatch.pipeline.sources.file_tail.FileTailSource`
(whose module docstring states the rules: "Start", "Rename rotation", "copytruncate / truncation",
"Rotated while down"). :meth:`~FollowedFiles.update` re-globs, marks followed files that left
their path as rotated (read on for ``rotate_wait``) or deleted, and opens new ones at their start
offset: a saved offset, the head, just after the last newline, or the end of a copy of what was
delivered. The tail's pass then reads each file (:meth:`~FollowedFiles.truncated`,
:meth:`~FollowedFiles.salvage`) and closes the finished ones (:meth:`~FollowedFiles.close`).
Where a file's lines went after a rotation is :mod:`ftwatch.pipeline.sources.rotated`; one file's
read position is :mod:`ftwatch.pipeline.sources.tailed`; the offsets on disk are
:mod:`ftwatch.pipeline.sources.checkpoints`.
"""

from __future__ import annotations

import glob as globmod
import logging
import os
import stat
from typing import Callable

from ftwatch.pipeline.sources.checkpoints import OffsetEntry, OffsetStore, read_fingerprint
from ftwatch.pipeline.sources.rotated import (
    Known, find_copy, is_copy, known_of, mark_at, open_moved, salvage, truncated_at,
)
from ftwatch.pipeline.sources.tailed import TailedFile, tail_start

log = logging.getLogger(__name__)


class FollowedFiles:
    """The files one tail follows, by ``(st_dev, st_ino)``, and where each one's reading starts.

    Args:
        offsets: the tail's offsets store (saved offsets are read at open; a new file's start is
            saved at once).
        stats: the tail's counters; this table adds to ``rotations``, ``truncations``,
            ``salvaged`` and ``errors``.
        clock: monotonic seconds (when a file left its path).
        name: the tail's name, for logs.
        read_from_head: files found by the first scan without a saved offset are read from their
            head, not their end.
        rotate_wait: seconds a rotated file is still read after it left its path (logged only here;
            the tail closes it).
        chunk_bytes: how far back from the end a file read "from its end" looks for a newline.

    Attributes:
        files: ``(st_dev, st_ino)`` -> the followed file; the tail reads and closes them.
    """

    def __init__(self, offsets: OffsetStore, stats: dict[str, int], clock: Callable[[], float], *,
                 name: str, read_from_head: bool, rotate_wait: float, chunk_bytes: int):
        self.files: dict[tuple[int, int], TailedFile] = {}
        self._offsets = offsets
        self._stats = stats
        self._clock = clock
        self._name = name
        self._read_from_head = read_from_head
        self._rotate_wait = rotate_wait
        self._chunk_bytes = chunk_bytes
        self._scanned = False
        self._failed: set[str] = set()  # paths whose open failed (logged once)
        self._known_paths = {e.path for e in offsets.entries()}  # paths followed by the last run
        self._copies: set[tuple[int, int]] = set()  # followed files opened as copies (from their end)
        self._truncated_while_down: list[Known] | None = None   # at the first scan, see _copy_of

    def update(self, globs: list[str]) -> None:
        """Re-globs, notices files that left their path, opens new ones; the first call also follows
        saved files rotated beside their path while ftwatch was down, and forgets the saved files gone."""
        first = not self._scanned
        self._reconcile(self._scan(globs), first)
        if first:
            for e in self._offsets.entries():
                if (e.dev, e.ino) not in self.files and not self._resume_moved(e):
                    self._offsets.forget(e.dev, e.ino)
            self._scanned = True

    def close(self, f: TailedFile) -> None:
        """Closes a finished file (read to its end after a rotation or deletion) and drops it."""
        os.close(f.fd)
        del self.files[(f.dev, f.ino)]
        self._copies.discard((f.dev, f.ino))

    def close_all(self) -> None:
        """Closes every followed file (the tail stops)."""
        for f in self.files.values():
            os.close(f.fd)
        self.files.clear()

    def save(self, f: TailedFile, mark: bytes | None = None) -> None:
        """Hands ``f``'s delivered offset to the offsets store, if it moved (``mark``: the bytes
        before it, read from the file when None)."""
        if f.offset != f.saved:
            f.mark = mark_at(f.fd, f.offset) if mark is None else mark
            self._offsets.set(f.dev, f.ino, f.fp, f.offset, f.path, f.mark)
            f.saved = f.offset

    def _scan(self, globs: list[str]) -> dict[str, tuple[int, int]]:
        """Returns {path: (dev, ino)} of the regular files the globs match now."""
        found: dict[str, tuple[int, int]] = {}
        for pattern in globs:
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
        for key, f in self.files.items():
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
                self._stats["rotations"] += 1
                log.info("file tail %s: %s rotated; reading the old file for %.1fs more",
                         self._name, f.path, self._rotate_wait)
            else:
                f.deleted = True
                if f.path in found:
                    self._stats["rotations"] += 1
        for key, path in by_key.items():
            if key not in self.files:
                self._open(path, key, first)

    def _open(self, path: str, key: tuple[int, int], first: bool) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            if path not in self._failed:
                self._failed.add(path)
                self._stats["errors"] += 1
                log.warning("file tail %s: cannot open %s: %s", self._name, path, e)
            return
        self._failed.discard(path)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)  # the path may have been rotated since the stat
            if key in self.files:
                os.close(fd)
                return
            fp = read_fingerprint(fd)
            saved = self._offsets.get(st.st_dev, st.st_ino, fp)
            entry = self._offsets.entry(st.st_dev, st.st_ino)
            salvage_from = None
            copy = False
            if entry is not None and (saved is None or saved > st.st_size) and (
                    entry.path == path or find_copy(os.path.dirname(path), known_of(entry),
                                                    self._followed_in_own_right) is not None):
                self._stats["truncations"] += 1     # truncated (copytruncate) or rewritten while down,
                salvage_from = known_of(entry)      # perhaps then renamed to another matching name
                pos = 0
            elif saved is not None and saved > st.st_size:
                self._stats["truncations"] += 1
                pos = 0
            elif saved is not None:
                pos = saved
            elif self._copy_of(fd, st.st_size, key, first):
                pos, copy = st.st_size, True       # a copy of what was delivered: never read again
            elif first and not self._read_from_head and path not in self._known_paths:
                pos = tail_start(fd, st.st_size, self._chunk_bytes)
            else:
                pos = 0
        except OSError as e:
            os.close(fd)
            self._stats["errors"] += 1
            log.warning("file tail %s: cannot read %s: %s", self._name, path, e)
            return
        f = TailedFile(st.st_dev, st.st_ino, path, fd, pos, fp)
        f.salvage = salvage_from                   # read in its first pump, once every copy is known
        self.files[key] = f
        if copy:
            self._copies.add(key)
        if salvage_from is None:   # a restart before the first line must resume here, not skip to the end
            self.save(f)           # (a salvage keeps the old entry until its lines are delivered: a
                                   #  restart before then salvages them again)
        log.info("file tail %s: following %s from offset %d", self._name, path, pos)

    def _resume_moved(self, e: OffsetEntry) -> bool:
        """Follows a saved file that the first scan did not find, if it was rotated beside its path.

        A file found by its inode but shorter than its offset or beginning otherwise was truncated
        (copytruncate) and then renamed while ftwatch was down: when a copy of its delivered
        content is beside it, the unread lines are salvaged from the copy and the file is read
        from its head (else its inode was reused by another file, which is not followed).

        Returns:
            True when it was found by its inode (it is read on as a rotated file); False when it
            is gone or no longer the saved content.
        """
        known = known_of(e)
        found = open_moved(known, e.path)
        if found is None:
            return False
        moved, fd, fp, rewritten = found
        if rewritten and find_copy(os.path.dirname(e.path), known, self._followed_in_own_right) is None:
            os.close(fd)
            return False
        f = TailedFile(e.dev, e.ino, e.path, fd, 0 if rewritten else e.offset, fp)  # lines keep their path
        if rewritten:
            f.salvage = known               # read in its first pump; the entry stays until then
        else:
            f.saved, f.mark = e.offset, e.mark
        f.rotated_at = self._clock()
        self.files[(e.dev, e.ino)] = f
        self._stats["rotations"] += 1
        if rewritten:
            self._stats["truncations"] += 1
            log.info("file tail %s: %s was truncated and rotated to %s while ftwatch was down; reading "
                     "it from its head after the lines of its copy", self._name, e.path, moved)
        else:
            log.info("file tail %s: %s was rotated to %s while ftwatch was down; reading it on from "
                     "offset %d", self._name, e.path, moved, e.offset)
        return True

    def _copy_of(self, fd: int, size: int, key: tuple[int, int], first: bool) -> bool:
        """Whether a newly found file is a copy, up to its delivered offset, of a followed file
        that was truncated (or, at the first scan, of a saved one truncated while ftwatch was down).

        Only a truncated original counts: a sibling that begins with the same bytes as a followed
        file (a common banner) is no copy and is read like any new file.
        """
        known = [f.salvage or Known((f.dev, f.ino), f.fp, f.saved, f.mark) for f in self.files.values()
                 if f.salvage is not None or self.truncated(f)]
        if first:
            if self._truncated_while_down is None:
                self._truncated_while_down = [known_of(e) for e in self._offsets.entries()
                                              if truncated_at(known_of(e), e.path)]
            known += self._truncated_while_down
        return any(is_copy(fd, size, key, k) for k in known)

    def truncated(self, f: TailedFile) -> bool:
        """Whether a followed file is shorter than the read position or no longer begins as it did."""
        try:
            st = os.fstat(f.fd)
            return st.st_size < f.pos or (st.st_size != f.size_seen and not _same_start(f))
        except OSError:
            return False

    def salvage(self, path: str, known: Known) -> list[bytes]:
        """The lines after ``known.offset`` read from a copy of the truncated file ``path`` (never
        from a file followed in its own right)."""
        lines, copy = salvage(os.path.dirname(path), known, self._followed_in_own_right)
        if copy is not None:
            self._stats["salvaged"] += len(lines)
            log.info("file tail %s: %s was truncated; %d unread lines taken from its copy %s",
                     self._name, path, len(lines), copy)
        return lines

    def _followed_in_own_right(self, key: tuple[int, int]) -> bool:
        """Whether ``key`` is a followed file that is no copy (never salvaged from)."""
        return key in self.files and key not in self._copies


def _same_start(f: TailedFile) -> bool:
    """Whether the file still begins with the bytes it began with (else it was truncated and rewritten)."""
    return not f.fp or os.pread(f.fd, len(f.fp), 0) == f.fp
