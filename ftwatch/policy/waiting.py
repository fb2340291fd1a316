"""The errors waiting for their instance's progress (``ftwatch.policy.progress.Survival``), kept so
that a progress line costs O(log n) in the errors waiting, not O(n).

What a progress line at ``time`` with ``counters`` does to an error ``f`` of its instance (the
rule, :meth:`Waiting.progress`): a line at or before the error (``time <= f.time``) adds its
counters to those the error saw before it (later lines override); a line after it counts
towards outliving it, unless it is past the error's window or its counters went back (the
process started over), which ends the wait.

Kept per instance: the waiting errors sorted by their time, so the errors a line is after are a
prefix found by bisection (each leaves within ``needed`` lines: outlived or dropped), and a log
of the lines' counters for the rest, which an error reads (:func:`_fold`) only when it needs its
counters before (a line after it), from its own place in the log and backwards: the last line
at or before it that holds each counter. In replay, where a file's clock may jump back (a log
of several runs, a clock that wraps), errors "later" than the lines may wait for many of them:
each such line is one log append, not one update per waiting error. The log is folded into
every error and emptied past ``LOG_LINES`` lines.
"""

from __future__ import annotations

import bisect
import operator
from typing import Iterable, Iterator

from ftwatch.events import Finding

_FIRST = operator.itemgetter(0)   # an entry's finding

LOG_LINES = 1024          # logged lines per instance before they are folded into its errors


def went_back(before: dict[str, int], now: dict[str, int]) -> bool:
    """The counters ``now`` are lower than ``before`` (the process started over): the epoch
    decides where both lines have one (a step or iteration count may restart with each epoch),
    else any counter both lines have."""
    if "epoch" in before and "epoch" in now and before["epoch"] != now["epoch"]:
        return now["epoch"] < before["epoch"]
    return any(n < before.get(k, n) for k, n in now.items())


class _Log:
    """One instance's logged lines: ``lines[i]`` is line ``base + i`` as (time, counters), and the
    counter names any of them holds."""

    __slots__ = ("base", "lines", "kinds")

    def __init__(self) -> None:
        self.base = 0
        self.lines: list[tuple[float, dict[str, int]]] = []
        self.kinds: set[str] = set()


def _fold(entry: list, log: _Log) -> None:
    """Add to ``entry``'s counters before it those of the logged lines since its mark that are at
    or before it (the last such line's value of each counter), and move its mark to the log's end."""
    lines, start = log.lines, entry[3] - log.base
    if start < len(lines):
        at, found, kinds = entry[0].time, {}, len(log.kinds)
        for i in range(len(lines) - 1, max(start, 0) - 1, -1):
            t, counters = lines[i]
            if t <= at:
                for k, v in counters.items():
                    if k not in found:
                        found[k] = v
                if len(found) == kinds:
                    break
        entry[2].update(found)
    entry[3] = log.base + len(lines)


class Waiting:
    """The waiting errors of every instance (module docstring). Insertion order is kept: the
    oldest first (:meth:`oldest`), and the errors a line outlives in the order they began to wait."""

    def __init__(self) -> None:
        self._entries: dict[int, list] = {}   # id(finding) -> [finding, lines after, counters before, log mark, seq]
        self._by: dict[str, list[tuple[float, int, int]]] = {}   # instance -> (time, seq, id), sorted
        self._logs: dict[str, _Log] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, instance: object) -> bool:
        """``instance`` has an error waiting."""
        return instance in self._by

    def instances(self) -> Iterable[str]:
        """The instances with an error waiting."""
        return self._by.keys()

    def findings(self) -> Iterator[Finding]:
        """The waiting errors, the oldest first, read as they are asked for (not copied: a
        caller that stops at the first, ``Survival._begin`` once per chunk of an instance with
        an error waiting, costs O(1), not O(errors waiting)); none may start or stop waiting
        while it is read."""
        return map(_FIRST, self._entries.values())

    def keys(self, instance: str | None = None) -> list[int]:
        """The keys of the errors waiting: ``instance``'s (None: every instance's), each
        instance's in time order."""
        if instance is None:
            return [key for order in self._by.values() for _, _, key in order]
        return [key for _, _, key in self._by.get(instance, ())]

    def finding(self, key: int) -> Finding:
        """The waiting error ``key`` (KeyError when it waits no more)."""
        return self._entries[key][0]

    def oldest(self) -> int:
        """The key of the error that began to wait first."""
        return next(iter(self._entries))

    def add(self, finding: Finding) -> bool:
        """``finding`` waits (again: from scratch, in its place). True when its instance had none waiting."""
        key, instance = id(finding), finding.origin.instance
        log = self._logs.get(instance)
        mark = log.base + len(log.lines) if log is not None else 0
        entry = self._entries.get(key)
        if entry is not None:
            entry[1], entry[2], entry[3] = 0, {}, mark
            return False
        self._seq += 1
        self._entries[key] = [finding, 0, {}, mark, self._seq]
        new = instance not in self._by
        bisect.insort(self._by.setdefault(instance, []), (finding.time, self._seq, key))
        return new

    def drop(self, key: int) -> str | None:
        """The error ``key`` stops waiting; returns its instance when that has none left waiting."""
        entry = self._entries.pop(key)
        instance = entry[0].origin.instance
        order = self._by[instance]
        i = bisect.bisect_left(order, (entry[0].time, entry[4]))
        if i >= len(order) or order[i][2] != key:        # a time that does not sort (NaN)
            i = next(j for j, item in enumerate(order) if item[2] == key)
        del order[i]
        if order:
            return None
        del self._by[instance]
        self._logs.pop(instance, None)
        return instance

    def order(self, instance: str) -> list[tuple[float, int, int]] | None:
        """``instance``'s waiting errors as (time, seq, key), sorted; None where none waits. The
        list itself, as drops change it (emptied when its last error stops waiting), so a reader
        that keeps it while no error is added asks :meth:`before_all`'s question without the look-up:
        ``not list or not bisect.bisect_left(list, (time,))``."""
        return self._by.get(instance)

    def before_all(self, instance: str, time: float) -> bool:
        """Whether a line of ``instance`` at ``time`` is after none of its waiting errors (one it
        would only log, :meth:`progress`); True where none waits."""
        order = self._by.get(instance)
        return not order or not bisect.bisect_left(order, (time,))

    def progress(self, instance: str, time: float, counters: dict[str, int], window: float,
                 needed: int) -> tuple[list[Finding], list[str]]:
        """``instance`` printed a progress line at ``time`` with ``counters`` (module docstring).

        Returns:
            The errors it outlived (they stop waiting), in the order they began to wait, and the
            instances left with none waiting.
        """
        order = self._by.get(instance)
        if not order:
            return [], []
        after = bisect.bisect_left(order, (time,))      # order[:after]: the errors this line is after
        if not after:                                   # none (most lines of a replayed chunk): logged
            if counters and order[-1][0] >= time:
                self._log(instance, time, counters, order)
            return [], []
        out: list[tuple[int, Finding]] = []
        gone: list[str] = []
        log = self._logs.get(instance)
        for at, seq, key in order[:after]:
            entry = self._entries[key]
            if log is not None:
                _fold(entry, log)
            if time > at + window or went_back(entry[2], counters):
                emptied = self.drop(key)
                gone += [emptied] if emptied is not None else []
                continue
            entry[1] += 1
            if entry[1] >= needed:
                emptied = self.drop(key)
                gone += [emptied] if emptied is not None else []
                out.append((seq, entry[0]))
        order = self._by.get(instance)
        if counters and order and order[-1][0] >= time:   # errors it is at or before: logged
            self._log(instance, time, counters, order)
        out.sort(key=lambda item: item[0])
        return [f for _, f in out], gone

    def _log(self, instance: str, time: float, counters: dict[str, int], order: list) -> None:
        """Log a line of ``instance`` at ``time`` with ``counters`` for its errors ``order`` it is at
        or before (read by :func:`_fold`); past ``LOG_LINES`` lines the log is folded into them."""
        log = self._logs.get(instance)
        if log is None:
            log = self._logs[instance] = _Log()
        log.lines.append((time, dict(counters)))
        log.kinds.update(counters)
        if len(log.lines) >= LOG_LINES:
            for _, _, key in order:
                _fold(self._entries[key], log)
            log.base += len(log.lines)
            log.lines.clear()

    def expire(self, now: float, window: float) -> list[str]:
        """Errors whose window ended by ``now`` stop waiting; returns the instances left with none."""
        gone = []
        for key, entry in list(self._entries.items()):
            if now > entry[0].time + window:
                emptied = self.drop(key)
                if emptied is not None:
                    gone.append(emptied)
        return gone

    def clear(self) -> None:
        """Nothing waits."""
        self._entries.clear()
        self._by.clear()
        self._logs.clear()
