"""``ftwatch run``: supervise the workers, feed their output to the engine, decide, act, report.

One loop, one thread (the supervisor's reader threads only fill its queue). What comes in goes to
the job's incident desk (``ftwatch.pipeline.incidents``: engine, hang tracker, findings, what opens
an incident and which instances failed, as in ``watch`` and ``replay``); the rest is acting:

    poll supervisor -> Output: print with rank prefix, desk.output
                    -> ProcessExit: desk.exited (that instance's open blocks, exit finding)
    every tick      -> desk.tick: stale blocks, hang / exit-hang check
    incident        -> failing exit (Sync): settle, [dump], stop all, drain -> policy.decide -> act
                       (Async) policy.decide -> restart that instance / fail
                       hang, C4D record, notify / isolate finding: decide first; notify stops
                       nothing (the job runs on), anything else: [dump], stop all, act
    MindCluster     -> retry a live fault first (SDK on_retry); recover-in-place / keep-scene decide
                       before stopping (survivors run on / are kept); dump before any stop
    isolate_node    -> the blamed rank's device leaves the slots; restart with fewer (MIN:MAX)

Exit status: 0 if and only if the job finally succeeded.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, TextIO

from ftwatch.clock import SystemClock
from ftwatch.config.model import Config
from ftwatch.config.mindcluster import policy_overrides
from ftwatch.events import Action, Decision, Finding, ProcessExit, Target
from ftwatch.health.runhook import HealthChecks
from ftwatch.pipeline.actuators.local import RecoveryActs
from ftwatch.pipeline.sources.control import ControlServer
from ftwatch.pipeline.build import build_policy
from ftwatch.pipeline.echo import echo_text
from ftwatch.pipeline.incidents import POLL_SECONDS, SETTLE_SECONDS, IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.actuators.recovery import RecoveryHandler, isolate_devices, plan, retry_candidate
from ftwatch.pipeline.actuators.scene import Scene, describe_exit
from ftwatch.pipeline.actuators.slots import Slots
from ftwatch.pipeline.sources.orphans import WorkerRecord
from ftwatch.pipeline.sources.supervisor import Output, Started, Supervisor
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import rules_from_keywords


@dataclass
class _Attempt:
    failed: set[str] = field(default_factory=set)           # the desk's set of failed instances
    retry: list[Finding] = field(default_factory=list)      # faults a MindCluster retry may answer
    retried: set[str] = field(default_factory=set)          # their fingerprints, once each


class JobRunner(RecoveryActs):
    """Runs one job under supervision until it succeeds or the policy fails it.

    Args:
        config: the validated config (policy, supervisor, storage ...).
        command: the training command, run once per worker.
        engine: the rule engine.
        recorder: where decisions and findings go.
        job: the job id.
        out: where worker output is echoed, prefixed by rank.
    """

    def __init__(self, config: Config, command: Sequence[str], engine: Engine, recorder: Recorder,
                 job: str, out: TextIO | None = None, clock: SystemClock | None = None):
        if policy_overrides(config.mindcluster):           # M3 translated into the policy (M4)
            config = config.with_policy(**policy_overrides(config.mindcluster))
        self.config = config
        self.command = list(command)
        self.engine = engine
        self.recorder = recorder
        self.job = job
        self.out = out or sys.stdout
        self.clock = clock or SystemClock()
        self.mc = config.mindcluster
        state_dir = Path(config.storage.state_dir)
        self.budgets = BudgetStore.for_job(state_dir, job)
        self.policy = build_policy(config, job, self.budgets)
        sup = config.supervisor
        self.slots = Slots.for_job(state_dir, job, sup.nproc_range, sup.devices)
        self.nproc = self.slots.nproc
        self.node = socket.gethostname()
        self.poll_seconds = self.mc.monitor_interval or POLL_SECONDS
        self.control = ControlServer(state_dir)     # the SDK's socket (ftwatch.sdk), started in run()
        env = self.control.env()
        if self.mc.has("dump"):
            env["FTWATCH_DUMP_SIGNAL"] = self.mc.dump_signal
        self.supervisor = Supervisor(self.command, max(1, self.nproc), job=job, node=self.node,
                                     grace_period=sup.grace_period, master_addr=sup.master_addr,
                                     master_port=sup.master_port, env=env,
                                     record=WorkerRecord(state_dir, recorder.say))   # the next start reaps orphans
        pol = config.policy
        sync = pol.job_execution_mode == "Sync"
        hang = float(pol.job_hang_interval) if pol.enable_job_hang_detection and sync else None
        # the job's incident desk: engine, hang tracker (from the policy), findings, incidents
        self.desk = IncidentDesk(job, engine, self.policy, recorder, exits=True,
                                 settle=SETTLE_SECONDS if sync else 0.0, on_findings=self._retry_candidates)
        self.tracker = self.desk.tracker
        self.controls = RecoveryHandler(
            engine, self.tracker, recorder, job, rules_from_keywords, hang, hang_supported=hang is not None,
            budgets=lambda: (self.budgets.restarts_used,
                             max(0, self.policy.max_restarts - self.budgets.restarts_used)),
            node=self.node, clock=self.clock.time)
        self.sync = sync
        # decide before stopping the workers when they may be kept: in place, or as the scene (A3)
        self.live = sup.keep_scene_seconds > 0 or self.mc.has("recover-in-place")
        self.scene = Scene()
        self.health = HealthChecks(config, recorder, job, self.node, self.nproc, self.slots.active,
                                   steps=engine.steps)   # H1, H3
        self._stop_requested = threading.Event()
        self._state = _Attempt(self.desk.failed)
        self._reschedule = False     # the next start moves the job (isolation, MindCluster recover): A2
        self.final: Decision | None = None

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
            self.recorder.flush_output()

    def request_stop(self) -> None:
        """Stop the workers cleanly and end (SIGINT / SIGTERM to ftwatch)."""
        self._stop_requested.set()

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> int:
        while True:
            attempt = self.budgets.attempt
            self.recorder.attempt = attempt
            self.recorder.run_started(self.job, attempt, self.clock.time(), self.command)
            if not self.slots.viable:          # isolations kept from an earlier ftwatch run
                return self._end(self._below_min(), attempt)
            self.nproc = self.health.nproc = self.slots.nproc
            self.health.devices = list(self.slots.active)    # each check agent on its slot's device
            self.supervisor.resize(self.nproc, self.slots.env())
            blocking = self.health.bootcheck(attempt)     # H1: before every start and restart
            self.recorder.say(f"ftwatch: starting {self.nproc} workers (attempt {attempt}): {' '.join(self.command)}")
            if self.slots.isolated:
                self.recorder.say(f"ftwatch: {self.slots.describe()}")
            self.desk.new_attempt(self.clock.time(), world_size=self.nproc)
            self._state = _Attempt(self.desk.failed)
            self.controls.new_attempt()
            if blocking is not None:
                self.desk.add([blocking], record=False)    # stored by the health log already
            decision = self._incident(blocking, self._state) if blocking is not None else None
            if decision is None:
                self.supervisor.start_all(restart_count=attempt, reschedule=self._reschedule)
                self._reschedule = False
                decision = self._watch()
            self.final = decision
            if decision is not None and decision.action is not Action.NONE:
                self.health.troubleshoot(attempt, restarting=decision.action is not Action.FAIL_JOB)
            if decision is None:                 # interrupted: the job did not end, budgets stay
                self.recorder.run_ended(self.job, attempt, self.clock.time(), "stopped")
                return 130
            if decision.action in (Action.NONE, Action.FAIL_JOB):
                return self._end(decision, attempt)
            # restart_job, restart_in_place, isolate_node (on one machine: restart, without the device)
            if self.supervisor.running():        # Async isolate_node: the others still run
                self._dump()
                self._stop_and_drain(self._state)
            self.recorder.run_ended(self.job, attempt, self.clock.time(), "restarted")
            self.recorder.event(self.clock.time(), self.job, "job_restart", attempt=attempt,
                                action=decision.action.label)
            self.recorder.say(f"ftwatch: restarting all {self.slots.nproc} workers "
                              f"(restart {decision.restarts_used} of {self.policy.max_restarts})")
            self._sleep(self.config.supervisor.restart_delay)
            if self._stop_requested.is_set():     # interrupted while waiting to restart
                self.recorder.say("ftwatch: interrupted before the restart")
                self.recorder.event(self.clock.time(), self.job, "interrupted")
                return 130

    def _end(self, decision: Decision, attempt: int) -> int:
        """The job ended: success, or a final failure (scene kept, last words, workers stopped)."""
        ok = decision.action is Action.NONE
        if not ok and self.supervisor.running():
            self._keep_scene()
            self._dump()
            self._stop_and_drain(self._state)
        self.supervisor.stop_all()
        self.recorder.resolve_open(self.clock.time(), "the job finished successfully" if ok
                                   else "superseded: the job failed")
        self.recorder.run_ended(self.job, attempt, self.clock.time(), "succeeded" if ok else "failed")
        self.budgets.close("succeeded" if ok else "failed")
        self.slots.close("succeeded" if ok else "failed")
        return 0 if ok else 1

    def _below_min(self) -> Decision:
        rng = self.slots.range
        decision = Decision(self.clock.time(), Action.FAIL_JOB, Target(self.job), None,
                            f"A1 local: {self.slots.describe()}: {self.slots.nproc} healthy device(s), below the "
                            f"minimum {rng.min} of --nproc-per-node {rng} → fail_job",
                            self.budgets.restarts_used, 0, attempt=self.budgets.attempt)
        self.recorder.decision(decision)
        return decision

    def _watch(self) -> Decision | None:
        """Watch one attempt; returns the decision that ends it (none = success), None if interrupted."""
        state = self._state = _Attempt(self.desk.failed)
        while True:
            if self._stop_requested.is_set():
                return self._interrupted(state)
            # Take the whole batch before deciding: output that arrived with a failing exit
            # (a peer's traceback) is evidence for that decision, not something to drop.
            triggers = [t for t in (self._handle(i, state) for i in self.supervisor.poll(self.poll_seconds))
                        if t is not None]
            while not triggers and state.retry:         # MindCluster retry, while the workers live
                fault = state.retry.pop(0)
                recovered, trigger = self._retry(fault, state)
                triggers = [trigger] if trigger is not None else [] if recovered else [fault]
            state.retry.clear()
            for trigger in triggers:
                decision = self._incident(trigger, state)
                if decision is not None:
                    return decision
            self.control.drain(self.controls)     # SDK requests, on this thread
            now = self.clock.time()
            self.recorder.resend_due(self.clock.mono())
            self.recorder.resolve_due(now)
            due = self.desk.tick(now, self.clock.mono())     # a hang, or an incident settled
            if due is not None:
                decision = self._incident(due, state)
                if decision is not None:
                    return decision
            if len(self.desk.ok) == self.nproc and not self.supervisor.running():
                decision = self.policy.finished(self.clock.time(), ok=True)
                self.recorder.decision(decision)
                return decision

    def _handle(self, item, state: _Attempt) -> Finding | None:
        """Take one supervisor event; return a finding that starts an incident, if any."""
        if isinstance(item, Output):
            self._echo(item)
            # C4D records, notify / isolate findings: an incident while the workers run (R8)
            return self.desk.output(item.origin, item.data, item.time, self.clock.mono())
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

    def _exited(self, exit: ProcessExit, state: _Attempt) -> Finding | None:
        """A worker ended: recorded, then judged by the desk (a failing exit is a trigger)."""
        self.recorder.event(exit.time, self.job, "instance_exit", exit.origin.instance, exit.origin.rank,
                            returncode=exit.returncode, signal=exit.signal, stopped_by_us=exit.stopped_by_us)
        # ended while writing the last words we asked for: as if stopped by us
        dumping = self.controls.dump is not None and exit.origin.instance in self.controls.dump.asked
        return self.desk.exited(exit, self.clock.mono(), expected=dumping)

    def _incident(self, trigger: Finding, state: _Attempt) -> Decision | None:
        """Decide on a failure, a hang or a log finding that opens an incident, and act.

        A failing exit in Sync: stop the workers first (last words before), unless they may be
        kept (``self.live``: recover-in-place, keep-scene). A hang or a log finding (C4D record,
        notify / isolate finding): decide first, while the workers run; a ``notify`` (or ``none``)
        decision is recorded and stops nothing (the job runs on, ModelArts hang-retry off, C4D
        Warn); anything else stops them before acting."""
        is_hang = trigger.kind in ("hang", "exit_hang")
        is_exit = trigger.kind == "exit_code"
        if self.sync and not is_hang:
            self._settle(state)
        stop = self.sync or is_hang or not is_exit
        if stop and is_exit and not self.live:
            self._dump()
            self._stop_and_drain(state)
        decision = self.desk.decide(trigger, self.clock.time(), self.clock.mono())
        if not is_exit and decision.action in (Action.NONE, Action.NOTIFY):
            self.recorder.decision(decision)       # told a person (or below the log level): run on
            return None                            # (a hang: the desk re-arms it when output resumes)
        failed = {self._rank(i) for i in state.failed} - {None}
        decision, how = plan(decision, self.mc, failed, bool(self.supervisor.running()))
        decision, isolated = isolate_devices(decision, self.slots)
        device = isolated[0] if isolated else None
        self.recorder.decision(decision)
        for one in isolated:
            self.recorder.event(self.clock.time(), self.job, "device_isolated", decision.target.instance,
                                decision.target.rank, device=one, devices=self.slots.active)
        if how.kind == "in_place":
            return self._in_place(how, state)
        # A2: the job moves (MA_SCHEDULE_CNT + 1, MA_PROC_START_CNT back to 1) after an isolation,
        # a MindCluster recover, or any ModelArts job reschedule (seed 002: the job is rebuilt)
        self._reschedule = how.kind == "job" and (
            device is not None or self.mc.has("recover")
            or (self.policy.modelarts is not None and decision.action in (Action.RESTART_JOB, Action.ISOLATE_NODE)))
        one_instance = decision.action is Action.RESTART_INSTANCE or (
            not self.sync and decision.action is Action.RESTART_IN_PLACE)
        if one_instance and decision.target.rank is not None:
            go, replaced = self._checked_instance_restart([decision.target.rank], state)
            if not go:                       # H1: a hardware fault; decided on instead
                return replaced
            self._sleep(self.config.supervisor.restart_delay)
            state.failed.discard(decision.target.instance or "")
            self.supervisor.restart_instance(decision.target.rank)
            self.recorder.event(self.clock.time(), self.job, "instance_restart", decision.target.instance,
                                decision.target.rank, action=decision.action.label)
            return None
        if not self.sync and not is_hang and decision.action in (Action.NONE, Action.NOTIFY):
            return None                      # Async: told a person; the others run on
        if stop and (self.live or not is_exit) and decision.action is not Action.FAIL_JOB:
            self._dump()                     # a final failure keeps the scene first (_end)
            self._stop_and_drain(state)
        return decision

    def _rank(self, instance: str) -> int | None:
        w = self.scene.workers.get(instance)
        return w.rank if w is not None else None

    def _settle(self, state: _Attempt) -> None:
        """Give the other workers the desk's settle time (SETTLE_SECONDS from the incident's
        opening; from now for a trigger the desk did not open, e.g. a fault a retry did not
        answer) to print (or exit with) their own errors."""
        mono = self.clock.mono()
        deadline = mono + (self.desk.settle_left(mono) if self.desk.open is not None else SETTLE_SECONDS)
        while self.supervisor.running() and self.clock.mono() < deadline:
            for item in self.supervisor.poll(min(POLL_SECONDS, max(0.0, deadline - self.clock.mono()))):
                self._handle(item, state)

    def _stop_and_drain(self, state: _Attempt) -> None:
        """Stop every worker (SIGTERM, grace, SIGKILL) and take all the output they left."""
        if self.supervisor.running():
            self.recorder.say("ftwatch: stopping all workers")
            self.supervisor.stop_all()
        for item in self.supervisor.poll(0.05):
            self._handle(item, state)
        now = self.clock.time()
        for origin in self.engine.pending_origins():
            self._add(state, self.engine.flush(origin, now))

    def _interrupted(self, state: _Attempt) -> None:
        self.recorder.say("ftwatch: interrupted, stopping all workers")
        self._stop_and_drain(state)
        self.recorder.event(self.clock.time(), self.job, "interrupted")
        return None

    # -- helpers ----------------------------------------------------------------------------

    def _add(self, state: _Attempt, findings: list[Finding]) -> None:
        """Findings made beside the output (drained blocks, a Bootcheck): to the desk."""
        self.desk.add(findings, self.clock.mono())

    def _retry_candidates(self, findings: list[Finding]) -> None:
        """The desk's ``on_findings``: faults a MindCluster retry may answer."""
        if self.mc.has("retry"):
            self._state.retry += [f for f in findings if retry_candidate(f)]

    def _echo(self, item: Output) -> None:
        self.out.write(echo_text(item.origin, item.data))
        self.out.flush()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stop_requested.wait(seconds)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.request_stop())
