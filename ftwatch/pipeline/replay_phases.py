"""Phases of a replayed run (SPEC R6, issue 13 item 4), on the replay clock.

``ftwatch replay`` with ``phases.enabled`` reads the job's phases from the replayed lines with
the patterns ``run`` and ``watch`` use (``ftwatch.pipeline.sources.phases.PhaseTracker``): each
file starts in ``initialization`` (a job's first output is that phase until its first step
line), and a line that matches a phase pattern or a step line changes its file's phase at that
line's time (its own timestamp, else the last one before it in the chunk, else the chunk's
time, as the replay clock places it). The changes of every file, merged in time order, are the
job's phase timeline: :meth:`PhaseScan.interval_at` gives the job-hang interval in force at a
moment, the one ``replay_hang.HangScan`` judges a silence that starts then by.

The patterns scan each chunk whole, in one regex pass; a matching line costs one Python step,
and only a line that changes its file's phase costs a timestamp lookup.
"""

from __future__ import annotations

import bisect
from typing import Iterator, Protocol

from ftwatch.parsers import chunks


class Tracker(Protocol):
    """What ``PhaseScan`` needs of ``ftwatch.pipeline.sources.phases.PhaseTracker``."""

    phase: str

    def restart(self) -> None: ...

    def changes(self, data: bytes) -> Iterator[tuple[str, int]]: ...

    def interval(self, phase: str | None = None) -> float | None: ...

    def shortest_interval(self) -> float | None: ...


class PhaseScan:
    """Collects the phase changes of replayed chunks.

    Args:
        tracker: a ``PhaseTracker`` of the ``phases`` section (``enabled``) and the training
            phase's job-hang interval; its patterns name the phases.
        sim_step: replay's simulated seconds per untimed line (``ftwatch.pipeline.replay.SIM_STEP``).
    """

    def __init__(self, tracker: Tracker, sim_step: float) -> None:
        self.tracker = tracker
        self.sim_step = sim_step
        tracker.restart()
        self.initial = tracker.phase                    # each file's phase before its first phase line
        self.changes: list[tuple[float, str]] = []     # (time, phase), in the order found
        self._sorted: list[tuple[float, str]] | None = None
        self._year: int | None = None

    @property
    def shortest(self) -> float:
        """The shortest interval of any phase (seconds): silences that short may matter."""
        return self.tracker.shortest_interval() or float("inf")

    def open(self, year: int | None) -> None:
        """A file starts, in ``initialization``; ``year`` dates its glog and syslog stamps."""
        self.tracker.restart()
        self._year = year

    def take(self, chunk: bytes, base: float) -> None:
        """Read the phase lines of one chunk of complete lines; ``base``: the chunk's time when
        its first line carries no stamp."""
        tracker = self.tracker
        for phase, pos in tracker.changes(chunk):
            if phase != tracker.phase:
                tracker.phase = phase
                self.changes.append((self._time(chunk, pos, base), phase))
                self._sorted = None

    def _time(self, chunk: bytes, pos: int, base: float) -> float:
        start = chunk.rfind(b"\n", 0, pos) + 1
        end = chunk.find(b"\n", pos)
        found = chunks.last_timestamp(chunk, 0, len(chunk) if end < 0 else end, self._year)
        if found is None:
            return base + chunks.newlines(chunk, 0, start) * self.sim_step
        return found[1] + chunks.newlines(chunk, found[0], start) * self.sim_step

    def interval_at(self, t: float) -> tuple[float | None, str]:
        """(the job-hang interval in force at ``t``, None: none; the phase then)."""
        if self._sorted is None:
            self._sorted = sorted(self.changes)
        k = bisect.bisect_right(self._sorted, (t, "\uffff"))
        phase = self._sorted[k - 1][1] if k else self.initial
        return self.tracker.interval(phase), phase
