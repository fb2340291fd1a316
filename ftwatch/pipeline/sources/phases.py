"""Phases of a run from its log lines (SPEC R6, issue 13 item 4; ``ftwatch.config.phases``).

In ``pipeline/sources`` with the identity: both read what a shipped line says about its job.

:class:`PhaseTracker` follows one job: ``initialization`` from its workers' start (``run``:
:meth:`PhaseTracker.start`) or its first output, then the phase of the last line in a chunk that
matches a phase pattern or a step line (``training``). Its :meth:`PhaseTracker.interval` is the
job-hang interval in force: the phase's, or in training the policy's. The drivers hand the
interval, with the phase's name, to the job's hang tracker when the phase changes. With
``phases.enabled`` false and ``phases.startup`` on, only the startup is a phase: ``start`` sets
``initialization``, the first output ``training``.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

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
        self._pattern = re.compile("|".join(parts).encode(), re.MULTILINE) if parts and config.enabled else None
        self.phase = INITIALIZATION
        self._started = False
        self._startup = False           # start() set initialization for the silence before the first output

    def restart(self) -> None:
        """A new attempt of the job: initialization again, from its first output."""
        self.phase = INITIALIZATION
        self._started = self._startup = False

    def start(self, time: float, hang: Any) -> str | None:
        """The workers of a new attempt started at ``time`` (``run``): until their first output
        the job is in ``initialization`` and ``hang`` gets its interval (issue 17 item 5), when
        ``phases.enabled``, or ``phases.startup`` with job-hang detection on. Call it after the SDK's interval was reset for
        the attempt (``ControlHandler.new_attempt``).

        Returns:
            ``initialization`` when its interval was set, else None.
        """
        self.restart()
        if not (self.config.enabled or self.config.startup and self.training_interval is not None):
            return None                 # startup only matters to hang detection
        self._started = self._startup = True
        hang.set_job_hang_interval(self.interval(), time, INITIALIZATION)
        return INITIALIZATION

    def changes(self, data: bytes) -> Iterator[tuple[str, int]]:
        """Every line of a chunk that names a phase: (the phase, the match's offset), in order."""
        if self._pattern is None:
            return
        names = self._names
        for m in self._pattern.finditer(data):
            yield names[m.lastgroup], m.start()

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
        if self._pattern is None:               # startup only: the first output ends it
            if not self._startup:
                return None
            self._startup, self.phase = False, TRAINING
        elif self.feed(data) is None and not first:
            return None
        if control is not None and (control.scopes or control.base != control.configured):
            return None
        hang.set_job_hang_interval(self.interval(), time, self.phase)
        return self.phase

    def shortest_interval(self) -> float | None:
        """The shortest job-hang interval of any phase, training's included (None: none has one)."""
        values = [v for v in map(self.interval, [TRAINING, INITIALIZATION, *self.config.patterns]) if v is not None]
        return min(values, default=None)

    def interval(self, phase: str | None = None) -> float | None:
        """The job-hang interval of ``phase`` (default: the current one); None: no hang
        detection (in every phase when the policy has none)."""
        return phase_interval(self.config, phase or self.phase, self.training_interval)


def phase_interval(config: PhasesConfig, phase: str, training: float | None) -> float | None:
    """The job-hang interval of ``phase`` under ``config``: training's is ``training``; another's is
    ``config.intervals``' (<= 0: None), else the default (3600 s, or ``training`` when longer).
    None when ``training`` is None: with job-hang detection off, no phase turns it on."""
    if training is None or phase == TRAINING:
        return training
    value = config.intervals.get(phase)
    if value is None:
        value = max(DEFAULT_INTERVALS.get(phase, training), training)
    return None if value <= 0 else float(value)
