"""Pushing notices to the workers over their control-socket connections (MindCluster ``retry``, D5).

A worker's SDK (``Monitor.on_retry``) opens one connection and sends ``{"op": "subscribe",
"events": ["retry"]}``; the control server answers ``{"ok": true, "subscribed": [...]}`` and keeps
the connection here. :meth:`Subscribers.notify` (the runner's thread) then writes one JSON line
``{"event": "retry", "id": ..., ...}`` to each subscriber of that event. A connection that is
closed or broken is dropped; a worker that died simply stops being a subscriber.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

EVENTS = frozenset({"retry"})


@dataclass(eq=False)
class Subscriber:
    """One subscribed connection: who it is and what it wants."""

    conn: socket.socket
    instance: str | None
    rank: int | None
    events: frozenset[str]
    lock: threading.Lock = field(default_factory=threading.Lock)


class Subscribers:
    """The subscribed connections of one control server (thread-safe)."""

    def __init__(self) -> None:
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()

    def add(self, conn: socket.socket, message: dict[str, Any]) -> dict[str, Any]:
        """Register ``conn`` for the message's ``events``; returns the answer for the worker."""
        events = message.get("events")
        if not isinstance(events, list) or not events or not set(events) <= EVENTS:
            return {"ok": False, "error": f"events must be a non-empty subset of {sorted(EVENTS)}"}
        rank = message.get("rank")
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
        instance = message.get("instance") if isinstance(message.get("instance"), str) else None
        sub = Subscriber(conn, instance or (f"worker-{rank}" if rank is not None else None), rank, frozenset(events))
        with self._lock:
            self._subs.append(sub)
        return {"ok": True, "subscribed": sorted(sub.events)}

    def drop(self, conn: socket.socket) -> None:
        """Forget every subscription on ``conn`` (it closed)."""
        with self._lock:
            self._subs = [s for s in self._subs if s.conn is not conn]

    def instances(self, event: str) -> set[str]:
        """The instances subscribed to ``event`` now."""
        with self._lock:
            return {s.instance for s in self._subs if event in s.events and s.instance}

    def notify(self, event: str, payload: dict[str, Any], instances: set[str] | None = None) -> set[str]:
        """Write ``{"event": event, **payload}`` to the subscribers (of those ``instances`` when given).

        Returns the instances it reached; a broken connection is dropped and not among them.
        """
        line = (json.dumps({"event": event, **payload}, ensure_ascii=False) + "\n").encode()
        with self._lock:
            targets = [s for s in self._subs if event in s.events
                       and (instances is None or s.instance in instances)]
        reached: set[str] = set()
        for s in targets:
            try:
                with s.lock:        # blocking send: a notice is a few hundred bytes on a local socket
                    s.conn.sendall(line)
                if s.instance:
                    reached.add(s.instance)
            except OSError:
                self.drop(s.conn)
        return reached
