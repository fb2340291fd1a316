"""Stall tracking: job hang and exit hang (SPEC R5, R6).

Semantics follow the AIMaster doc (seeds/000, 全量参数说明):

- **job hang** (``--enable-job-hang-detection``, ``--job-hang-interval``, default 1800 s): "if the
  stdout and stderr of every instance have not been updated within the interval, restart the job".
- **exit hang** (``--enable-job-exit-hang-detection``, ``--job-exit-hang-interval``, default 600 s):
  "after one instance has succeeded, if the job has not ended within the interval, restart the job".
- Both are supported for Sync jobs only (same doc); ``HangTracker.from_policy`` switches them off
  for Async.

**Boundary**: a timer fires when ``now - since >= interval``, i.e. at exactly the interval, never
before. With a 1 s tick that is at most one tick after the doc's "longer than".

Time is plain float seconds (epoch); the tracker reads no clock: callers pass ``time`` / ``now``
(from ``Tick`` events; tests use ``FakeClock``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ftwatch.bounded import BoundedDict
from ftwatch.config.limits import MAX_INSTANCES_PER_JOB
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity, iso

if TYPE_CHECKING:
    from ftwatch.config.model import PolicyConfig

_SOURCE = "AIMaster doc (seeds/000): --enable-job-hang-detection / --job-hang-interval"
_EXIT_SOURCE = "AIMaster doc (seeds/000): --enable-job-exit-hang-detection / --job-exit-hang-interval"


@dataclass(slots=True)
class _Instance:
    origin: Origin
    last: float  # last output, or start when none yet
    spoke: bool = False


class HangTracker:
    """Per-instance last-output times and the two hang timers.

    Args:
        job_hang_interval: seconds of silence of every running instance that make a job hang;
            None (or <= 0) = off.
        exit_hang_interval: seconds after the first successful exit of an attempt by which the job
            must have ended; None (or <= 0) = off.

    Instances are keyed by ``Origin.instance``. Output from an instance that is not running (never
    ``started``, or already ``exited``) is ignored. At most ``max_instances`` are tracked (``limits``
    section): one more forgets the least recently active (counted as ``hang_timer``).
    """

    def __init__(self, job_hang_interval: float | None, exit_hang_interval: float | None,
                 max_instances: int = MAX_INSTANCES_PER_JOB):
        self.job_hang_interval = _interval(job_hang_interval)
        self.exit_hang_interval = _interval(exit_hang_interval)
        self._running: dict[str, _Instance] = BoundedDict(max_instances, "hang_timer")
        self._first_ok_exit: float | None = None
        self._hang_fired = False
        self._exit_hang_fired = False
        self._seq = 0
        self._armed: float | None = None   # when job-hang detection last went from off to on
        self.phase: str | None = None      # the run's phase whose interval is in force (R6), if named

    @classmethod
    def from_policy(cls, policy: "PolicyConfig", exits: bool = True,
                    max_instances: int = MAX_INSTANCES_PER_JOB) -> "HangTracker":
        """The tracker a ``PolicyConfig`` asks for: off unless enabled, and off in Async mode.

        Args:
            policy: the AIMaster flags.
            exits: the source reports process exits (``run``), or its launchers' clean finishes
                (``watch``: :meth:`launcher_finished`); without either (replay) there is no exit
                hang to detect.
        """
        sync = policy.job_execution_mode == "Sync"
        return cls(policy.job_hang_interval if sync and policy.enable_job_hang_detection else None,
                   policy.job_exit_hang_interval if exits and sync and policy.enable_job_exit_hang_detection
                   else None, max_instances)

    # ------------------------------------------------------------------ events

    def started(self, origin: Origin, time: float) -> None:
        """An instance started at ``time`` (a restarted instance starts its silence clock afresh)."""
        self._running[origin.instance] = _Instance(origin, time)

    def output(self, instance: str, time: float) -> None:
        """An instance wrote output at ``time``. O(1); call once per chunk, not per line."""
        inst = self._running.get(instance)
        if inst is not None and time > inst.last:
            inst.last = time
            inst.spoke = True
            self._running.touch(instance)

    def exited(self, origin: Origin, ok: bool, time: float) -> None:
        """An instance ended; ``ok`` = exit status 0. The first ok exit starts the exit-hang timer."""
        if self._running.pop(origin.instance, None) is not None and ok and self._first_ok_exit is None:
            self._first_ok_exit = time

    def launcher_finished(self, origin: Origin, time: float) -> None:
        """A launcher's stream said at ``time`` that its worker group finished successfully (a
        torchelastic agent logs it once every worker of its group exited 0; ``watch`` has no
        process exits): that stream's instance and its workers' (``<instance>/rank<N>``,
        ``Origin.with_rank``: a pod running torchrun) exit with status 0, so the silence of a
        finished job is no job hang. Other launchers' workers stay timed, and the first such
        finish starts the exit-hang timer as a first exit 0 does."""
        prefix = origin.instance + "/"
        for inst in [i for i in self._running.values()
                     if i.origin.instance == origin.instance or i.origin.instance.startswith(prefix)]:
            self.exited(inst.origin, True, time)

    def set_job_hang_interval(self, seconds: float | None, time: float, phase: str | None = None) -> None:
        """Change the job-hang interval at ``time`` (R6 staged intervals, SDK ``reset_config`` and
        ``hang_detect``); None/<=0 = off. ``phase``: the run's phase the interval belongs to
        (``ftwatch.pipeline.sources.phases``), named in the hang finding; None: no phase (the
        SDK's own interval).

        Takes effect at the next ``check``. From one interval to another, silence already
        accumulated counts against the new value (1800 s -> 180 s after 200 s silent fires). From
        off to on, the silence clock of every instance restarts at ``time``: silence inside a
        ``hang_detect(-1)`` scope (an evaluation phase) never counts against the interval restored
        when the scope ends.
        """
        new = _interval(seconds)
        if self.job_hang_interval is None and new is not None:
            self._armed = time
        self.job_hang_interval = new
        self.phase = phase

    def reset(self, time: float, forget: bool = False) -> None:
        """A new attempt begins at ``time``: both timers re-arm, and every instance still tracked
        as running counts as started at ``time`` (``forget``: none is tracked any more; a source
        without process starts meets them again by their output)."""
        if forget:
            self._running.clear()
        self._first_ok_exit = None
        self._hang_fired = self._exit_hang_fired = False
        self._armed = None
        for inst in self._running.values():
            inst.last, inst.spoke = time, False

    def rearm(self) -> None:
        """Let the job-hang timer fire again in this attempt (after a hang that only notified: call
        it when output resumes, so one hang episode makes one finding)."""
        self._hang_fired = False

    # ------------------------------------------------------------------ checks

    @property
    def hang_due(self) -> bool:
        """Whether a job hang, or an exit hang whose timer runs, can still fire this attempt
        (detection on, instances tracked, not fired yet): a silent job is then still being judged
        (``watch`` keeps its state)."""
        if not self._running:
            return False
        return ((self.job_hang_interval is not None and not self._hang_fired)
                or (self._first_ok_exit is not None and self.exit_hang_interval is not None
                    and not self._exit_hang_fired))

    @property
    def running(self) -> tuple[Origin, ...]:
        """The instances tracked as running."""
        return tuple(i.origin for i in self._running.values())

    def last_output(self) -> float | None:
        """The latest time any running instance wrote output (epoch s), None before any did."""
        return max((i.last for i in self._running.values() if i.spoke), default=None)

    def check(self, now: float) -> list[Finding]:
        """Findings for the timers that are due at ``now`` (each fires at most once per attempt).

        Returns:
            [] or [hang finding] and/or [exit-hang finding], kinds ``hang`` / ``exit_hang``, class
            HANG, action RESTART_JOB, origin = the culprit (the instance silent longest).
        """
        found: list[Finding] = []
        if not self._running:
            return found
        if self.job_hang_interval is not None and not self._hang_fired:
            newest = max(i.last for i in self._running.values())
            since = newest if self._armed is None else max(newest, self._armed)
            if now - since >= self.job_hang_interval:
                self._hang_fired = True
                found.append(self._job_hang(now, now - newest))
        if (self.exit_hang_interval is not None and not self._exit_hang_fired
                and self._first_ok_exit is not None and now - self._first_ok_exit >= self.exit_hang_interval):
            self._exit_hang_fired = True
            found.append(self._exit_hang(now))
        return found

    def _culprit(self) -> _Instance:
        # earliest last output; ties go to the lowest rank, then the name
        return min(self._running.values(),
                   key=lambda i: (i.last, i.origin.rank if i.origin.rank is not None else 1 << 30, i.origin.instance))

    def _job_hang(self, now: float, silent: float) -> Finding:
        c = self._culprit()
        n = len(self._running)
        last = f"last output {iso(c.last)}" if c.spoke else f"no output since its start {iso(c.last)}"
        during = f" in phase {self.phase} (its interval {self.job_hang_interval:g} s)" if self.phase else ""
        line = (f"no output from any of {n} instance{'s' if n != 1 else ''} for {silent:.0f} s{during}; "
                f"{_who(c.origin)} went silent first ({last})")
        fields = {"interval": self.job_hang_interval, "silent_for": silent, "instances": n,
                  "culprit_silent_for": now - c.last, "last_output": iso(c.last) if c.spoke else None}
        if self.phase:
            fields["phase"] = self.phase
        if self._armed is not None and self._armed > c.last:
            fields["detection_on_since"] = iso(self._armed)   # silence before it did not count
        return self._finding("hang.job", "hang", c, now, line, _SOURCE, fields)

    def _exit_hang(self, now: float) -> Finding:
        c = self._culprit()
        assert self._first_ok_exit is not None
        waited = now - self._first_ok_exit
        line = (f"an instance exited successfully {waited:.0f} s ago but the job has not ended; "
                f"{len(self._running)} still running, {_who(c.origin)} silent longest "
                f"(for {now - c.last:.0f} s)")
        return self._finding("hang.exit", "exit_hang", c, now, line, _EXIT_SOURCE, {
            "interval": self.exit_hang_interval, "first_ok_exit": iso(self._first_ok_exit),
            "still_running": len(self._running), "culprit_silent_for": now - c.last})

    def _finding(self, rule_id: str, kind: str, c: _Instance, now: float, line: str, source: str,
                 fields: dict) -> Finding:
        self._seq += 1
        return Finding(rule_id=rule_id, kind=kind, failure_class=FailureClass.HANG, action=Action.RESTART_JOB,
                       severity=Severity.ERROR, origin=c.origin, line=line, time=now, seq=self._seq,
                       fields=fields, source=source)


def _who(origin: Origin) -> str:
    return f"rank {origin.rank}" if origin.rank is not None else origin.instance


def _interval(seconds: float | None) -> float | None:
    return None if seconds is None or seconds <= 0 else float(seconds)
