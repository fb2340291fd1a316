"""The local actuator of ``ftwatch run``: carries out the policy's plans on this machine's workers
(SPEC A1-A3, D5 MindCluster strategies).

:class:`LocalActuator` executes a :class:`~ftwatch.policy.plan.Plan` by composition: it holds the
supervisor, the SDK's control socket, the slots, the scene, the recorder and the clock, and
offers the steps a plan is made of: stop and drain, start every worker, restart some instances
(Async, or MindCluster in place), exclude devices, dump (last words), keep the scene, and the
MindCluster ``retry``. It decides nothing: what a decision means is ``ftwatch.policy.plan``'s.

While it waits (a retry, a dump, a kept scene, a stop) the workers' output must still be echoed
and fed to the rules, so it runs the driver's ``step(timeout)`` (``ftwatch.pipeline.run``: poll
the supervisor, handle each item, answer the SDK): the one poll-and-handle loop body, given with
:meth:`LocalActuator.drive`.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Protocol

from ftwatch.clock import Clock
from ftwatch.config.mindcluster import MindClusterConfig, signal_number
from ftwatch.events import Decision, Finding
from ftwatch.pipeline.actuators.recovery import DumpWatch, RecoveryHandler, RetryWatch
from ftwatch.pipeline.actuators.scene import Scene
from ftwatch.pipeline.actuators.slots import Slots
from ftwatch.policy.plan import Plan

POLL_SECONDS = 0.2   # the longest one step waits while the actuator waits (the run loop's tick)
DRAIN_SECONDS = 0.05  # after a stop: how long to wait for what the workers left
REPORT_SECONDS = 5.0  # a worker that ended on its own: the longest wait for its exit to be queued
                      # (its waiter queues it after its last output; sources.worker.DONE_TIMEOUT)

#: The driver's step: poll the workers up to ``timeout`` seconds, handle what came, answer the SDK;
#: returns the findings that would open an incident (a failing exit, a C4D record ...).
Step = Callable[[float], "list[Finding]"]


class Workers(Protocol):
    """What the actuator (and the run loop) need of the local supervisor
    (``ftwatch.pipeline.sources.supervisor.Supervisor``; ``ftwatch.testing.FakeSupervisor``)."""

    master_addr: str
    master_port: int
    nproc: int

    def poll(self, timeout: float) -> list[Any]: ...

    def running(self) -> set[int]: ...

    def wait_reported(self, timeout: float) -> bool: ...

    def resize(self, nproc: int, env: Mapping[str, str]) -> None: ...

    def start_all(self, restart_count: int, *, reschedule: bool = False) -> None: ...

    def restart_instance(self, rank: int) -> None: ...

    def stop_all(self, grace: float | None = None) -> list[Any]: ...

    def close(self) -> None: ...


class Channel(Protocol):
    """What the actuator needs of the SDK's control socket (``ControlServer``): who subscribed to
    pushed notices (``subscribers.instances(kind)``, ``subscribers.notify(kind, body, to)``) and
    answering queued requests (``drain(handler)``)."""

    subscribers: Any

    def drain(self, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> int: ...


class RetryResult(NamedTuple):
    """How a MindCluster ``retry`` went.

    Attributes:
        outcome: ``skipped`` (no live worker subscribed: the fault is left alone), ``again`` (the
            same fault after a retry: escalate), ``recovered``, ``pending`` (interrupted) or
            ``failed: <why>``.
        watch: the retry's watch (answers, steps), None when skipped or again.
        trigger: a failing exit seen meanwhile (it ended the retry), else None.
    """

    outcome: str
    watch: RetryWatch | None = None
    trigger: Finding | None = None

    @property
    def recovered(self) -> bool:
        """The fault needs no incident: the workers recovered, or none could be asked."""
        return self.outcome in ("recovered", "skipped")


class LocalActuator:
    """Carries out plans on the local workers.

    Args:
        supervisor: the workers (:class:`Workers`).
        control: the SDK's socket (:class:`Channel`).
        controls: the control handler; the retry and dump watches are set on it while under way.
        slots: the job's devices; a plan's exclusions are applied here.
        scene: the workers' pids and exits (dump targets, the kept scene's text).
        recorder: ``say``, ``event``.
        clock: wall and monotonic time.
        job: the job id.
        mindcluster: the strategies (``dump`` signal and grace, ``retry`` timeout).
        restart_delay: seconds to wait before a restart.
        keep_scene_seconds: A3: how long a failed job's workers are left as they are (0: off).
        state_dir: shown in the kept scene's text.
        stop: set when ftwatch is asked to stop: every wait ends.
    """

    def __init__(self, supervisor: Workers, control: Channel, controls: RecoveryHandler, slots: Slots,
                 scene: Scene, recorder: Any, clock: Clock, *, job: str, mindcluster: MindClusterConfig,
                 restart_delay: float = 0.0, keep_scene_seconds: float = 0.0, state_dir: Path | str = ".",
                 stop: threading.Event | None = None):
        self.supervisor, self.control, self.controls = supervisor, control, controls
        self.slots, self.scene, self.recorder, self.clock = slots, scene, recorder, clock
        self.job, self.mc = job, mindcluster
        self.restart_delay, self.keep_scene_seconds, self.state_dir = restart_delay, keep_scene_seconds, state_dir
        self.stop_requested = stop or threading.Event()
        self.step: Step = lambda timeout: []
        self.reschedule = False          # the next start moves the job (A2): set by a plan
        self.retried: set[str] = set()   # fingerprints retried in this attempt (once each)

    def drive(self, step: Step) -> None:
        """Use the driver's ``step`` while waiting (see the module docstring)."""
        self.step = step

    def new_attempt(self) -> None:
        """A new attempt starts: its faults may be retried again."""
        self.retried.clear()

    # -- the workers -----------------------------------------------------------------------------

    def running(self) -> set[int]:
        """The ranks whose worker runs."""
        return self.supervisor.running()

    def start_all(self, attempt: int) -> None:
        """Start one worker per active slot, on the slots' devices (a rescheduling when the last
        plan said so)."""
        self.supervisor.resize(self.slots.nproc, self.slots.env())
        self.supervisor.start_all(restart_count=attempt, reschedule=self.reschedule)
        self.reschedule = False

    def stop(self) -> None:
        """Stop every worker (SIGTERM, grace, SIGKILL) and take what they left (one step; without
        waiting when none was running: their exits and output are queued already)."""
        stopping = bool(self.supervisor.running())
        if stopping:
            self.recorder.say("ftwatch: stopping all workers")
            self.supervisor.stop_all()
        else:          # none runs, but an exit may not be queued yet: it must not reach the next attempt
            self.supervisor.wait_reported(REPORT_SECONDS)
        self.step(DRAIN_SECONDS if stopping else 0.0)   # none ran: take what is queued, wait for nothing

    def stop_all(self) -> None:
        """Stop whatever still runs, without taking its output (the end of the job)."""
        self.supervisor.stop_all()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` before a restart (ends early when ftwatch is asked to stop)."""
        if seconds > 0:
            self.stop_requested.wait(seconds)

    # -- plans -----------------------------------------------------------------------------------

    def carry_out(self, plan: Plan, decision: Decision) -> None:
        """The part of ``plan`` that is due at once: its devices leave the slots (one
        ``device_isolated`` event each) and its rescheduling is noted for the next start. The
        restarts themselves: :meth:`restart_instances`, :meth:`start_all` (the driver's loop)."""
        if plan.exclude:
            self.slots.exclude(plan.exclude, decision.time, decision.attempt)
            for e in plan.exclude:
                self.recorder.event(self.clock.time(), self.job, "device_isolated", decision.target.instance,
                                    decision.target.rank, device=e.device, devices=self.slots.active)
        if plan.kind != "in_place":
            self.reschedule = plan.reschedule

    def restart_instances(self, plan: Plan, decision: Decision) -> None:
        """Restart ``plan.ranks`` only, the others run on: MindCluster in place (``in_place``) or an
        Async ``restart_instance`` (``instance``)."""
        self.pause(self.restart_delay)
        for rank in plan.ranks:
            if plan.kind == "in_place":
                self.recorder.say(f"ftwatch: restarting rank {rank} in place")
            self.supervisor.restart_instance(rank)
            if plan.kind == "instance":
                self.recorder.event(self.clock.time(), self.job, "instance_restart", f"worker-{rank}", rank,
                                    action=decision.action.label)

    # -- MindCluster strategies and the scene ------------------------------------------------------

    def retry(self, fault: Finding) -> RetryResult:
        """MindCluster retry: ask the live workers to recover in place (SDK ``on_retry``) and wait
        until each acknowledged and reported a step (a failing exit meanwhile ends it).

        Without a subscribed worker the fault is left alone (``skipped``: as without retry); the
        same fault again after a retry is not retried (``again``)."""
        running = {f"worker-{r}" for r in self.supervisor.running()}
        asked = self.control.subscribers.instances("retry") & running
        if not asked:
            return RetryResult("skipped")
        if fault.fingerprint in self.retried:
            self.recorder.say(f"ftwatch: {fault.rule_id} again on {fault.origin.instance} after a retry: escalating")
            return RetryResult("again")
        self.retried.add(fault.fingerprint)
        watch = RetryWatch(uuid.uuid4().hex[:12], fault, set(), self.clock.mono(), self.mc.retry_timeout)
        self.controls.retry = watch
        watch.asked = self.control.subscribers.notify(
            "retry", {"id": watch.id, "rule": fault.rule_id, "line": fault.line, "instance": fault.origin.instance,
                      "rank": fault.rank}, asked)
        if not watch.asked:                    # every subscriber's connection was gone
            self.controls.retry = None
            return RetryResult("skipped")
        self.recorder.say(f"ftwatch: MindCluster retry {watch.id}: asking {', '.join(sorted(watch.asked))} "
                          f"to recover in place from {fault.rule_id}")
        ended: list[Finding] = []

        def failed(trigger: Finding) -> None:
            if not ended:
                ended.append(trigger)
                watch.fail(f"{trigger.origin.instance} ended ({trigger.line})")

        try:
            self.wait(lambda: watch.outcome(self.clock.mono()) != "pending", on_trigger=failed)
        finally:
            self.controls.retry = None
        outcome = watch.outcome(self.clock.mono())
        self.recorder.event(self.clock.time(), self.job, "retry", fault.origin.instance, fault.rank,
                            id=watch.id, rule=fault.rule_id, outcome=outcome, asked=sorted(watch.asked))
        if outcome != "recovered":
            self.recorder.say(f"ftwatch: MindCluster retry {watch.id} {outcome}")
        return RetryResult(outcome, watch, ended[0] if ended else None)

    def dump(self) -> None:
        """MindCluster dump: signal the live workers for last words, wait up to ``dump_grace``.

        Only workers whose main process installed ``Monitor.on_dump`` (SDK ``dump_ready``, by
        pid) are signalled: the signal's default action would kill the others. A worker started
        through a shell wrapper (``sh -c "python train.py"``) is the shell's child: it is not
        signalled unless the wrapper ``exec``s Python. A signalled worker that exits within the
        dump window counts as stopped by ftwatch, not as a failure (the run loop's exit handling)."""
        if not self.mc.has("dump"):
            return
        running = {f"worker-{r}" for r in self.supervisor.running()}
        live = {i: p for i, p in self.scene.pids().items() if i in running}
        ready = self.controls.dump_ready_pids()
        pids = {i: p for i, p in live.items() if p in ready}
        skipped = sorted(set(live) - set(pids))
        if skipped:
            self.recorder.say(f"ftwatch: not asking {', '.join(skipped)} for last words (no on_dump handler)")
        if not pids:
            return
        sig = signal_number(self.mc.dump_signal)
        watch = self.controls.dump = DumpWatch(pids, self.clock.mono(), self.mc.dump_grace)
        self.recorder.say(f"ftwatch: asking {', '.join(sorted(pids))} for last words ({self.mc.dump_signal}, "
                          f"{self.mc.dump_grace:g} s)")
        for pid in pids.values():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.wait(lambda: watch.complete(self.clock.mono()))
        finally:
            self.controls.dump = None
        outcomes = watch.outcomes()
        self.recorder.event(self.clock.time(), self.job, "dump", signal=self.mc.dump_signal, outcomes=outcomes)
        self.recorder.say("ftwatch: last words: " + "; ".join(f"{i} {o}" for i, o in outcomes.items()))

    def keep_scene(self) -> None:
        """A3: leave the workers as they are for ``keep_scene_seconds`` and say how to attach."""
        seconds = self.keep_scene_seconds
        if seconds <= 0:
            return
        sup = self.supervisor
        env = {"MASTER_ADDR": sup.master_addr, "MASTER_PORT": str(sup.master_port), "WORLD_SIZE": str(sup.nproc),
               **self.slots.env()}
        self.recorder.say(self.scene.attach_text(seconds, self.state_dir, env, os.getcwd()))
        self.recorder.event(self.clock.time(), self.job, "keep_scene", seconds=seconds, pids=self.scene.pids())
        self.wait(lambda: False, deadline=self.clock.mono() + seconds)
        self.recorder.say("ftwatch: scene released")

    # -- waiting ---------------------------------------------------------------------------------

    def wait(self, done: Callable[[], bool], deadline: float | None = None,
             on_trigger: Callable[[Finding], None] | None = None) -> None:
        """Run the driver's step until ``done()``, the monotonic ``deadline`` or a stop request.

        Args:
            done: checked before each step.
            deadline: monotonic seconds; None waits for ``done`` alone.
            on_trigger: called with each finding a step says would open an incident.
        """
        while not done() and not self.stop_requested.is_set():
            timeout = POLL_SECONDS
            if deadline is not None:
                left = deadline - self.clock.mono()
                if left <= 0:
                    return
                timeout = min(POLL_SECONDS, left)
            for trigger in self.step(timeout):
                if on_trigger is not None:
                    on_trigger(trigger)

