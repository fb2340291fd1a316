"""The queue between the workers' reader threads and ``ftwatch run``'s loop: bounded in bytes, with
backpressure, its lag measurable (issue 16 item 4).

Reader threads :meth:`OutputQueue.put` the output they read (sized by its bytes); while the queue holds
``max_bytes`` or more, such a put blocks, so the reader stops reading and the worker's pipe fills:
a monitor slower than its workers slows their writes instead of growing without bound. Events
without bytes (a start, an exit) never block: the supervisor's own threads put them. During a stop
(:meth:`OutputQueue.unbounded`) nothing blocks either: the loop is then waiting for the workers to
die, not taking output, and what they leave is bounded by their pipes.

The loop takes everything queued with :meth:`OutputQueue.take` (waiting up to a timeout for the
first item; :meth:`OutputQueue.wake` ends that wait early with nothing, e.g. for a request on the
SDK's control socket) and gets the Outputs of one stream merged into one chunk (:func:`coalesce`).
:meth:`OutputQueue.lag` is the queue's depth in bytes and the age of its oldest item: the
``ftwatch_run_queue_bytes`` / ``ftwatch_run_queue_age_seconds`` metrics (``ftwatch.telemetry``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Any, Callable, Iterator

from ftwatch.pipeline.sources.process import Output

MAX_BYTES = 8 * 1024 * 1024    # default bound: output bytes queued before the readers block


class OutputQueue:
    """A FIFO of the supervisor's events, bounded by the bytes of the output in it.

    Args:
        max_bytes: a put of output blocks while this many bytes or more are queued (an item is
            always taken when the queue is empty, however big); > 0.
        clock: monotonic seconds (the age of queued items).

    Raises:
        ValueError: ``max_bytes`` < 1.
    """

    def __init__(self, max_bytes: int = MAX_BYTES, clock: Callable[[], float] = time.monotonic):
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self.clock = clock
        self._items: collections.deque[tuple[Any, int, float]] = collections.deque()   # (item, bytes, queued at)
        self._bytes = 0
        # reentrant: a signal handler may stop the workers (``unbounded``) while this thread is inside
        self._cond = threading.Condition(threading.RLock())
        self._woken = False
        self._open = 0                 # > 0: puts never block (a stop is under way)
        self.blocked = 0               # puts that had to wait (the readers were slowed)
        self._waiters = 0              # puts waiting now
        self.waiting = threading.Event()   # set while a put waits for room (tests, diagnostics)

    def put(self, item: Any, nbytes: int | None = None) -> None:
        """Queue ``item``; output (``nbytes`` > 0; None: an :class:`Output`'s data length, else
        0) first waits while the queue is full."""
        if nbytes is None:
            nbytes = len(item.data) if type(item) is Output else 0
        with self._cond:
            if nbytes > 0 and self._bytes and self._bytes + nbytes > self.max_bytes and not self._open:
                self.blocked += 1
                self._waiters += 1
                self.waiting.set()
                try:
                    while self._bytes and self._bytes + nbytes > self.max_bytes and not self._open:
                        self._cond.wait()
                finally:
                    self._waiters -= 1
                    if not self._waiters:
                        self.waiting.clear()
            self._items.append((item, nbytes, self.clock()))
            self._bytes += nbytes
            self._cond.notify_all()

    def take(self, timeout: float, limit: int = 4096) -> list[Any]:
        """Everything queued (at most ``limit`` items), waiting up to ``timeout`` seconds for the
        first; [] on timeout or :meth:`wake`. Blocked puts resume."""
        with self._cond:
            if not self._items and not self._woken:
                self._cond.wait_for(lambda: self._items or self._woken, max(0.0, timeout))
            self._woken = False
            out = []
            taken = 0
            while self._items and len(out) < limit:
                item, nbytes, _ = self._items.popleft()
                taken += nbytes
                out.append(item)
            if taken:
                self._bytes -= taken
                self._cond.notify_all()
            return out

    def wake(self) -> None:
        """End a :meth:`take` that is waiting now (or the next one) at once, with what is queued."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def lag(self) -> tuple[int, float]:
        """(bytes of output queued, seconds the oldest queued item has waited; 0.0 when empty)."""
        with self._cond:
            age = self.clock() - self._items[0][2] if self._items else 0.0
            return self._bytes, max(0.0, age)

    def full(self) -> bool:
        """True while a put of output waits for room, or the next one would (``max_bytes``
        queued); never during a stop."""
        with self._cond:
            return (self._waiters > 0 or self._bytes >= self.max_bytes) and not self._open

    def __len__(self) -> int:
        return len(self._items)

    @contextlib.contextmanager
    def unbounded(self) -> Iterator[None]:
        """While inside, no put blocks (the loop is stopping the workers, not taking output)."""
        with self._cond:
            self._open += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1


def coalesce(items: list[Any]) -> list[Any]:
    """The Outputs of each stream in ``items`` merged into one, at the place of its first.

    The order per instance is kept: an instance's start or exit is never moved across its output
    (an Output after it starts a new chunk). The merged Output's time is its first part's.
    """
    out: list[Any] = []
    parts: dict[Any, list[bytes]] = {}      # origin -> the data of its chunk being merged
    where: dict[Any, int] = {}              # origin -> that chunk's index in out
    for item in items:
        if type(item) is Output:
            merged = parts.get(item.origin)
            if merged is not None:
                merged.append(item.data)
                continue
            parts[item.origin] = [item.data]
            where[item.origin] = len(out)
            out.append(item)
            continue
        instance = getattr(getattr(item, "origin", None), "instance", None)
        for origin in [o for o in parts if o.instance == instance]:
            _close(out, where.pop(origin), parts.pop(origin))
        out.append(item)
    for origin, data in parts.items():
        _close(out, where[origin], data)
    return out


def _close(out: list[Any], index: int, data: list[bytes]) -> None:
    if len(data) > 1:
        first = out[index]
        out[index] = Output(first.origin, b"".join(data), first.time)
