"""Bounded state: the caps on what a long-running ftwatch keeps (issue 17 item 3), and the tally
of what they dropped.

``ftwatch watch`` runs for weeks over an open-ended set of jobs, pods and streams; every map it
keeps per job, instance or stream is either pruned by time or bounded here. Two helpers, used at
the point where state grows (the numbers come from the ``limits`` config section,
``ftwatch.config.limits``):

- :class:`BoundedDict`: a dict with at most ``maxlen`` keys. Setting a new key beyond the cap
  evicts the least recently set one (``lru``: setting an existing key, or :meth:`touch`, makes it
  the newest; else the oldest inserted goes first).
- :func:`trim_oldest`: shortens a list (a job's evidence) past its cap to three quarters of it,
  dropping the oldest items that ``keep`` does not protect first, so a flood of info lines never
  pushes out the errors a decision is made of; :func:`drop_oldest` drops the ``n`` oldest items
  of one sort; :func:`cap_two_tiers` applies both (a job's evidence: info findings have a cap of
  their own below the cap of all).

Every drop is counted in :data:`EVICTIONS` under a ``kind`` (``finding``, ``instance``, ...);
``ftwatch.telemetry.Metrics`` reports the tally as ``ftwatch_state_evicted_total{kind}`` at each
scrape. The tally is process-wide (one ftwatch per process; tests read differences).

A core module: imports no stage, so rules, pipeline and alerting may all use it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, Iterable, MutableSequence, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


class Evictions:
    """Counts of state dropped by a cap, by kind (thread-safe)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, kind: str, n: int = 1) -> None:
        """``n`` items of ``kind`` were dropped."""
        if n > 0:
            with self._lock:
                self._counts[kind] = self._counts.get(kind, 0) + n

    def get(self, kind: str) -> int:
        """How many of ``kind`` were dropped so far in this process."""
        return self._counts.get(kind, 0)

    def snapshot(self) -> dict[str, int]:
        """kind -> count, a copy."""
        with self._lock:
            return dict(self._counts)


EVICTIONS = Evictions()


class BoundedDict(OrderedDict[K, V]):
    """A dict of at most ``maxlen`` keys; a new key beyond the cap evicts the least recent one.

    Args:
        maxlen: the cap, >= 1.
        kind: the tally's kind for a drop (:data:`EVICTIONS`); None: not counted (a map that
            shadows another one's keys, counted there).
        lru: setting an existing key makes it the newest (least recently *used*); False: keys
            leave in insertion order.
        on_evict: called with ``(key, value)`` of each evicted entry.

    Raises:
        ValueError: ``maxlen`` < 1.

    Only ``d[k] = v`` evicts; use it, not ``setdefault`` / ``update``, to add keys.
    """

    def __init__(self, maxlen: int, kind: str | None = None, *, lru: bool = True,
                 on_evict: Callable[[K, V], None] | None = None):
        super().__init__()
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen!r}")
        self.maxlen = maxlen
        self.kind = kind
        self.lru = lru
        self.on_evict = on_evict

    def __setitem__(self, key: K, value: V) -> None:
        if key in self:
            OrderedDict.__setitem__(self, key, value)
            if self.lru:
                self.move_to_end(key)
            return
        while len(self) >= self.maxlen:
            old, gone = self.popitem(last=False)
            if self.kind is not None:
                EVICTIONS.count(self.kind)
            if self.on_evict is not None:
                self.on_evict(old, gone)
        OrderedDict.__setitem__(self, key, value)

    def touch(self, key: K) -> None:
        """Make ``key`` (if present) the most recent one."""
        if key in self:
            self.move_to_end(key)

    def oldest(self) -> K | None:
        """The key evicted next, or None when empty."""
        return next(iter(self), None)

    def __reduce__(self):                            # copy / pickle as a plain dict of the items
        return dict, (dict(self),)


def drop_oldest(items: MutableSequence[T], n: int, kind: str, which: Callable[[T], bool]) -> int:
    """Drop, in place, the ``n`` oldest items of ``items`` (oldest first) for which ``which``
    holds; the order of what stays is unchanged. Counted under ``kind``; returns how many went
    (fewer than ``n`` when fewer match)."""
    if n <= 0:
        return 0
    out, left = [], n
    for item in items:
        if left and which(item):
            left -= 1
            continue
        out.append(item)
    items[:] = out
    EVICTIONS.count(kind, n - left)
    return n - left


def trim_oldest(items: MutableSequence[T], cap: int, kind: str,
                keep: Callable[[T], bool] = lambda _: False) -> int:
    """Shorten ``items`` (oldest first) in place once it is longer than ``cap``.

    It is cut to ``cap - cap // 4`` (so the next trim is a quarter of the cap away: amortised
    O(1) per item): first the oldest items ``keep`` does not protect go, then, if the protected
    ones alone are still too many, the oldest of them. The order of what stays is unchanged.

    Args:
        items: the list, oldest first.
        cap: the most items it may hold, >= 1.
        kind: the tally's kind for the dropped items (:data:`EVICTIONS`).
        keep: True for an item to drop last.

    Returns:
        How many were dropped (0 while ``len(items) <= cap``).
    """
    if len(items) <= cap:
        return 0
    target = max(1, cap - cap // 4)
    excess = len(items) - target
    flags = [keep(x) for x in items]
    unprotected = flags.count(False)
    drop_free = min(excess, unprotected)            # the oldest unprotected ones
    drop_kept = excess - drop_free                  # then the oldest protected ones
    out = []
    for item, protected in zip(items, flags):
        if protected:
            if drop_kept:
                drop_kept -= 1
                continue
        elif drop_free:
            drop_free -= 1
            continue
        out.append(item)
    items[:] = out
    EVICTIONS.count(kind, excess)
    return excess


def cap_two_tiers(items: MutableSequence[T], new: Iterable[T], free: int, cap_free: int, cap_all: int,
                  kind: str, keep: Callable[[T], bool]) -> int:
    """Bound ``items`` after ``new`` (already appended) came: the items ``keep`` does not protect
    have their own cap ``cap_free`` (past it the oldest of them go, to three quarters of it), all
    items ``cap_all`` (:func:`trim_oldest`).

    Args:
        free: how many unprotected items ``items`` held before ``new``.

    Returns:
        How many unprotected items it holds now (the caller keeps the count, so no call scans
        the whole list while nothing is dropped).
    """
    free += sum(1 for x in new if not keep(x))
    if free > cap_free:
        free -= drop_oldest(items, free - (cap_free - cap_free // 4), kind, lambda x: not keep(x))
    if len(items) > cap_all:
        trim_oldest(items, cap_all, kind, keep)
        free = sum(1 for x in items if not keep(x))
    return free
