"""One sink that is several: the primary (the SQLite store) first, then the extra sinks
(Elasticsearch, the decisions file).

``FanOut.write`` hands each batch to the primary, whose errors propagate, and then to every extra
sink, whose errors are logged and counted, never raised: a broken secondary must not stop the
run. Reading is not its job: the primary's reading side is the store (``Recorder.store``).
"""

from __future__ import annotations

import logging
from typing import Sequence

from ftwatch.errors import FtwatchError
from ftwatch.pipeline.sinks.base import Record, Sink

log = logging.getLogger(__name__)


class FanOut:
    """A ``Sink`` over ``primary`` and then every sink in ``extra``.

    Args:
        primary: the sink whose failures are the caller's (the SQLite store).
        extra: more sinks; their failures are logged and counted in :attr:`errors`.
    """

    def __init__(self, primary: Sink, extra: Sequence[Sink] = ()):
        self.primary = primary
        self.extra = list(extra)
        self.errors = 0           # batches an extra sink failed to take

    def write(self, batch: Sequence[Record]) -> None:
        """Write ``batch`` to the primary (raises what it raises), then to each extra sink."""
        self.primary.write(batch)
        for sink in self.extra:
            try:
                sink.write(batch)
            except (FtwatchError, OSError, ValueError, TypeError) as exc:
                self.errors += 1
                log.error("%s.write failed: %s", type(sink).__name__, exc)

    def close(self) -> None:
        """Close the extra sinks (they flush), then the primary."""
        for sink in self.extra:
            try:
                sink.close()
            except Exception as exc:           # close the rest whatever happens to one
                log.error("closing %s failed: %s", type(sink).__name__, exc)
        self.primary.close()
