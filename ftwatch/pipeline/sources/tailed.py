"""One followed file of a file tail (:class:`TailedFile`: its inode, descriptor and read
position) and where reading a file "from its end" starts (:func:`tail_start`). Used by
:mod:`ftwatch.pipeline.sources.file_tail` and its table of files, :mod:`ftwatch.pipeline.sources.followed`."""

from __future__ import annotations

import os


class TailedFile:
    """One followed file (one inode) and where reading stands."""

    __slots__ = ("dev", "ino", "path", "fd", "pos", "carry", "carried", "skipping", "fp",
                 "size_seen", "rotated_at", "deleted", "saved", "mark", "salvage")

    def __init__(self, dev: int, ino: int, path: str, fd: int, pos: int, fp: bytes):
        self.dev, self.ino, self.path, self.fd = dev, ino, path, fd
        self.pos = pos            # bytes read from the file (the next pread starts here)
        self.carry: list[bytes] = []  # the partial last line, not yet emitted
        self.carried = 0          # bytes in carry
        self.skipping = False     # inside an over-long line whose head was emitted
        self.fp = fp              # first bytes of the file, up to FINGERPRINT_BYTES
        self.size_seen = -1       # st_size at the last pass
        self.rotated_at: float | None = None  # clock() when it left its path (still named elsewhere)
        self.deleted = False      # no name left: read to the end, then close
        self.saved = -1           # the offset last handed to the OffsetStore
        self.mark = b""           # the bytes just before ``saved`` (a copy of the file agrees with them)
        self.salvage = None       # rotated.Known: it was truncated; read what followed this from its copy

    @property
    def offset(self) -> int:
        """Bytes delivered: up to the start of the partial line (or the read position while skipping)."""
        return self.pos - self.carried


def tail_start(fd: int, size: int, window: int) -> int:
    """Where to start reading a file "from its end": just after the last newline in its last ``window`` bytes.

    A file with no newline in that window starts at its end (if larger) or at 0 (if it is all one
    partial line).
    """
    if size == 0:
        return 0
    start = max(0, size - window)
    tail = os.pread(fd, size - start, start)
    nl = tail.rfind(b"\n")
    if nl >= 0:
        return start + nl + 1
    return 0 if start == 0 else size
