"""Clocks: time reaches the rules only through Tick events made from a Clock.

``SystemClock`` reads the real clocks; ``FakeClock`` is advanced by tests (no test sleeps).
"""

from __future__ import annotations

import time as _time
from typing import Protocol

from ftwatch.events import Tick


class Clock(Protocol):
    """Wall time (epoch seconds) and monotonic time (seconds)."""

    def time(self) -> float: ...

    def mono(self) -> float: ...


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        return _time.time()

    def mono(self) -> float:
        return _time.monotonic()

    def tick(self) -> Tick:
        return Tick(self.time(), self.mono())


class FakeClock:
    """A clock that moves only when told to.

    Args:
        start: the initial wall time in epoch seconds (default 2026-11-21T00:00:00Z).
    """

    def __init__(self, start: float = 1_795_219_200.0):
        self._wall = float(start)
        self._mono = 0.0

    def time(self) -> float:
        return self._wall

    def mono(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> Tick:
        """Move both clocks forward by ``seconds`` and return the Tick for the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self._wall += seconds
        self._mono += seconds
        return self.tick()

    def tick(self) -> Tick:
        return Tick(self._wall, self._mono)
