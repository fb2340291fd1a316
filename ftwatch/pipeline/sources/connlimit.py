"""How many connections a listening source holds at once, and how long one may sit idle (issue 17).

The Forward and HTTP listeners give each connection a thread and a buffer, so without a bound a
client that opens connections and never closes them (or a fleet misconfigured to open many) uses
threads and memory without limit. :class:`ConnectionGate` admits at most ``max_connections`` at
once: one more is closed as soon as it is accepted (the client sees the connection closed before
any answer, and fluent-bit retries it later). ``idle_timeout`` is the seconds a connection may
send nothing (between requests, or stalled inside one) before the listener closes it. Waiting on
a full ingest queue is backpressure, not idleness: no timeout runs while a source is blocked
there.

The gate counts what it does (``stats``) and reports each event to an optional ``count``
callback, which ``ftwatch watch`` points at its Prometheus counter
``ftwatch_source_connections_total{source, event}``.
"""

from __future__ import annotations

import threading
from typing import Callable

ACCEPTED, REFUSED, IDLE_CLOSED = "accepted", "refused", "idle_closed"


class ConnectionGate:
    """Admits at most ``max_connections`` connections at once; counts refusals and idle closes.

    Args:
        name: the source's name (the ``source`` label of the counter).
        max_connections: connections held at once, >= 1.
        idle_timeout: seconds a connection may stay silent before it is closed, > 0 (the
            listeners set it as the socket timeout of their reads).
        count: called with ``(name, event)`` for each event (``accepted``, ``refused``,
            ``idle_closed``), or None.

    Attributes:
        stats: ``{"accepted", "refused", "idle_closed", "open"}`` counts (a copy).

    Raises:
        ValueError: a limit that is not positive.
    """

    def __init__(self, name: str, max_connections: int, idle_timeout: float,
                 count: Callable[[str, str], None] | None = None):
        if max_connections < 1 or not idle_timeout > 0:
            raise ValueError("max_connections and idle_timeout must be positive")
        self.name = name
        self.max_connections = max_connections
        self.idle_timeout = float(idle_timeout)
        self._count = count
        self._lock = threading.Lock()
        self._stats = {ACCEPTED: 0, REFUSED: 0, IDLE_CLOSED: 0, "open": 0}

    @property
    def stats(self) -> dict[str, int]:
        """A copy of the counts."""
        with self._lock:
            return dict(self._stats)

    def admit(self) -> bool:
        """Takes a slot for a new connection; False (counted as refused) when all are taken."""
        with self._lock:
            event = ACCEPTED if self._stats["open"] < self.max_connections else REFUSED
            self._stats[event] += 1
            if event == ACCEPTED:
                self._stats["open"] += 1
        self._report(event)
        return event == ACCEPTED

    def release(self) -> None:
        """Gives back the slot of a connection that :meth:`admit` let in and that is now closed."""
        with self._lock:
            self._stats["open"] -= 1

    def idle_closed(self) -> None:
        """Counts a connection closed for sending nothing for ``idle_timeout`` seconds."""
        with self._lock:
            self._stats[IDLE_CLOSED] += 1
        self._report(IDLE_CLOSED)

    def _report(self, event: str) -> None:
        if self._count is not None:
            self._count(self.name, event)
