"""Phases of a run from its log lines (SPEC R6, issue 13 item 4; ``ftwatch.config.phases``).

In ``pipeline/sources`` with the identity: both read what a shipped line says about its job.

:class:`PhaseTracker` follows one job: ``initialization`` from its first output, then the phase
of the last line in a chunk that matches a phase pattern or a step line (``training``). Its
:meth:`PhaseTracker.interval` is the job-hang interval in force: the phase's, or in training the
policy's. The drivers hand the interval to the job's hang tracker when the phase changes.
"""

from __future__ import annotations

import re
from typing import Any

from ftwatch.config.phases import DEFAULT_INTERVALS, PhasesConfig

TRAINING = "training"
INITIALIZATION = "initialization"


class PhaseTracker:
    """The phase of one job's run.

    Args:
        config: the ``phases`` section.
        training_interval: the job-hang interval of the training phase (None: off).

    Raises:
        re.error: a pattern does not compile (the config names it).
    """

    def __init__(self, config: PhasesConfig, training_interval: float | None):
        self.config = config
        self.training_interval = training_interval
        parts, self._names = [], {}
        for i, (phase, patterns) in enumerate([(TRAINING, config.step_patterns)] + sorted(config.patterns.items())):
            for j, pattern in enumerate(patterns):
                name = f"p{i}_{j}"
                self._names[name] = phase
                parts.append(f"(?P<{name}>{pattern})")
        self._pattern = re.compile("|".join(parts).encode(), re.MULTILINE) if parts else None
        self.phase = INITIALIZATION
        self._started = False

    def restart(self) -> None:
        """A new attempt of the job: initialization again, from its first output."""
        self.phase = INITIALIZATION
        self._started = False

    def feed(self, data: bytes) -> str | None:
        """Scans a chunk of lines. Returns the new phase when it changed, else None."""
        if self._pattern is None:
            return None
        last = None
        for m in self._pattern.finditer(data):
            last = m
        if last is None:
            return None
        phase = self._names[last.lastgroup]
        if phase == self.phase:
            return None
        self.phase = phase
        return phase

    def follow(self, data: bytes, time: float, hang: Any, control: Any = None) -> str | None:
        """Feeds ``data`` and, when the phase changed (or this is the job's first output), hands
        its interval to ``hang`` (``set_job_hang_interval(seconds, time)``), unless the SDK set the
        job's interval itself (``control``: a ControlHandler with an open scope or a reset).

        Returns:
            the phase whose interval was set, else None.
        """
        first, self._started = not self._started, True
        if self.feed(data) is None and not first:
            return None
        if control is not None and (control.scopes or control.base != control.configured):
            return None
        hang.set_job_hang_interval(self.interval(), time)
        return self.phase

    def interval(self) -> float | None:
        """The job-hang interval of the current phase (None: no hang detection)."""
        if self.phase == TRAINING:
            return self.training_interval
        value = {**DEFAULT_INTERVALS, **self.config.intervals}.get(self.phase, self.training_interval)
        return None if value is None or value <= 0 else value
