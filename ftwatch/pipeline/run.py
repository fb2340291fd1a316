"""``ftwatch run``: supervise the workers, feed their output to the engine, decide, act, report.

One loop, one thread (the supervisor's reader threads only fill its queue). What comes in goes to
the job's incident desk (``ftwatch.pipeline.incidents``: engine, hang tracker, findings, what opens
an incident and which instances failed, as in ``watch`` and ``replay``); the rest is acting:

    poll supervisor -> Output: print with rank prefix (not with --quiet), desk.output
                    -> ProcessExit: desk.exited (that instance's open blocks, exit finding)
    every tick      -> desk.tick: stale blocks, hang / exit-hang check
    incident        -> failing exit (Sync): settle, [dump], stop all, drain -> verdict -> act
                       (Async) verdict -> restart that instance / fail
                       hang, C4D record, notify / isolate finding: decide first; notify stops
                       nothing (the job runs on), anything else: [dump], stop all, act
    MindCluster     -> retry a live fault first (SDK on_retry); recover-in-place / keep-scene decide
                       before stopping (survivors run on / are kept); dump before any stop
    isolate_node    -> the blamed rank's device leaves the slots; restart with fewer (MIN:MAX)
    kernel log      -> each poll, the lines this host's kernel log gained (``RunParts.kernel``:
                       ``--kernel-log``, /dev/kmsg or the journal) are scanned as host evidence of
                       this node (``hostlog.host_origin``: no rank, never an instance); a finding
                       naming a GPU by PCI bus id that ``RunParts.bus_ids`` maps to a device of
                       the job's slots carries that device (``fields["device"]``: A1 excludes it
                       on isolate_node), one mapped to no slot of the job is stored only; the
                       rest are the job's, node-wide. An Xid 79 opens an incident like a
                       worker's line
    --actuator slurm -> restart_job, isolate_node, fail_job go to Slurm (``RunParts.scheduler``:
                       requeue, drain + requeue, scancel / requeuehold) once the workers are
                       stopped; done: this run ends (``requeued``: the job starts again from its
                       batch script); failed, held or a dry run: carried out here as without it

Latency (issue 16 item 3). The loop sleeps in the supervisor's poll, which returns as soon as a
worker writes or exits (or a request arrives on the SDK's control socket: ``wake``); the poll's
timeout only paces the timers (hangs, stale blocks, alert groups). The settle after a failure is
event-driven: it ends once every live worker has reported an error of its own
(``IncidentDesk.settled``; the exited ones have), at the latest ``supervisor.settle_max`` seconds
after the incident's first error (``--settle-max``). A decision is said and written to the
decisions file (``Recorder.decided``) and the actuator called before it is stored and its alert
rendered (``Recorder.published``).

The policy stage returns the final decision and its plan (``Policy.verdict``, through the desk);
an incident is settled, decided and acted on, and the attempt ended or restarted, by the
:class:`~ftwatch.pipeline.respond.Responder` (``pipeline/respond.py``); the local actuator
(``pipeline/actuators/local.py``) carries the plan out. Both run this loop's one poll-and-handle
step (``_step``) whenever they wait. Every collaborator comes built (``pipeline/build.build_run``).
Exit status: 0 if and only if the job finally succeeded.

This module is the input half and the order of an attempt: start, poll and handle (echo, desk,
phases, the kernel log, the SDK's requests), MindCluster retries, ticks, the job's end.
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TextIO

from ftwatch.clock import Clock
from ftwatch.config.model import Config
from ftwatch.events import Action, Decision, Finding, ProcessExit
from ftwatch.health.runhook import HealthChecks
from ftwatch.pipeline.actuators.local import LocalActuator, Workers
from ftwatch.pipeline.echo import echo_text
from ftwatch.pipeline.incidents import POLL_SECONDS, SETTLE_SECONDS, IncidentDesk  # noqa: F401 (re-exported)
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.actuators.recovery import RecoveryHandler
from ftwatch.pipeline.actuators.scene import Scene, describe_exit
from ftwatch.pipeline.actuators.slots import Slots
from ftwatch.pipeline.respond import Attempt, Responder
from ftwatch.pipeline.sources.hostlog import host_origin, on_devices
from ftwatch.pipeline.sources.supervisor import Output, Started
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.plan import retry_candidate
from ftwatch.policy.policy import Policy


@dataclass
class RunParts:
    """The collaborators of one :class:`JobRunner`, built once by ``ftwatch.pipeline.build.build_run``
    (tests give a fake supervisor and control socket: ``ftwatch.testing``)."""

    supervisor: Workers            # the workers: Supervisor, or any actuators.local.Workers
    control: Any                   # the SDK's socket (ControlServer): start, stop, drain, subscribers
    controls: RecoveryHandler      # answers the SDK's requests; retry / dump watches, hang scopes
    desk: IncidentDesk             # the input half: engine (its step tap wired), hang tracker, incidents
    policy: Policy                 # decides: Policy.verdict -> (final decision, plan)
    budgets: BudgetStore
    slots: Slots                   # the job's devices (A1), read here, changed by the actuator
    health: HealthChecks           # Bootcheck / Troubleshooting (H1, H3)
    scene: Scene                   # the workers' pids and exits
    actuator: LocalActuator        # carries out the plans
    clock: Clock
    kernel: Any = None             # this host's kernel log (sources.hostlog.KernelLog, opened), or None
    node: str = "localhost"        # this machine's name: the node of its kernel lines
    bus_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # PCI bus id -> device names (hostlog.gpu_bus_ids)
    scheduler: Any = None          # --actuator slurm: actuators.slurm.SlurmActuator (handles, act), or None
    cluster: Any = None            # a multi-node job's agent (pipeline.cluster.agent.ClusterAgent), or None


class JobRunner:
    """Runs one job under supervision until it succeeds or the policy fails it.

    Args:
        config: the validated config (policy, supervisor, mindcluster), with the MindCluster
            flags already translated into the policy (``build_run``).
        command: the training command, run once per worker.
        parts: the collaborators (``ftwatch.pipeline.build.build_run`` builds them).
        recorder: where decisions and findings go.
        job: the job id.
        out: where worker output is echoed, prefixed by rank.
        echo: echo the workers' output to ``out`` (``--quiet``: not).
    """

    def __init__(self, config: Config, command: Sequence[str], parts: RunParts, recorder: Recorder, job: str,
                 out: TextIO | None = None, echo: bool = True):
        self.config, self.command, self.recorder, self.job = config, list(command), recorder, job
        self.out = out or sys.stdout
        self.echo = echo
        p = self.parts = parts
        self.supervisor, self.control, self.controls = p.supervisor, p.control, p.controls
        self.desk, self.policy, self.budgets = p.desk, p.policy, p.budgets
        self.engine, self.tracker = p.desk.engine, p.desk.tracker
        self.slots, self.health, self.scene, self.clock = p.slots, p.health, p.scene, p.clock
        self.kernel, self.host = p.kernel, host_origin(p.node, job)
        self.desk.on_findings = self._retry_candidates
        self.act = p.actuator
        self.cluster = p.cluster      # multi-node: join / poll / decide go through the job's leader
        self.act.drive(self._step)
        if hasattr(p.supervisor, "wake") and hasattr(p.control, "wake"):
            p.control.wake = p.supervisor.wake      # an SDK request ends the poll's wait
        self.mc = config.mindcluster
        self.nproc = self.slots.nproc
        self.poll_seconds = self.mc.monitor_interval or POLL_SECONDS
        self.sync = config.policy.job_execution_mode == "Sync"
        # decide before stopping the workers when they may be kept: in place, or as the scene (A3)
        self.live = config.supervisor.keep_scene_seconds > 0 or self.mc.has("recover-in-place")
        self._stop_requested = self.act.stop_requested   # SIGINT / SIGTERM: every wait ends
        self._state = Attempt(self.desk.failed)
        # the acting half: settle, decide, act, end or restart (``pipeline/respond.py``)
        self.respond = Responder(p.desk, p.actuator, p.supervisor, p.policy, recorder, p.budgets, p.slots,
                                 p.health, p.scene, p.clock, job, self.mc, sync=self.sync, live=self.live,
                                 restart_delay=config.supervisor.restart_delay, step=self._step,
                                 scheduler=p.scheduler, cluster=p.cluster)
        self.final: Decision | None = None
        self.phases = None                # phases from the workers' lines (R6), their startup (issue 17)
        if config.phases.enabled or config.phases.startup:
            from ftwatch.pipeline.sources.phases import PhaseTracker
            pol = config.policy
            self.phases = PhaseTracker(config.phases, float(pol.job_hang_interval)
                                       if pol.enable_job_hang_detection and self.sync else None)

    # -- public -----------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job to its end. Returns the exit status (0 = the job succeeded)."""
        self._install_signal_handlers()
        self.control.start()
        try:
            return self._run()
        finally:
            self.supervisor.close()
            self.control.stop()
            if self.kernel is not None:
                self.kernel.close()
            self.recorder.flush_output()

    @property
    def requeued(self) -> bool:
        """Whether ``--actuator slurm`` requeued the job (this run ended; it starts again from its script)."""
        return self.respond.requeued

    def request_stop(self) -> None:
        """Stop the workers cleanly and end (SIGINT / SIGTERM to ftwatch)."""
        self._stop_requested.set()

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> int:
        while True:
            attempt = self.budgets.attempt
            self.recorder.attempt = attempt
            self.recorder.run_started(self.job, attempt, self.clock.time(), self.command)
            slots = self.slots.facts()
            if not slots.viable:               # isolations kept from an earlier ftwatch run
                decision = self.policy.below_min(slots, self.clock.time())
                self.recorder.decision(decision)
                return self.respond.end(decision, attempt)
            self.nproc = self.health.nproc = slots.nproc
            self.health.devices = self.slots.checked or []   # each check agent on its slot's device
            blocking = self.health.bootcheck(attempt)     # H1: before every start and restart
            self.recorder.say(f"ftwatch: starting {self.nproc} workers (attempt {attempt}): {' '.join(self.command)}")
            if slots.isolated:
                self.recorder.say(f"ftwatch: {slots.describe()}")
            self.desk.new_attempt(self.clock.time(), world_size=self.nproc)
            self._state = Attempt(self.desk.failed)
            self.controls.new_attempt()
            if self.phases is not None and self.phases.start(self.clock.time(), self.tracker) is not None:
                self.recorder.event(self.clock.time(), self.job, "phase", phase=self.phases.phase,
                                    job_hang_interval=self.phases.interval())
            self.act.new_attempt()
            if blocking is not None:
                self.desk.add([blocking], record=False)    # stored by the health log already
            decision = self.respond.incident(blocking, self._state) if blocking is not None else None
            if decision is None and self.cluster is not None:
                decision = self.cluster.join(attempt)    # this generation's world, or this node's end
            if decision is None and not self._stop_requested.is_set():
                self.act.start_all(attempt)
                decision = self._watch()
            self.final = decision
            if decision is not None and decision.action is not Action.NONE:
                self.health.troubleshoot(attempt, restarting=decision.action is not Action.FAIL_JOB)
            if decision is None:                 # interrupted: the job did not end, budgets stay
                self.recorder.run_ended(self.job, attempt, self.clock.time(), "stopped")
                return 130
            if decision.action in (Action.NONE, Action.NOTIFY, Action.FAIL_JOB):
                status = self.respond.end(decision, attempt)   # notify: a failure after training finished
                if decision.action is Action.FAIL_JOB:
                    self.respond.hand_over(decision)     # --actuator slurm: scancel / requeuehold
                return status
            # restart_job, restart_in_place, isolate_node (on one machine: restart, without the device)
            status = self.respond.restart(decision, attempt)
            if status is not None:               # requeued by Slurm, or interrupted before the restart
                return status

    def _watch(self) -> Decision | None:
        """Watch one attempt; returns the decision that ends it (none = success), None if interrupted."""
        state = self._state = Attempt(self.desk.failed)
        while True:
            if self._stop_requested.is_set():
                self.respond.interrupted()
                return None
            triggers = self._step(self.poll_seconds)
            if self.cluster is not None and (ended := self.cluster.poll()) is not None:
                return ended                  # the job's decision, made on another node's incident
            while not triggers and state.retry:         # MindCluster retry, while the workers live
                fault = state.retry.pop(0)
                tried = self.act.retry(fault)
                if tried.outcome == "recovered":
                    assert tried.watch is not None
                    self.recorder.decision(self.policy.retry_recovered(
                        fault, tried.watch.stepped, len(tried.watch.asked), self.clock.time()))
                triggers = [tried.trigger] if tried.trigger is not None else [] if tried.recovered else [fault]
            state.retry.clear()
            for trigger in triggers:
                decision = self.respond.incident(trigger, state)
                if decision is not None:
                    return decision
            now = self.clock.time()
            self.recorder.resend_due(self.clock.mono())
            self.recorder.resolve_due(now)
            due = self.desk.tick(now, self.clock.mono())     # a hang, or an incident settled
            if due is not None:
                decision = self.respond.incident(due, state)
                if decision is not None:
                    return decision
            if len(self.desk.ok) == self.nproc and not self.supervisor.running():
                decision = self.policy.finished(self.clock.time(), ok=True)
                self.recorder.decision(decision)
                return decision

    def _step(self, timeout: float) -> list[Finding]:
        """The one poll-and-handle step, for the loop and every wait (settle, stop, retry, dump,
        kept scene): take what the workers sent (waiting up to ``timeout`` seconds for the first
        item), handle each, answer the SDK's requests (on this thread). Returns the findings that
        open an incident.

        The whole batch is taken before deciding: output that arrived with a failing exit (a
        peer's traceback) is evidence for that decision, not something to drop."""
        triggers = [t for t in (self._handle(i, self._state) for i in self.supervisor.poll(timeout)) if t is not None]
        if self.echo:
            self.out.flush()
        if self.kernel is not None:
            data = self.kernel.read()
            found = self._host_lines(data) if data else None
            if found is not None:
                triggers.append(found)
        self.control.drain(self.controls)
        return triggers

    def _handle(self, item, state: Attempt) -> Finding | None:
        """Take one supervisor event; return a finding that starts an incident, if any."""
        if isinstance(item, Output):
            if self.echo:
                self.out.write(echo_text(item.origin, item.data))
            # C4D records, notify / isolate findings: an incident while the workers run (R8)
            trigger = self.desk.output(item.origin, item.data, item.time, self.clock.mono())
            if self.phases is not None and self.sync:
                phase = self.phases.follow(item.data, item.time, self.tracker, self.controls)
                if phase is not None:
                    self.recorder.event(item.time, self.job, "phase", phase=phase,
                                        job_hang_interval=self.phases.interval())
            return trigger
        if isinstance(item, Started):
            self.desk.started(item.origin, item.time)
            self.scene.started(item.origin.instance, item.origin.rank, item.pid)
            self.recorder.event(item.time, self.job, "instance_start", item.origin.instance,
                                item.origin.rank, pid=item.pid, start_count=item.start_count)
            return None
        if isinstance(item, ProcessExit):
            self.scene.exited(item.origin.instance, item.returncode, item.signal)
            if self.controls.dump is not None:
                self.controls.dump.exit(item.origin.instance, describe_exit(item.returncode, item.signal))
            return self._exited(item, state)
        return None

    def _exited(self, exit: ProcessExit, state: Attempt) -> Finding | None:
        """A worker ended: recorded, then judged by the desk (a failing exit is a trigger)."""
        self.recorder.event(exit.time, self.job, "instance_exit", exit.origin.instance, exit.origin.rank,
                            returncode=exit.returncode, signal=exit.signal, stopped_by_us=exit.stopped_by_us)
        # ended while writing the last words we asked for: as if stopped by us
        dumping = self.controls.dump is not None and exit.origin.instance in self.controls.dump.asked
        return self.desk.exited(exit, self.clock.mono(), expected=dumping)

    def _host_lines(self, data: bytes) -> Finding | None:
        """Lines of this host's kernel log: their findings to the desk (a GPU they name by PCI bus
        id is that of the job's slot, or the finding is not the job's: stored only); returns the
        finding that opened an incident, if any."""
        found = self.engine.feed(self.host, data, self.clock.time())
        mine, others = on_devices(found, self.parts.bus_ids, self.slots.checked or [])
        self.recorder.findings(others)
        return self.desk.add(mine, self.clock.mono())

    # -- helpers ----------------------------------------------------------------------------

    def _retry_candidates(self, findings: list[Finding]) -> None:
        """The desk's ``on_findings``: faults a MindCluster retry may answer."""
        if self.mc.has("retry"):
            self._state.retry += [f for f in findings if retry_candidate(f)]

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.request_stop())
