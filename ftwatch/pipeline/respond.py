"""``ftwatch run``'s answer to one incident: settle, decide, act, and end or restart the attempt.

The run loop (``ftwatch.pipeline.run``) takes the workers' output and finds what opens an
incident; :class:`Responder` does the rest, in this order:

    settle          -> (Sync, not a hang) the other workers get the desk's settle time to print
                       or exit with their own errors (``IncidentDesk.settled``), at most
                       ``supervisor.settle_max`` from the incident's first error; each wait is
                       the loop's own poll-and-handle step, so it wakes on output
    stop and drain  -> a failing exit in Sync: last words (dump), stop all, the open blocks
                       closed; not when the workers may be kept (recover-in-place, keep-scene)
    decide          -> ``IncidentDesk.verdict`` with the run's facts (running and failed ranks,
                       slots, MindCluster), or the job's leader on a multi-node job
    act             -> ``notify`` / ``none`` on a hang or log finding: told, the job runs on;
                       else said (``Recorder.decided``), the plan carried out (local actuator),
                       an in-place / one-instance restart after the instance-level checks, then
                       stored and alerted (``Recorder.published``); a restart of every worker or
                       a failure stops them first
    end / restart   -> the job ended (scene kept on a final failure, open alerts resolved,
                       budgets and slots closed) or restarts every worker after
                       ``restart_delay``; ``--actuator slurm`` may take the decision over
                       (requeue, drain, cancel)

Nothing here polls on its own: every wait runs the ``step`` the run loop gives, the one
poll-and-handle step. Every collaborator comes built (``pipeline/build.build_run`` through
``run.RunParts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ftwatch.clock import Clock
from ftwatch.config.mindcluster import MindClusterConfig
from ftwatch.events import Action, Decision, Finding
from ftwatch.health.runhook import HealthChecks
from ftwatch.pipeline.actuators.local import LocalActuator, Step, Workers
from ftwatch.pipeline.actuators.outcome import record_outcome
from ftwatch.pipeline.actuators.scene import Scene
from ftwatch.pipeline.actuators.slots import Slots
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.plan import Plan, RunFacts, Verdict
from ftwatch.policy.policy import Policy


@dataclass
class Attempt:
    """What one attempt of the job carries between the loop and its incidents."""

    failed: set[str] = field(default_factory=set)           # the desk's set of failed instances
    retry: list[Finding] = field(default_factory=list)      # faults a MindCluster retry may answer


class Responder:
    """Settles, decides and acts on the incidents of ``ftwatch run``'s one job.

    Args:
        desk: the job's incident desk (settle window, verdict, findings beside the output).
        act: the local actuator that carries plans out.
        supervisor: the workers (only ``running()`` is read here, for the settle).
        policy: for ``max_restarts`` in the restart message.
        recorder: where decisions and events go.
        budgets: the job's restart budgets (its attempt; closed when the job ends).
        slots: the job's devices (facts for the verdict; closed when the job ends).
        health: the instance-level Bootcheck before an instance restart (H1).
        scene: the workers' ranks by instance.
        clock: time and monotonic time.
        job: the job id.
        mc: the MindCluster strategies (in the verdict's facts).
        sync: ``job_execution_mode`` is Sync.
        live: decide before stopping (recover-in-place or keep-scene: the workers may be kept).
        restart_delay: seconds between stopping every worker and starting them again.
        step: the run loop's poll-and-handle step (timeout seconds -> findings that open an incident).
        scheduler: ``--actuator slurm``'s actuator (``handles``, ``act``), or None.
        cluster: a multi-node job's agent (its leader decides), or None.
    """

    def __init__(self, desk: IncidentDesk, act: LocalActuator, supervisor: Workers, policy: Policy,
                 recorder: Recorder, budgets: BudgetStore, slots: Slots, health: HealthChecks, scene: Scene,
                 clock: Clock, job: str, mc: MindClusterConfig, *, sync: bool, live: bool, restart_delay: float,
                 step: Step, scheduler: Any = None, cluster: Any = None):
        self.desk, self.act, self.supervisor, self.policy = desk, act, supervisor, policy
        self.recorder, self.budgets, self.slots, self.health = recorder, budgets, slots, health
        self.scene, self.clock, self.job, self.mc = scene, clock, job, mc
        self.sync, self.live, self.restart_delay = sync, live, restart_delay
        self.step = step
        self.requeued = False             # --actuator slurm requeued the job (this run ended)
        self.scheduler, self.cluster = scheduler, cluster
        self._instance_checking = False   # H1 before an instance restart is under way (no second round)

    # -- one incident ----------------------------------------------------------------------------

    def incident(self, trigger: Finding, state: Attempt) -> Decision | None:
        """Decide on a failure, a hang or a log finding that opens an incident, and act.

        A failing exit in Sync: stop the workers first (last words before), unless they may be
        kept (``live``: recover-in-place, keep-scene). A hang or a log finding (C4D record,
        notify / isolate finding): decide first, while the workers run. The policy stage returns
        the final decision and its plan (``Policy.verdict``); :meth:`_act` carries it out.

        Returns:
            The decision that ends the attempt (restart all, fail), or None when the job runs on.
        """
        is_hang = trigger.kind in ("hang", "exit_hang")
        is_exit = trigger.kind == "exit_code"
        if self.sync and not is_hang:
            self._settle()
        if (self.sync or is_hang or not is_exit) and is_exit and not self.live:
            self.act.dump()
            self.stop_and_drain()
        # with Slurm isolating, the whole node leaves the job: no local devices to exclude (A1)
        slots = None if self.scheduler is not None else self.slots.facts()
        facts = RunFacts(frozenset(self.act.running()), frozenset({self._rank(i) for i in state.failed} - {None}),
                         slots, self.mc)
        if self.cluster is not None:          # the job's leader decides, for every node
            return self._act(self.cluster.decide(trigger, facts), trigger, state)
        return self._act(self.desk.verdict(trigger, self.clock.time(), self.clock.mono(), facts), trigger, state)

    def _act(self, verdict: Verdict, trigger: Finding, state: Attempt) -> Decision | None:
        """Record the decision and carry out its plan. Returns the decision that ends the attempt
        (restart all, fail, success), or None when the job runs on.

        A ``notify`` (or ``none``) decision on a hang or a log finding stops nothing (the job runs
        on: ModelArts hang-retry off, C4D Warn); an in-place or one-instance restart happens here
        (after the instance-level health checks); a restart of every worker or a failure stops
        them first (last words before), except for a failing exit the incident already stopped
        them for, and a final failure, which keeps the scene first (:meth:`end`)."""
        decision, plan = verdict
        is_hang = trigger.kind in ("hang", "exit_hang")
        is_exit = trigger.kind == "exit_code"
        if not is_exit and decision.action in (Action.NONE, Action.NOTIFY):
            self.recorder.decision(decision)       # told a person (or below the log level): run on
            return None                            # (a hang: the desk re-arms it when output resumes)
        self.recorder.decided(decision)            # said and in the decisions file; stored after acting
        self.act.carry_out(plan, decision)
        if plan.kind in ("in_place", "instance"):
            return self._restart_instances(plan, decision, state)
        self.recorder.published(decision)          # the store, the alert
        if not self.sync and not is_hang and decision.action in (Action.NONE, Action.NOTIFY):
            return None                      # Async: told a person; the others run on
        stop = self.sync or is_hang or not is_exit
        if stop and (self.live or not is_exit) and decision.action is not Action.FAIL_JOB:
            self.act.dump()                  # a final failure keeps the scene first (end)
            self.stop_and_drain()
        return decision

    def _restart_instances(self, plan: Plan, decision: Decision, state: Attempt) -> Decision | None:
        """Restart the plan's ranks only (MindCluster in place, Async ``restart_instance``), the
        others run on; first the instance-level health checks (H1, seed 001: checks at every
        restart, Troubleshooting after every failure), without the all-reduce.

        Returns None (the job runs on), or when the Bootcheck found a hardware fault the restart
        of those ranks cannot help: that fault became an incident of its own (the policy's
        decision, usually ``isolate_node``: its device leaves the slots), whose decision replaces
        the restart. No second round of checks runs inside it."""
        if not self._instance_checking:
            blocking = self.health.instance_restart(self.budgets.attempt, list(plan.ranks))
            if blocking is not None:
                self.recorder.published(decision)    # before the decision that replaces it
                self.add([blocking])
                self._instance_checking = True
                try:
                    return self.incident(blocking, state)
                finally:
                    self._instance_checking = False
        state.failed -= {f"worker-{r}" for r in plan.ranks}
        self.act.restart_instances(plan, decision)
        self.recorder.published(decision)
        return None

    def _settle(self) -> None:
        """Give the other workers the desk's settle time to print (or exit with) their own
        errors: until each live one has reported one (``IncidentDesk.settled``) or exited, at
        most ``supervisor.settle_max`` from the incident's first error (from now for a trigger
        the desk did not open, e.g. a fault a retry did not answer). Each step wakes on output."""
        mono = self.clock.mono()
        opened = self.desk.open is not None
        deadline = mono + (self.desk.settle_left(mono) if opened else self.desk.settle)
        while self.clock.mono() < deadline:
            alive = {f"worker-{r}" for r in self.supervisor.running()}
            if not alive or (opened and self.desk.settled(self.clock.mono(), alive)):
                return
            self.step(max(0.0, deadline - self.clock.mono()))

    # -- the attempt's end ---------------------------------------------------------------------

    def end(self, decision: Decision, attempt: int) -> int:
        """The job ended: success, or a final failure (scene kept, last words, workers stopped).
        Returns the run's exit status (0 = the job succeeded, 1 = it failed)."""
        ok = decision.action in (Action.NONE, Action.NOTIFY)
        if not ok and self.act.running():
            self.act.keep_scene()
            self.act.dump()
            self.stop_and_drain()
        self.act.stop_all()
        self.recorder.resolve_open(self.clock.time(), "the job finished successfully" if ok
                                   else "superseded: the job failed")
        self.recorder.run_ended(self.job, attempt, self.clock.time(), "succeeded" if ok else "failed")
        self.budgets.close("succeeded" if ok else "failed")
        self.slots.close("succeeded" if ok else "failed")
        return 0 if ok else 1

    def restart(self, decision: Decision, attempt: int) -> int | None:
        """Every worker restarts (restart_job, restart_in_place, isolate_node: on one machine a
        restart without the device): the ones still running are stopped (last words first), the
        scheduler may take the job over (Slurm requeued it: it starts again from its script),
        else a pause of ``restart_delay``.

        Returns:
            None when the loop starts the next attempt; else the run's exit status (0: requeued
            by Slurm, 130: interrupted while waiting to restart).
        """
        if self.act.running():               # Async isolate_node: the others still run
            self.act.dump()
            self.stop_and_drain()
        if self.hand_over(decision):         # Slurm requeued the job: it starts again from its script
            self.requeued = True
            self.recorder.run_ended(self.job, attempt, self.clock.time(), "requeued")
            return 0
        self.recorder.run_ended(self.job, attempt, self.clock.time(), "restarted")
        self.recorder.event(self.clock.time(), self.job, "job_restart", attempt=attempt,
                            action=decision.action.label)
        self.recorder.say(f"ftwatch: restarting all {self.slots.nproc} workers "
                          f"(restart {decision.restarts_used} of {self.policy.max_restarts})")
        self.act.pause(self.restart_delay)
        if self.act.stop_requested.is_set():     # interrupted while waiting to restart
            self.recorder.say("ftwatch: interrupted before the restart")
            self.recorder.event(self.clock.time(), self.job, "interrupted")
            return 130
        return None

    def hand_over(self, decision: Decision) -> bool:
        """The scheduler carries the decision out (Slurm: drain, requeue, cancel); its outcome is
        stored with the decision (``actuator`` event; not done: said and alerted). Returns True
        when it was done; else (failed, held by the breaker, dry run) the workers restart here
        (or the job fails) as without a scheduler."""
        if self.scheduler is None or not self.scheduler.handles(decision.action):
            return False
        result = self.scheduler.act(decision)
        t = decision.target
        record_outcome(self.recorder, self.clock.time(), self.job, decision.action.label, result,
                       instance=t.instance, rank=t.rank, decision_id=decision.decision_id, node=t.node)
        return result.status == "done"

    def interrupted(self) -> None:
        """SIGINT / SIGTERM to ftwatch: every worker stopped, their output drained; an event."""
        self.recorder.say("ftwatch: interrupted, stopping all workers")
        self.stop_and_drain()
        self.recorder.event(self.clock.time(), self.job, "interrupted")

    # -- helpers ---------------------------------------------------------------------------------

    def stop_and_drain(self) -> None:
        """Stop every worker (SIGTERM, grace, SIGKILL), take all the output they left, and close
        the blocks still open."""
        self.act.stop()
        now = self.clock.time()
        engine = self.desk.engine
        for origin in engine.pending_origins():
            self.add(engine.flush(origin, now))

    def add(self, findings: list[Finding]) -> None:
        """Findings made beside the output (drained blocks, a Bootcheck): to the desk."""
        self.desk.add(findings, self.clock.mono())

    def _rank(self, instance: str) -> int | None:
        w = self.scene.workers.get(instance)
        return w.rank if w is not None else None
