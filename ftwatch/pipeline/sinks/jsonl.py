"""The decisions file (README "Decisions"): one JSON object per decision, appended, as a sink.

Only decisions are written (``Decision.to_json``, the stable contract); every other record is
passed over. The file is opened for each batch that holds a decision, so another process may
rotate or read it between them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ftwatch.events import Decision
from ftwatch.pipeline.sinks.base import Record, encode

_ENCODERS = {Decision: lambda d: json.dumps(d.to_json(), ensure_ascii=False) + "\n"}


class DecisionsFile:
    """A ``Sink`` appending each decision to ``path`` as one JSON line.

    Args:
        path: the file; its parent directory is created.

    Raises:
        OSError: the directory cannot be made (here), or the file not written (``write``).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, batch: Sequence[Record]) -> None:
        """Append the decisions of ``batch``, in order."""
        lines = [line for record in batch if (line := encode(_ENCODERS, record)) is not None]
        if lines:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write("".join(lines))

    def close(self) -> None:
        """Nothing to release (the file is closed after each write)."""
