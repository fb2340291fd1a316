"""``ftwatch run``: supervise the workers, feed their output to the engine, decide, act, report.

One loop, one thread (the supervisor's reader threads only fill its queue):

    poll supervisor -> Output: print with rank prefix, engine.feed, hang tracker
                    -> ProcessExit: flush that instance's open blocks, exit finding, maybe an incident
    every tick      -> flush stale blocks, hang / exit-hang check
    incident        -> (Sync) settle, stop all, drain -> policy.decide -> act (restart / fail)
                       (Async) policy.decide -> restart that instance / fail

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
from ftwatch.config import Config
from ftwatch.events import Action, Decision, Finding, Origin, ProcessExit
from ftwatch.health.runhook import HealthChecks
from ftwatch.pipeline.control import ControlHandler, ControlServer
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.supervisor import Output, Started, Supervisor
from ftwatch.rules.budgets import BudgetStore
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import rules_from_keywords
from ftwatch.rules.policy import Incident, Policy
from ftwatch.rules.timers import HangTracker

POLL_SECONDS = 0.2         # how often the loop wakes with nothing to read (the Tick period)
SETTLE_SECONDS = 1.0       # after a failure, how long the others may show their own errors
BLOCK_FLUSH_SECONDS = 2.0  # an open traceback with no new line for this long is closed (P1)
_STREAMS = ("stdout", "stderr")


@dataclass
class _Attempt:
    findings: list[Finding] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    ok: set[str] = field(default_factory=set)


class JobRunner:
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
        self.config = config
        self.command = list(command)
        self.engine = engine
        self.recorder = recorder
        self.job = job
        self.out = out or sys.stdout
        self.clock = clock or SystemClock()
        state_dir = Path(config.storage.state_dir)
        self.budgets = BudgetStore.for_job(state_dir, job)
        self.policy = Policy(config.policy, self.budgets, job)
        self.exit_table = ExitCodeTable.load()
        sup = config.supervisor
        self.nproc = sup.nproc_per_node
        self.node = socket.gethostname()
        self.control = ControlServer(state_dir)     # the SDK's socket (ftwatch.sdk), started in run()
        self.supervisor = Supervisor(self.command, self.nproc, job=job, node=self.node,
                                     grace_period=sup.grace_period, master_addr=sup.master_addr,
                                     master_port=sup.master_port, env=self.control.env())
        pol = config.policy
        sync = pol.job_execution_mode == "Sync"
        hang = float(pol.job_hang_interval) if pol.enable_job_hang_detection and sync else None
        self.tracker = HangTracker(
            hang, float(pol.job_exit_hang_interval) if pol.enable_job_exit_hang_detection and sync else None)
        self.controls = ControlHandler(
            engine, self.tracker, recorder, job, rules_from_keywords, hang, hang_supported=hang is not None,
            budgets=lambda: (self.budgets.restarts_used,
                             max(0, pol.max_num_of_job_restart - self.budgets.restarts_used)),
            node=self.node, clock=self.clock.time)
        self.sync = sync
        self.health = HealthChecks(config, recorder, job, self.node, self.nproc)   # H1, H3
        if self.health.steps is not None:
            engine.set_steps(self.health.steps)
        self._stop_requested = threading.Event()
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

    def request_stop(self) -> None:
        """Stop the workers cleanly and end (SIGINT / SIGTERM to ftwatch)."""
        self._stop_requested.set()

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> int:
        while True:
            attempt = self.budgets.attempt
            self.recorder.attempt = attempt
            self.recorder.run_started(self.job, attempt, self.clock.time(), self.command)
            blocking = self.health.bootcheck(attempt)     # H1: before every start and restart
            self.recorder.say(f"ftwatch: starting {self.nproc} workers (attempt {attempt}): "
                              f"{' '.join(self.command)}")
            self.tracker.reset(self.clock.time())
            self.controls.new_attempt()
            decision = self._incident(blocking, _Attempt([blocking])) if blocking is not None else None
            if decision is None:
                self.supervisor.start_all(restart_count=attempt)
                decision = self._watch()
            self.final = decision
            if decision is not None and decision.action is not Action.NONE:
                self.health.troubleshoot(attempt, restarting=decision.action is not Action.FAIL_JOB)
            if decision is None:                 # interrupted: the job did not end, budgets stay
                self.recorder.run_ended(self.job, attempt, self.clock.time(), "stopped")
                return 130
            if decision.action in (Action.NONE,):
                self.recorder.run_ended(self.job, attempt, self.clock.time(), "succeeded")
                self.budgets.close("succeeded")
                return 0
            if decision.action is Action.FAIL_JOB:
                self.supervisor.stop_all()
                self.recorder.run_ended(self.job, attempt, self.clock.time(), "failed")
                self.budgets.close("failed")
                return 1
            # restart_job, restart_in_place, isolate_node (on one machine: restart everything)
            self.recorder.run_ended(self.job, attempt, self.clock.time(), "restarted")
            self.recorder.event(self.clock.time(), self.job, "job_restart", attempt=attempt,
                                action=decision.action.label)
            self.recorder.say(f"ftwatch: restarting all {self.nproc} workers "
                              f"(restart {decision.restarts_used} of {self.config.policy.max_num_of_job_restart})")
            self._sleep(self.config.supervisor.restart_delay)
            if self._stop_requested.is_set():     # interrupted while waiting to restart
                self.recorder.say("ftwatch: interrupted before the restart")
                self.recorder.event(self.clock.time(), self.job, "interrupted")
                return 130

    def _watch(self) -> Decision | None:
        """Watch one attempt; returns the decision that ends it (none = success), None if interrupted."""
        state = _Attempt()
        while True:
            if self._stop_requested.is_set():
                return self._interrupted(state)
            # Take the whole batch before deciding: output that arrived with a failing exit
            # (a peer's traceback) is evidence for that decision, not something to drop.
            triggers = [t for t in (self._handle(i, state) for i in self.supervisor.poll(POLL_SECONDS))
                        if t is not None]
            for trigger in triggers:
                decision = self._incident(trigger, state)
                if decision is not None:
                    return decision
            self.control.drain(self.controls)     # SDK requests, on this thread
            now = self.clock.time()
            self.recorder.resend_due(self.clock.mono())
            self._add(state, self.engine.flush_stale(now, BLOCK_FLUSH_SECONDS))
            for finding in self.tracker.check(now):
                self._add(state, [finding])
                decision = self._incident(finding, state)
                if decision is not None:
                    return decision
            if len(state.ok) == self.nproc and not self.supervisor.running():
                decision = self.policy.finished(self.clock.time(), ok=True)
                self.recorder.decision(decision)
                return decision

    def _handle(self, item, state: _Attempt) -> Finding | None:
        """Take one supervisor event; return a finding that starts an incident, if any."""
        if isinstance(item, Output):
            self._echo(item)
            self.tracker.output(item.origin.instance, item.time)
            self._add(state, self.engine.feed(item.origin, item.data, item.time))
            return None
        if isinstance(item, Started):
            self.tracker.started(item.origin, item.time)
            self.recorder.event(item.time, self.job, "instance_start", item.origin.instance,
                                item.origin.rank, pid=item.pid, start_count=item.start_count)
            return None
        if isinstance(item, ProcessExit):
            return self._exited(item, state)
        return None

    def _exited(self, exit: ProcessExit, state: _Attempt) -> Finding | None:
        for stream in _STREAMS:
            origin = Origin(exit.origin.instance, exit.origin.rank, exit.origin.job,
                            exit.origin.node, stream, exit.origin.source)
            self._add(state, self.engine.flush(origin, exit.time))
        self.tracker.exited(exit.origin, exit.ok, exit.time)
        self.recorder.event(exit.time, self.job, "instance_exit", exit.origin.instance, exit.origin.rank,
                            returncode=exit.returncode, signal=exit.signal, stopped_by_us=exit.stopped_by_us)
        if exit.ok:
            state.ok.add(exit.origin.instance)
            return None
        if exit.stopped_by_us:
            return None
        state.failed.add(exit.origin.instance)
        finding = exit_finding(exit, self.exit_table, seq=0)
        if finding is not None:
            self._add(state, [finding])
        return finding

    def _incident(self, trigger: Finding, state: _Attempt) -> Decision | None:
        """Decide on a failure or hang; stop the workers first in Sync mode."""
        is_hang = trigger.kind in ("hang", "exit_hang")
        if self.sync and not is_hang:
            self._settle(state)
        if self.sync or is_hang:
            self._stop_and_drain(state)
        incident = Incident(trigger, tuple(state.findings), self.nproc, frozenset(state.failed),
                            self.budgets.attempt)
        decision = self.policy.decide(incident, self.clock.time())
        self.recorder.decision(decision)
        one_instance = decision.action is Action.RESTART_INSTANCE or (
            not self.sync and decision.action is Action.RESTART_IN_PLACE)
        if one_instance and decision.target.rank is not None:
            self._sleep(self.config.supervisor.restart_delay)
            state.failed.discard(decision.target.instance or "")
            self.supervisor.restart_instance(decision.target.rank)
            return None
        if not self.sync and not is_hang and decision.action in (Action.NONE, Action.NOTIFY):
            return None                      # Async: told a person; the others run on
        return decision

    def _settle(self, state: _Attempt) -> None:
        """Give the other workers up to SETTLE_SECONDS to print (or exit with) their own errors."""
        deadline = self.clock.mono() + SETTLE_SECONDS
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
        if findings:
            state.findings.extend(findings)
            self.recorder.findings(findings)

    def _echo(self, item: Output) -> None:
        prefix = f"[rank{item.origin.rank}]" if item.origin.rank is not None else f"[{item.origin.instance}]"
        if item.origin.stream == "stderr":
            prefix += "!"
        text = item.data.decode("utf-8", "replace")
        body = "".join(f"{prefix} {line}\n" for line in text.splitlines())
        self.out.write(body)
        self.out.flush()

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stop_requested.wait(seconds)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.request_stop())

