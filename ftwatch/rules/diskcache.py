"""The on-disk cache that makes a start with unchanged rules cheap: files keyed by content.

Two users: the matcher (``hyperscan/<key>.hsdb``, a serialized compiled database, and
``hyperscan/<key>.ok``, an empty mark that a set of patterns was checked valid) and the rule
loader (``rules/<key>.rules``, one rule file's validated rules, ``ftwatch.rules.rulecache``).
Keys are content hashes made by the callers, so a changed input is simply another file; nothing
is ever invalidated in place.

Where: ``$FTWATCH_CACHE_DIR`` (``off``, ``0``, ``none`` or empty: no cache), else
``$XDG_CACHE_HOME/ftwatch`` or ``~/.cache/ftwatch``. Every read of a file refreshes its mtime,
and a store removes the files of its kind least recently used beyond ``KEEP`` files or
``CACHE_BYTES`` bytes: the files a start reads are the last to go. (Before, the count was
taken by write time, and 17 rule files' marks cycled through 16 places: every start missed
and compiled every file again.) Errors are never raised: a cache that cannot be read or
written is a cache that misses.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_ENV = "FTWATCH_CACHE_DIR"
"""Environment variable naming the cache folder; ``off`` (or empty) disables the cache."""

CACHE_KEEP = 16
"""Files kept per suffix unless ``KEEP`` names another count (databases: 10,000 rules' is ~2-40 MB)."""

KEEP: dict[str, int] = {"ok": 4096, "rules": 1024}
"""Per suffix, the files kept where it differs from ``CACHE_KEEP``: a mark is empty and a parsed
rule file small, and a start reads one per rule file, so these are kept by the thousand."""

CACHE_BYTES = 256 << 20
"""At most this many bytes per suffix (the newest file always stays)."""


def cache_root() -> Path | None:
    """The cache folder, or None when caching is off (module docstring)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip() in ("", "off", "0", "none") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ftwatch"


def cache_path(kind: str, key: str, suffix: str) -> Path | None:
    """Where the file of ``key`` lives (``<root>/<kind>/<key>.<suffix>``), or None (cache off)."""
    root = cache_root()
    return None if root is None else root / kind / f"{key}.{suffix}"


def touch(path: Path) -> None:
    """Marks ``path`` as just used (its mtime), so eviction keeps it. Never raises."""
    try:
        os.utime(path)
    except OSError:
        pass


def read(kind: str, key: str, suffix: str) -> bytes | None:
    """The bytes stored for ``key`` (and the file marked used), or None: missing, unreadable, off."""
    path = cache_path(kind, key, suffix)
    if path is None:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    touch(path)
    return data


def has(kind: str, key: str, suffix: str) -> bool:
    """Whether a file is stored for ``key`` (and, if so, marks it used)."""
    path = cache_path(kind, key, suffix)
    if path is None or not path.exists():
        return False
    touch(path)
    return True


def store(kind: str, key: str, suffix: str, data: bytes) -> None:
    """Writes ``data`` for ``key`` atomically, then removes the least recently used files of the
    suffix beyond its count (``KEEP``, else ``CACHE_KEEP``) or ``CACHE_BYTES`` in all, the one
    just written never. Never raises."""
    path = cache_path(kind, key, suffix)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        stored = sorted(((p.stat(), p) for p in path.parent.glob(f"*.{suffix}")),
                        key=lambda sp: (sp[1] == path, sp[0].st_mtime), reverse=True)
        keep, total = KEEP.get(suffix, CACHE_KEEP), 0
        for k, (stat, old) in enumerate(stored):
            total += stat.st_size
            if k and (k >= keep or total > CACHE_BYTES):   # the one just written always stays
                old.unlink(missing_ok=True)
    except OSError:
        pass
