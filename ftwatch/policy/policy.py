"""Findings -> a Decision: root cause (SPEC R7), modes (D1), policies (D2), budgets (D3), and the
recovery policies of issue 4: NPU escalation (R3, ``escalation.py``), C4D records (R8, ``c4d.py``),
node blame (``blame.py``) and the ModelArts strategies (D4, ``modelarts.py``), which replace D1-D3
when the job's annotations turn them on.

The semantics are those of PAI-DLC AIMaster (seeds/000, 全量参数说明):

- ``--fault-tolerant-policy``: ``OnFailure`` restarts on any failure ("无条件重启"), whatever the
  root cause or its rule recommends; ``ExitCodeAndErrorMsg`` restarts only when the failed
  instance's exit code / error message is retryable (here: the root cause's class is
  ``FailureClass.retryable`` and its rule does not recommend ``fail_job``); ``Never`` fails at once.
- ``--job-execution-mode``: ``Sync`` restarts the whole job, which needs ``--enable-job-restart``;
  ``Async`` restarts only the failed instance, except a PS or Chief instance, which restarts nothing
  (the job fails) unless ``--enable-job-restart``, and then the whole job. Hang detection is
  Sync-only: a hang finding in Async only notifies.
- ``--max-num-of-job-restart``: restarts beyond it fail the job (in Async, per instance);
  ``--max-num-of-same-error``: one error on one instance seen more often than this fails the job;
  ``--max-tolerated-failure-rate``: more failed instances than this fraction fails the job.

Root cause (R7): ``ftwatch.policy.rootcause.analyse`` (the earliest real error; explained exits and
cascades are fallout). In Sync that is across every instance; in Async instances are independent,
so only the failed instance's findings are considered. Two readings need facts of the attempt that
the findings do not carry (``Incident``): an error before any progress (R6,
``ftwatch.policy.initphase.at_init``) and a job hang that began in work one rank ran alone while
its peers log their own training (``ftwatch.policy.rankonly``, ``Incident.progressed``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ftwatch.config.model import Config, PolicyConfig
from ftwatch.config.recovery import ModelArtsConfig, RecoveryConfig, c4d_settings
from ftwatch.events import Action, Decision, FailureClass, Finding, Severity, Target
from ftwatch.policy.blame import BlameStore, blameable
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.c4d import C4DSettings, error_clause, is_c4d, notify_clause, refine
from ftwatch.policy.escalation import DAY, FREQUENCY_RULES, Escalator, FaultHistory, is_npu, npu_code
from ftwatch.policy.initphase import UNKNOWN, at_init
from ftwatch.policy.lifecycle import after_finish, elastic_recovery, saving_before
from ftwatch.policy.linkflap import recovered_flaps
from ftwatch.policy.pluginmark import explained_marks
from ftwatch.rules.faultcodes import USER_INPUT_CODES
from ftwatch.policy.modelarts import ModelArtsPolicy
from ftwatch.policy.porttaken import port_taken
from ftwatch.policy.plan import RunFacts, SlotFacts, Verdict, below_min, plan_decision, retry_recovered
from ftwatch.policy.rankonly import rank_only_before_hang
from ftwatch.policy.rootcause import CASCADE_RULES, Analysis, analyse

#: AIMaster's PS / Chief roles (seed 000, "异步训练任务"): an instance named ``ps-0``, ``chief``,
#: ``job-ps-1`` ... (the role as the name or a dash/underscore/dot-separated part of it).
_PS_CHIEF = re.compile(r"(?:^|[-_.])(?:ps|chief)(?:$|[-_.\d])", re.IGNORECASE)
_HANG_KINDS = ("hang", "exit_hang")


@dataclass(frozen=True)
class Incident:
    """Why the policy is asked now.

    Attributes:
        trigger: a failing exit, a hang or an exit hang.
        findings: every finding of this attempt so far, all instances, any order (the trigger may
            or may not be among them).
        world_size: the number of instances.
        failed_instances: instances that failed on their own (not stopped by ftwatch).
        attempt: 0 for the first run.
        facts: what a local run knows (running and failed ranks, its devices and MIN, the
            MindCluster strategies) for :meth:`Policy.verdict`'s plan; None in watch and replay.
        progress_at: epoch seconds by which the job had shown progress this attempt
            (``ftwatch.policy.initphase.FirstProgress``): ``inf`` none, ``-inf`` not known (the
            default: nothing is graded as an initialisation failure).
        progressed: the instances that printed a progress line this attempt
            (``FirstProgress.progressed``; empty when not known).
        notices: the errors this attempt outlived (``IncidentDesk.notices``), out of ``findings``;
            read only where a later failure says what they led to (``ftwatch.policy.porttaken``).
    """

    trigger: Finding
    findings: tuple[Finding, ...]
    world_size: int
    failed_instances: frozenset[str]
    attempt: int
    facts: RunFacts | None = None
    progress_at: float = UNKNOWN
    progressed: frozenset[str] = frozenset()
    notices: tuple[Finding, ...] = ()


def is_ps_or_chief(instance: str) -> bool:
    """True for an AIMaster PS / Chief instance name (``ps-0``, ``chief-0``, ``job-ps-1``)."""
    return bool(_PS_CHIEF.search(instance))


def _who(f: Finding) -> str:
    return f"rank {f.rank}" if f.rank is not None else f.origin.instance


class Policy:
    """The decision maker for one job.

    Args:
        policy: the AIMaster flags.
        budgets: the job's persistent budgets (changed by ``decide``; closed on a final decision).
        job: the job id, used in every Target.
        modelarts: the ModelArts section; when enabled (``job-retry-num`` set) it decides instead of
            the AIMaster clauses D1-D3 (``ftwatch.policy.modelarts``).
        recovery: escalation and blame settings (default: both on, defaults of ``RecoveryConfig``).
        state_dir: where the chip-fault history of every job (``escalation/chips.json``) and node blame
            (``blame/nodes.json``) persist; None keeps them in memory. ``for_config`` passes it.
    """

    def __init__(self, policy: PolicyConfig, budgets: BudgetStore, job: str, *,
                 modelarts: ModelArtsConfig | None = None, recovery: RecoveryConfig | None = None,
                 state_dir: Path | None = None):
        self.policy = policy
        self.budgets = budgets
        self.job = job
        self.recovery = recovery or RecoveryConfig()
        ma = modelarts or ModelArtsConfig()
        keep = max([2 * DAY, ma.same_fault_window] + [r.window_s for r in FREQUENCY_RULES])
        self.history = FaultHistory.for_state(state_dir, keep)
        self.escalator = Escalator(self.history, device_repeat=not ma.enabled)
        bc = self.recovery.blame
        self.blame = BlameStore.for_state(state_dir, threshold=bc.threshold, window=bc.window,
                                          cooldown=bc.cooldown) if bc.enabled else None
        timeout, times = c4d_settings(policy.c4d_common_envs)
        self.c4d = C4DSettings(policy.enable_c4d_hang_detection and policy.enable_job_hang_detection,
                               timeout, times, policy.c4d_log_level)
        self.modelarts = ModelArtsPolicy(ma, budgets, self.history) if ma.enabled else None

    @classmethod
    def for_config(cls, config: Config, budgets: BudgetStore, job: str,
                   state_dir: Path | None = None, in_memory: bool = False) -> "Policy":
        """The policy a config asks for (``ftwatch.pipeline.build.build_policy`` calls it); state
        under ``state_dir`` or ``config.storage.state_dir``, or in memory (``in_memory``)."""
        state = Path(state_dir if state_dir is not None else config.storage.state_dir)
        return cls(config.policy, budgets, job, modelarts=config.modelarts, recovery=config.recovery,
                   state_dir=None if in_memory else state)

    @property
    def max_restarts(self) -> int:
        """The restart budget: ``job-retry-num`` under ModelArts, else ``max_num_of_job_restart``."""
        return self.modelarts.max_restarts if self.modelarts else self.policy.max_num_of_job_restart

    def root_cause(self, findings: Sequence[Finding]) -> Finding | None:
        """The root cause of ``findings`` (R7): see ``analyse``."""
        return analyse(findings).root_cause

    # ------------------------------------------------------------------ decide

    def decide(self, incident: Incident, now: float) -> Decision:
        """Decide what to do about an incident, spend budgets, and say why.

        Before the clauses: C4D findings are graded (R8, ``ftwatch.policy.c4d``), NPU findings that
        keep recurring are escalated (R3, ``ftwatch.policy.escalation``) and the root cause's node
        is blamed (``ftwatch.policy.blame``); what they found opens the policy clause.

        Args:
            incident: the trigger and the attempt's findings.
            now: epoch seconds; the decision's time.

        Returns:
            A Decision whose ``restarts_used`` / ``restarts_left`` are after this decision
            (per instance for an Async instance restart, else job-level) and whose
            ``policy_clause`` names the clause (R3/R8/blame, then D1-D4/R5) that chose the action. A
            FAIL_JOB decision closes the budget store (``failed``).
        """
        p = self.policy
        sync = p.job_execution_mode == "Sync" or self.modelarts is not None
        raw = incident.findings if incident.trigger in incident.findings else incident.findings + (incident.trigger,)
        at = raw.index(incident.trigger)
        findings = explained_marks(recovered_flaps(refine(raw, self.c4d)))   # a flapped port's errors, a plugin's mark
        trig = findings[at]
        scope = findings if sync else tuple(f for f in findings if f.origin.instance == trig.origin.instance)
        occurrence = str(incident.attempt) if sync else (
            f"{incident.attempt}:{trig.origin.instance}:{self.budgets.instance_restarts(trig.origin.instance)}")
        notes: list[str] = []
        if trig.fields.get("derived") == "exit.hidden_by_pipe":     # issue 12 item 6, seed 001 pipefail
            notes.append(f"exit status hidden by a pipe: {trig.line}; decided by the traceback's class")
        if self.recovery.escalation:
            self.escalator.observe(scope, f"{self.job}:{occurrence}")     # one history for every job
            scope, found = self.escalator.apply(scope, now)
            notes += found
        an = analyse(scope, incident.world_size if sync else None)
        alone = rank_only_before_hang(scope, an.real, incident.progressed) if an.real else None
        if alone is not None:               # R7: the silence began in work the program ran on one rank
            an = Analysis(alone, False, (alone,), an.notices, an.finished)
        taken = port_taken(sorted((f for f in scope if f.severity >= Severity.ERROR), key=lambda f: (f.time, f.seq)),
                           incident.notices) if incident.notices else None
        if taken is not None:               # R7: a rendezvous that failed after its store's port was found taken
            an = Analysis(taken, False, (taken,), an.notices, an.finished)
        rc = an.root_cause or trig
        init = at_init(rc, incident.progress_at, scope) if an.real and an.root_cause is not None else None
        if init is not None:                # R6: before any progress this message is configuration
            notes.append(f"R6 {rc.rule_id} on {_who(rc)} came before the job made any progress: "
                         f"{init.failure_class.value}/{init.action.label} (init_phase.tsv: {init.meaning.split(':')[0]})")
            old, rc = rc, dataclasses.replace(rc, failure_class=init.failure_class, action=init.action)
            an = dataclasses.replace(an, root_cause=rc, real=tuple(rc if f is old else f for f in an.real))
        if an.real and is_c4d(rc) and rc.action is Action.ISOLATE_NODE:
            notes.append(error_clause(rc))
        if self.blame is not None and an.real and blameable(rc):
            blame = self.blame.blame(rc.origin.node, self.job, occurrence, rc.rule_id, now)
            notes.append(blame.clause)
            if blame.isolate and rc.action < Action.ISOLATE_NODE:
                rc = dataclasses.replace(rc, action=Action.ISOLATE_NODE, failure_class=FailureClass.HARDWARE_NODE)
                an = Analysis(rc, False, (rc,) + an.real[1:])
        instance = rc.origin.instance if rc.origin.instance in incident.failed_instances else trig.origin.instance
        per_instance = not sync and not is_ps_or_chief(instance)
        max_restarts = self.max_restarts

        def done(action: Action, clause: str, target: Target | None = None) -> Decision:
            used = self.budgets.instance_restarts(instance) if per_instance else self.budgets.restarts_used
            if action is Action.FAIL_JOB:
                self.budgets.close("failed")
            return Decision(time=now, action=action, target=target or Target(self.job), root_cause=rc,
                            policy_clause="; ".join(notes + [clause]), restarts_used=used,
                            restarts_left=max(0, max_restarts - used), findings=findings,
                            attempt=incident.attempt)

        if an.after_finish and an.finished is not None:
            tail, why = after_finish(rc, rc.rule_id in CASCADE_RULES, saving_before(findings, an.finished, rc))
            clause = (f"R7 {an.finished.rule_id} on {_who(an.finished)}: training had finished before "
                      f"{rc.rule_id} on {_who(rc)} ({rc.failure_class.value}); an error after the end of training is "
                      f"a notice: {why}")
            if tail is Action.NONE:      # the job had no failure: the notice stays in the clause and findings
                return dataclasses.replace(done(tail, clause), root_cause=None)
            if tail is not None:
                return done(tail, clause)
            notes.append(clause)
        reset = elastic_recovery(findings, [f for f in findings if f.severity >= Severity.ERROR])
        if reset is not None:        # the launcher recovered by itself (ftwatch.policy.lifecycle.elastic_recovery)
            return dataclasses.replace(done(Action.NONE, (
                f"{reset.rule_id} on {_who(reset)}: the elastic launcher re-formed its world after {rc.rule_id} "
                f"on {_who(rc)} (failed hosts blacklisted, training resumes from its last commit) → none")),
                root_cause=None)
        if is_c4d(trig) and trig.action < Action.RESTART_INSTANCE and not an.real:
            if trig.action is Action.NONE:
                return done(Action.NONE, f"R8 C4D {trig.fields.get('c4d_level')} record is below "
                                         f"c4d_log_level={self.c4d.log_level} → ignored")
            return done(Action.NOTIFY, notify_clause(trig, self.c4d))
        if (trig.kind not in (*_HANG_KINDS, "exit_code") and trig.action < Action.RESTART_INSTANCE and not an.real
                and not an.fallout_only):     # a notice beside the workers' fallout: they failed, D2 decides
            # a log finding that opened the incident while the workers run (PreSeparateNPU ...)
            level = trig.fields.get("level") or trig.failure_class.value
            clause = f"{trig.rule_id} on {_who(trig)} ({level}) recommends {trig.action.label}: the workers run on"
            if trig.action is Action.NONE:   # graded as nothing to do (a recovered link flap), as a C4D record above
                return dataclasses.replace(done(Action.NONE, clause + " → none"), root_cause=None)
            return done(Action.NOTIFY, clause + " → notify")
        if self.modelarts is not None:
            return self._modelarts(incident, trig, an, rc, now, done)
        if not sync and trig.kind in _HANG_KINDS:
            return done(Action.NOTIFY, f"R5 {trig.kind.replace('_', ' ')} detection is Sync-only "
                                       "(AIMaster), this job is Async → notify")

        occurrence = f"{incident.attempt}:{self.budgets.instance_restarts(instance)}"
        counts = self.budgets.count_errors(dict.fromkeys(f.fingerprint for f in an.real), occurrence)

        if p.fault_tolerant_policy == "Never":
            return done(Action.FAIL_JOB, "D2 Never: failures are not tolerated → fail_job")
        rate = p.max_tolerated_failure_rate
        failed = len(incident.failed_instances)
        if rate != -1 and incident.world_size > 0 and failed / incident.world_size > rate:
            return done(Action.FAIL_JOB, f"D3 max_tolerated_failure_rate: {failed}/{incident.world_size} "
                                         f"instances failed ({failed / incident.world_size:.2f} > {rate:g}) → fail_job")
        worst = max(counts.items(), key=lambda kv: kv[1], default=None)
        if worst is not None and worst[1] > p.max_num_of_same_error:
            return done(Action.FAIL_JOB, f"D3 max_num_of_same_error: {worst[0]} seen {worst[1]} times "
                                         f"(> {p.max_num_of_same_error}) → fail_job")

        # D2: restart or not, and which kind of restart the root cause asks for.
        cls = an.fallout_class if an.fallout_only else rc.failure_class
        what = (f"only fallout found (earliest: {rc.rule_id} on {_who(rc)}), " + (
                    "every rank reports only collective timeouts: read as hang" if an.timeouts_only
                    else "treated as retryable_infra") if an.fallout_only else f"{cls.value} root cause")
        head = f"D2 {p.fault_tolerant_policy}: {what}"
        user_input = is_npu(rc) and npu_code(rc) in USER_INPUT_CODES
        if user_input:
            head += f" (R3: {npu_code(rc)} is a user-input chip code: reschedule, never isolate)"
        if p.fault_tolerant_policy == "ExitCodeAndErrorMsg" and not an.fallout_only and not user_input:
            if not cls.retryable:
                return done(Action.FAIL_JOB, f"{head} is not retryable → fail_job")
            if rc.action is Action.FAIL_JOB:
                return done(Action.FAIL_JOB, f"{head}, but its rule {rc.rule_id} recommends fail_job → fail_job")
        kind = Action.RESTART_JOB
        if not an.fallout_only and rc.action in (Action.ISOLATE_NODE, Action.RESTART_IN_PLACE) and not (
                user_input and rc.action is Action.ISOLATE_NODE):
            kind = rc.action
        # D1 + D3: whole job or one instance, if the budget allows.
        if per_instance:
            used = self.budgets.instance_restarts(instance)
            if used >= max_restarts:
                return done(Action.FAIL_JOB, f"{head} → restart; D3 max_num_of_job_restart: restart budget of "
                                             f"{instance} exhausted ({used}/{max_restarts}) → fail_job")
            self.budgets.use_instance_restart(instance)
            target = Target(self.job, instance, rc.rank if rc.origin.instance == instance else trig.rank,
                            rc.origin.node if kind is not Action.RESTART_JOB else None)
            action = Action.RESTART_INSTANCE if kind is Action.RESTART_JOB else kind
            how = {Action.RESTART_INSTANCE: "restart_instance", Action.RESTART_IN_PLACE: "restart_in_place",
                   Action.ISOLATE_NODE: f"isolate_node {rc.origin.node} and restart"}[action]
            return done(action, f"{head} → {how} (Async: instance {instance} only)", target)

        if sync:
            scope_text = "Sync: whole job"
            if not p.enable_job_restart:
                return done(Action.FAIL_JOB, f"{head} → restart, but D1 Sync: restarts are disabled "
                                             "(enable_job_restart=False) → fail_job")
        else:
            if not p.enable_job_restart:
                return done(Action.FAIL_JOB, f"{head} → restart, but D1 Async: {instance} is a PS/Chief "
                                             "instance and enable_job_restart=False → restarts nothing → fail_job")
            scope_text = f"Async: {instance} is a PS/Chief instance, enable_job_restart=True → whole job"
        used = self.budgets.restarts_used
        if used >= max_restarts:
            return done(Action.FAIL_JOB, f"{head} → restart; D3 max_num_of_job_restart: restart budget "
                                         f"exhausted ({used}/{max_restarts}) → fail_job")
        self.budgets.use_job_restart()
        if kind is Action.ISOLATE_NODE:
            target = Target(self.job, rc.origin.instance, rc.rank, rc.origin.node)
            return done(kind, f"{head} → isolate_node {rc.origin.node} and restart ({scope_text})", target)
        if kind is Action.RESTART_IN_PLACE:
            return done(kind, f"{head} → restart_in_place ({scope_text}, in place)")
        return done(Action.RESTART_JOB, f"{head} → restart_job ({scope_text})")


    def _modelarts(self, incident: Incident, trig: Finding, an: Analysis, rc: Finding, now: float,
                   done: Callable[..., Decision]) -> Decision:
        """D4: the ModelArts strategy, then its budget (job-retry-num; in-place and hang are free)."""
        assert self.modelarts is not None
        v = self.modelarts.decide(trig, rc if an.root_cause else None, bool(an.real),
                                  incident.failed_instances, incident.attempt, now)
        if v.spend == "job":
            used, most = self.budgets.restarts_used, self.max_restarts
            if used >= most:
                return done(Action.FAIL_JOB, f"{v.clause}, but D4 fault-tolerance/job-retry-num is exhausted "
                                             f"({used}/{most}) → fail_job")
            self.budgets.use_job_restart()
        elif v.spend in ("free", "pod"):
            self.budgets.next_attempt()
        target = None
        if v.action is Action.ISOLATE_NODE:
            instance = v.instance or rc.origin.instance
            target = Target(self.job, instance, rc.rank if instance == rc.origin.instance else None, v.node)
        return done(v.action, v.clause, target)

    def verdict(self, incident: Incident, now: float) -> Verdict:
        """:meth:`decide`, then the plan that carries the decision out (``ftwatch.policy.plan``):
        the MindCluster strategies (D5), the devices to isolate bounded by MIN (A1), one-instance
        restarts (Async) and rescheduling (A2). Nothing after this changes the decision.

        Args:
            incident: the trigger, the attempt's findings and (``ftwatch run``) ``facts``.
            now: epoch seconds; the decision's time.

        Returns:
            (the final Decision, its Plan).
        """
        return plan_decision(self.decide(incident, now), incident.facts,
                             sync=self.policy.job_execution_mode == "Sync", modelarts=self.modelarts is not None)

    def below_min(self, slots: SlotFacts, now: float) -> Decision:
        """FAIL_JOB before any start: fewer than MIN healthy devices are left (A1, isolations kept
        from an earlier ftwatch run of the job)."""
        return below_min(self.job, slots, now, self.budgets.restarts_used, self.budgets.attempt)

    def retry_recovered(self, fault: Finding, stepped: dict[str, int], asked: int, now: float) -> Decision:
        """NOTIFY after a MindCluster retry every asked worker recovered from (D5); no budget spent."""
        used = self.budgets.restarts_used
        return retry_recovered(self.job, fault, stepped, asked, now, used, max(0, self.max_restarts - used),
                               self.budgets.attempt)

    def finished(self, now: float, ok: bool) -> Decision:
        """The job ended by itself: NONE ("job succeeded") or FAIL_JOB; closes the budget store."""
        self.budgets.close("succeeded" if ok else "failed")
        used = self.budgets.restarts_used
        clause = ("the job ended by itself: job succeeded → none" if ok
                  else "the job ended by itself with a failure → fail_job")
        return Decision(time=now, action=Action.NONE if ok else Action.FAIL_JOB, target=Target(self.job),
                        root_cause=None, policy_clause=clause, restarts_used=used,
                        restarts_left=max(0, self.max_restarts - used), attempt=self.budgets.attempt)
