"""Small JSON state files that survive a crash or a restart of ftwatch (budgets, fault history, blame).

A file is written atomically: a temporary file in the same folder, ``fsync``, ``os.replace``, then
an ``fsync`` of the folder, so a crash leaves the old or the new version, never half of one. Each
file names its ``format`` and ``version``; a file of another format is refused, not overwritten.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ftwatch.errors import ConfigError, Issue


def read_state(path: Path, fmt: str, version: int) -> dict[str, Any] | None:
    """The content of a state file, or None when it does not exist.

    Raises:
        ConfigError: the file is unreadable, not JSON, or not ``fmt`` v``version`` (it is left
            alone: delete it to start afresh).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(Issue(str(path), 0, f"state file is unreadable ({exc}); delete it to start afresh")) from None
    if not isinstance(data, dict) or data.get("format") != fmt or data.get("version") != version:
        raise ConfigError(Issue(str(path), 0, f"not a {fmt} v{version} file; delete it to start afresh"))
    return data


def write_state(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically (its folder is created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
