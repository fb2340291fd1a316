"""Where a followed file's unread lines went when it left its path: its new name, or its copy.

Used by the file tail (:mod:`ftwatch.pipeline.sources.followed`) so that rotation loses nothing and reads
nothing twice, also across a restart (issue 17):

- **Rename rotation** keeps the inode: :func:`find_inode` looks for it in the directory it was
  followed in (``app.log`` -> ``app.log.1``, ``0.log`` -> ``0.log.20260101-120000``), so a file
  rotated while ftwatch was down, or inside its ``rotate_wait`` when ftwatch was killed, is
  read on from its saved offset; one found with other content (copytruncated, then renamed, all
  while ftwatch was down) is read from its head after salvaging from its copy, when
  :func:`find_copy` finds one (without a copy its inode is taken as reused, and not followed).
- **copytruncate** makes a new inode with the old content and empties the followed one.
  :class:`Known` is what a followed file's content looked like at its delivered offset (its
  first bytes and the bytes just before the offset); :func:`is_copy` tells whether another file
  holds that same content up to there (so it is followed from its end, never read again), and
  :func:`salvage` reads from such a copy the lines after the offset that the tail had not read
  before the truncation.

A copy is only recognised when both the first bytes (up to 64) and the 64 bytes before the
offset agree, the copy is in the same directory, and the original was truncated (a sibling
that merely begins like it, the same banner, is never taken for a copy; the tail also never
salvages from a file it follows in its own right). Lines written between logrotate's copy and
its truncate are in neither file (fluent-bit documents the same window); rename rotation has no
such window. Nor can a copy be recognised of content ftwatch never delivered: when ftwatch is
down from before a file's first line was delivered until after that file was copied and
truncated (two rotations within one downtime, the second a copytruncate), its lines are lost;
when the tail sees the copy before the truncation (logrotate's own microseconds between the
two), the copy is read as a new file (its lines twice).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from typing import Callable

from ftwatch.pipeline.sources.checkpoints import (
    FINGERPRINT_BYTES, OffsetEntry, fingerprints_agree, read_fingerprint,
)

log = logging.getLogger(__name__)

READ_BYTES = 1024 * 1024   # salvage reads in pieces of this many bytes


@dataclass(frozen=True, slots=True)
class Known:
    """A file's content as far as it was delivered.

    Attributes:
        key: its ``(st_dev, st_ino)`` (a copy is another file).
        fingerprint: its first bytes (at most 64).
        offset: bytes delivered.
        mark: the bytes (at most 64) just before ``offset``.
    """

    key: tuple[int, int]
    fingerprint: bytes
    offset: int
    mark: bytes

    @property
    def comparable(self) -> bool:
        """Whether there is enough to recognise a copy by (something delivered, both byte strings)."""
        return self.offset > 0 and bool(self.fingerprint) and bool(self.mark)


def known_of(e: OffsetEntry) -> Known:
    """A saved entry as :class:`Known`."""
    return Known((e.dev, e.ino), e.fingerprint, e.offset, e.mark)


def truncated_at(known: Known, path: str) -> bool:
    """Whether the saved file, still at ``path`` or renamed beside it since, is shorter than its
    offset or begins otherwise."""
    try:
        st = os.stat(path)
        here: str | None = path if (st.st_dev, st.st_ino) == known.key else None
    except OSError:
        here = None
    here = here or find_inode(os.path.dirname(path), *known.key)
    if here is None:
        return False
    try:
        fd = os.open(here, os.O_RDONLY)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino) == known.key and (
            st.st_size < known.offset or not fingerprints_agree(read_fingerprint(fd), known.fingerprint))
    except OSError:
        return False
    finally:
        os.close(fd)


def open_moved(known: Known, path: str) -> tuple[str, int, bytes, bool] | None:
    """Opens a saved file that left ``path`` but is still beside it (rename rotation).

    Returns:
        (its path now, an open read-only descriptor, its fingerprint, rewritten), or None when
        it is gone. ``rewritten``: it is shorter than its offset or no longer begins as it did
        (truncated, then renamed; or its inode was reused): the caller decides, see
        :func:`find_copy`, and closes the descriptor if it does not follow it.
    """
    moved = find_inode(os.path.dirname(path), *known.key)
    if moved is None:
        return None
    try:
        fd = os.open(moved, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        fp = read_fingerprint(fd)
        if (st.st_dev, st.st_ino) == known.key:
            return moved, fd, fp, st.st_size < known.offset or not fingerprints_agree(fp, known.fingerprint)
    except OSError:
        pass
    os.close(fd)
    return None


def mark_at(fd: int, offset: int) -> bytes:
    """The bytes (at most 64) just before ``offset`` of an open file.

    Raises:
        OSError: the read failed.
    """
    n = min(FINGERPRINT_BYTES, offset)
    return os.pread(fd, n, offset - n) if n else b""


def is_copy(fd: int, size: int, key: tuple[int, int], known: Known) -> bool:
    """Whether the open file ``fd`` (``size`` bytes, identity ``key``) holds ``known``'s content up to its offset.

    Raises:
        OSError: a read failed.
    """
    if key == known.key or not known.comparable or size < known.offset:
        return False
    return (read_fingerprint(fd).startswith(known.fingerprint)
            and os.pread(fd, len(known.mark), known.offset - len(known.mark)) == known.mark)


def find_inode(directory: str, dev: int, ino: int) -> str | None:
    """The path in ``directory`` of the regular file with identity ``(dev, ino)``, or None."""
    try:
        entries = list(os.scandir(directory or "."))
    except OSError:
        return None
    for entry in entries:
        try:
            if entry.inode() != ino:
                continue
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_dev == dev and stat.S_ISREG(st.st_mode):
            return entry.path
    return None


def salvage(directory: str, known: Known, skip: Callable[[tuple[int, int]], bool] = lambda key: False,
            ) -> tuple[list[bytes], str | None]:
    """Reads the lines after ``known.offset`` from the newest copy of the file in ``directory``.

    Args:
        directory: where the followed file is (logrotate copies beside it).
        known: the followed file as it was before it was truncated.
        skip: keys ``(st_dev, st_ino)`` that are no copy whatever their content (files followed
            in their own right: a sibling log that begins with the same banner).

    Returns:
        (lines, copy path): the copy's complete lines after the offset, and its last partial
        line (a copy ends there); ``([], None)`` when no copy is found.
    """
    copy = find_copy(directory, known, skip)
    if copy is None:
        return [], None
    try:
        data = _read_from(copy, known.offset)
    except OSError as e:
        log.warning("cannot read the copy %s: %s", copy, e)
        return [], None
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines, copy


def find_copy(directory: str, known: Known, skip: Callable[[tuple[int, int]], bool] = lambda key: False,
              ) -> str | None:
    """The path of the newest copy of ``known``'s content in ``directory`` (``skip``: as in
    :func:`salvage`), or None. A copy is also the evidence that the original was truncated
    (copytruncate): a saved file found by its inode with other content is read from its head
    only when one exists (``ftwatch.pipeline.sources.followed``)."""
    if not known.comparable:
        return None
    best: tuple[int, str] | None = None
    try:
        entries = list(os.scandir(directory or "."))
    except OSError:
        return None
    for entry in entries:
        try:
            st = entry.stat()
            if not stat.S_ISREG(st.st_mode) or st.st_size < known.offset or skip((st.st_dev, st.st_ino)):
                continue
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            continue
        try:
            if is_copy(fd, st.st_size, (st.st_dev, st.st_ino), known) and (best is None or st.st_mtime_ns > best[0]):
                best = (st.st_mtime_ns, entry.path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return None if best is None else best[1]


def _read_from(path: str, offset: int) -> bytes:
    parts = []
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while True:
            piece = f.read(READ_BYTES)
            if not piece:
                return b"".join(parts)
            parts.append(piece)
