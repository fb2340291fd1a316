"""One store that is several: the SQLite store first, then extra sinks (Elasticsearch).

The recorder talks to one ``store``; ``FanOut`` hands every writer call to the primary (whose
errors propagate as before, and whose answer is returned) and then to each extra sink, whose
errors are logged and counted, never raised: a broken secondary must not stop the run. Readers and
any other attribute (``path``, ``decision``, ``findings_for`` ...) are the primary's.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from ftwatch.errors import FtwatchError

log = logging.getLogger(__name__)

WRITERS = ("start_run", "end_run", "add_event", "add_findings", "add_decision", "add_delivery",
           "add_output")
"""The store methods every sink receives."""


class FanOut:
    """Hands the store's writer calls to ``primary`` and then to every sink in ``extra``.

    Args:
        primary: the SQLite store (``ftwatch.pipeline.sinks.sqlite.SqliteStore``).
        extra: more sinks with the writer methods of :data:`WRITERS` (and ``close``).
    """

    def __init__(self, primary: Any, extra: Sequence[Any] = ()):
        self.primary = primary
        self.extra = list(extra)
        self.errors = 0           # writer calls an extra sink failed

    def __getattr__(self, name: str) -> Any:
        if name in WRITERS:
            return lambda *args, **kwargs: self._write(name, args, kwargs)
        return getattr(self.primary, name)

    def _write(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = getattr(self.primary, name)(*args, **kwargs)
        for sink in self.extra:
            try:
                getattr(sink, name)(*args, **kwargs)
            except (FtwatchError, OSError, ValueError, TypeError) as exc:
                self.errors += 1
                log.error("%s.%s failed: %s", type(sink).__name__, name, exc)
        return result

    def close(self) -> None:
        """Close the extra sinks (they flush), then the primary."""
        for sink in self.extra:
            try:
                sink.close()
            except Exception as exc:           # close the rest whatever happens to one
                log.error("closing %s failed: %s", type(sink).__name__, exc)
        self.primary.close()
