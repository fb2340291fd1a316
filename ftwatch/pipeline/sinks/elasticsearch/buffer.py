"""The Elasticsearch sink's on-disk buffer and dead-letter file: nothing is lost while the
cluster is away, nor when ftwatch itself dies (SPEC E2).

Layout::

    <dir>/current.jsonl          documents being written now (one JSON entry a line)
    <dir>/seg-000000001.jsonl    sealed segments, oldest first; each is one bulk request
    <dir>/dead-letter.jsonl      what Elasticsearch refused for good, with the reason
    <dir>/dropped.count          how many documents were not journaled: the buffer was full
    <dir>/.lock                  held (flock) by the one process that owns the directory

Every document is appended to ``current.jsonl`` before anything is sent (a write-ahead
journal), so a crash loses nothing: an instance that opens the directory seals a left-over
``current.jsonl`` into a segment. A segment is deleted once every document in it is acknowledged
(or dead-lettered), and rewritten atomically (temporary file, fsync, ``os.replace``) with what
is still to send. An entry is ``{"index", "id", "doc", "tries"}``.

Size cap (``max_bytes``, the journal and segments together, not the dead-letter file): an entry
that would pass it is not written but counted in ``dropped`` (kept across restarts in
``dropped.count``, which the metrics endpoint reports). The oldest data is kept, the newest
dropped, so what reaches the cluster has no holes up to the moment the buffer filled.
"""

from __future__ import annotations

import fcntl
import json
import os
import time as _time
from pathlib import Path
from typing import Any, Iterable

from ftwatch.errors import SinkError

CURRENT = "current.jsonl"
DEAD_LETTER = "dead-letter.jsonl"
DROPPED = "dropped.count"


def _line(entry: Any) -> str:
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str) + "\n"


class DiskBuffer:
    """Segments of entries waiting for Elasticsearch, plus the dead-letter file.

    Args:
        directory: created if missing.
        segment_size: entries per segment (the bulk batch size); ``append`` seals a full one.
        max_bytes: cap of the journal and segments together (0: none); see the module doc.

    Raises:
        SinkError: (not retryable) when the directory cannot be created, or another process
            holds it.

    Not thread-safe: the sink serialises calls.
    """

    def __init__(self, directory: Path, segment_size: int = 500, max_bytes: int = 0):
        self.directory = Path(directory)
        self.segment_size = segment_size
        self.max_bytes = max_bytes
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.directory / ".lock", "w")
        except OSError as exc:
            raise SinkError(f"cannot use the Elasticsearch buffer {self.directory}: {exc}",
                            retryable=False) from exc
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise SinkError(f"the Elasticsearch buffer {self.directory} is in use by another "
                            "ftwatch process; give each its own storage.elasticsearch.buffer_dir",
                            retryable=False) from None
        self._fh: Any = None
        self._count = 0
        existing = self.segments()
        self._next = int(existing[-1].stem.split("-")[1]) + 1 if existing else 1
        self.seal()                       # a journal left by a crash becomes a segment
        self.bytes = sum(seg.stat().st_size for seg in self.segments())
        try:
            self.dropped = int(self.dropped_path.read_text().strip() or 0)
        except (OSError, ValueError):
            self.dropped = 0

    @property
    def dropped_path(self) -> Path:
        return self.directory / DROPPED

    @property
    def dead_letter_path(self) -> Path:
        return self.directory / DEAD_LETTER

    def append(self, entries: Iterable[dict[str, Any]], capped: bool = True) -> bool:
        """Journal entries; True when a segment filled up (and was sealed) meanwhile. Entries
        past ``max_bytes`` (when ``capped``) are dropped and counted in ``dropped``.

        Raises:
            SinkError: (retryable) when the disk refuses the write.
        """
        full = False
        dropped = 0
        try:
            for entry in entries:
                line = _line(entry)
                size = len(line.encode("utf-8"))
                if capped and self.max_bytes and self.bytes + size > self.max_bytes:
                    dropped += 1
                    continue
                if self._fh is None:
                    self._fh = open(self.directory / CURRENT, "a", encoding="utf-8")
                self._fh.write(line)
                self.bytes += size
                self._count += 1
                if self._count >= self.segment_size:
                    self.seal()
                    full = True
            if self._fh is not None:
                self._fh.flush()
            if dropped:
                self.dropped += dropped
                tmp = self.dropped_path.with_suffix(".tmp")
                tmp.write_text(f"{self.dropped}\n")
                os.replace(tmp, self.dropped_path)
        except OSError as exc:
            raise SinkError(f"cannot write to the Elasticsearch buffer {self.directory}: {exc}") from exc
        return full

    def seal(self) -> Path | None:
        """Turn ``current.jsonl`` into the next segment (None when there is nothing in it)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._count = 0
        current = self.directory / CURRENT
        if not current.exists() or current.stat().st_size == 0:
            return None
        seg = self.directory / f"seg-{self._next:09d}.jsonl"
        self._next += 1
        os.replace(current, seg)
        self._sync_dir()
        return seg

    def segments(self) -> list[Path]:
        """Sealed segments, oldest first."""
        return sorted(self.directory.glob("seg-*.jsonl"))

    def read(self, segment: Path) -> tuple[list[dict[str, Any]], list[str]]:
        """(entries, unreadable lines) of a segment; a line cut short by a crash is unreadable."""
        entries, bad = [], []
        for line in segment.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                bad.append(line)
                continue
            if isinstance(entry, dict) and {"index", "id", "doc"} <= entry.keys():
                entries.append(entry)
            else:
                bad.append(line)
        return entries, bad

    def rewrite(self, segment: Path, entries: list[dict[str, Any]]) -> None:
        """Keep only ``entries`` in ``segment`` (delete it when empty), atomically."""
        try:
            self.bytes -= segment.stat().st_size
        except OSError:
            pass
        if not entries:
            segment.unlink(missing_ok=True)
            return
        tmp = segment.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(_line(e) for e in entries)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, segment)
        self.bytes += segment.stat().st_size
        self._sync_dir()

    def pending(self) -> int:
        """Entries not yet acknowledged: the sealed segments' and the journal's."""
        total = self._count
        for seg in self.segments():
            with open(seg, "rb") as fh:
                total += sum(1 for line in fh if line.strip())
        return total

    def dead_letter(self, records: Iterable[dict[str, Any]]) -> int:
        """Append refused documents (each with ``reason`` and ``status``) to the dead-letter
        file, stamped with ``dead_at`` (epoch s). Returns how many."""
        n = 0
        with open(self.dead_letter_path, "a", encoding="utf-8") as fh:
            for record in records:
                fh.write(_line({"dead_at": _time.time(), **record}))
                n += 1
            fh.flush()
            os.fsync(fh.fileno())
        return n

    def take_dead_letters(self) -> tuple[list[dict[str, Any]], list[str]]:
        """(records with a document to send again, the other lines verbatim) of the dead-letter
        file; it is left as it is (``put_dead_letters`` replaces it)."""
        records, rest = [], []
        try:
            text = self.dead_letter_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return [], []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                rest.append(line)
                continue
            if isinstance(record, dict) and {"index", "id", "doc"} <= record.keys():
                records.append(record)
            else:
                rest.append(line)
        return records, rest

    def put_dead_letters(self, lines: list[str]) -> None:
        """Replace the dead-letter file by ``lines`` (removed when there are none), atomically."""
        if not lines:
            self.dead_letter_path.unlink(missing_ok=True)
            return
        tmp = self.dead_letter_path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.dead_letter_path)
        self._sync_dir()

    def close(self) -> None:
        """Seal the journal and release the directory."""
        self.seal()
        self._lock.close()

    def _sync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
