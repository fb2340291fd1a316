"""The last step of the policy stage: the final decision and the plan to carry it out on one
machine (SPEC D5 MindCluster strategies, seed 004; A1 local isolation and the elastic minimum;
A2 rescheduling). Pure: nothing here starts, signals, waits or writes; the local actuator
(``ftwatch.pipeline.actuators.local``) executes the :class:`Plan`.

- :func:`apply_strategies` turns the policy's decision into what the run does under the
  MindCluster strategies: restart the failed workers in place, restart the job, or stop and fail;
  the decision's clause says which strategy chose it.
- :func:`isolation` picks the devices an ``isolate_node`` decision excludes (the blamed rank's and
  every other rank's with an isolate-level finding in the incident), bounded by MIN: fewer than
  MIN devices left turns the decision into ``fail_job``.
- :func:`plan_decision` composes both with the one-instance restarts of Async and the A2
  rescheduling rule into one :class:`Verdict`; :func:`below_min` and :func:`retry_recovered` are
  the two decisions a local run makes without an incident.

The facts come in as plain data (:class:`RunFacts`, :class:`SlotFacts`): the policy never sees the
supervisor or the slots file.

Precedence when strategies are combined (ftwatch's, README): ``retry`` while the processes live,
then ``recover-in-place``, then ``recover``; ``dump`` before any stop; ``exit`` fails.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, NamedTuple

from ftwatch.config.mindcluster import RECOVERING, MindClusterConfig
from ftwatch.config.supervisor import ElasticRange
from ftwatch.events import Action, Decision, FailureClass, Finding, Severity, Target

RESTARTS = (Action.RESTART_INSTANCE, Action.RESTART_IN_PLACE, Action.RESTART_JOB, Action.ISOLATE_NODE)
_NOT_RETRYABLE_KINDS = ("exit_code", "hang", "exit_hang", "summary")
PLAN_KINDS = ("in_place", "instance", "job", "fail", "none")


@dataclass(frozen=True)
class Exclusion:
    """One device leaving the slots, and why (kept in the isolation file).

    Attributes:
        device: the device string (``"1"``, ``"GPU-5f3c..."``).
        rank: the local rank that used it.
        rule: the rule id of the finding that took it out (None when unknown).
        line: that finding's line.
    """

    device: str
    rank: int | None
    rule: str | None = None
    line: str | None = None


@dataclass(frozen=True)
class Plan:
    """What the run does with a decision.

    Attributes:
        kind: ``in_place`` (MindCluster: restart ``ranks`` only, the others run on), ``instance``
            (Async: restart ``ranks`` only), ``job`` (stop all, start all), ``fail`` (stop all, the
            job failed) or ``none`` (nothing: success / notify).
        ranks: the ranks an ``in_place`` / ``instance`` plan restarts.
        exclude: devices to take out of the slots before the next start (A1), the root cause's first.
        reschedule: the next start of every worker is a rescheduling (A2: ``MA_SCHEDULE_CNT`` + 1;
            an ``instance`` plan keeps it for the next full start).
    """

    kind: str
    ranks: tuple[int, ...] = ()
    exclude: tuple[Exclusion, ...] = ()
    reschedule: bool = False


class Verdict(NamedTuple):
    """The policy stage's answer: the final decision and the plan that carries it out."""

    decision: Decision
    plan: Plan


@dataclass(frozen=True)
class SlotFacts:
    """The devices of a local job as the policy sees them (``Slots.facts()``).

    Attributes:
        healthy: the devices not isolated, in slot order (slot ``i`` = ``LOCAL_RANK i``).
        range: the elastic ``--nproc-per-node MIN:MAX``.
        isolated: (device, rule) of the devices isolated so far, for the text.
    """

    healthy: tuple[str, ...]
    range: ElasticRange
    isolated: tuple[tuple[str, str | None], ...] = ()

    @property
    def active(self) -> list[str]:
        """The devices the next start uses: the first MAX healthy ones."""
        return list(self.healthy[: self.range.max])

    @property
    def nproc(self) -> int:
        """Workers of the next start (may be below MIN: see ``viable``)."""
        return len(self.active)

    @property
    def viable(self) -> bool:
        """True while at least MIN healthy devices are left."""
        return self.nproc >= self.range.min

    def device_of(self, local_rank: int | None) -> str | None:
        """The device slot ``local_rank`` uses now (None for an unknown rank)."""
        if local_rank is None or not 0 <= local_rank < self.nproc:
            return None
        return self.active[local_rank]

    def without(self, excluded: list[Exclusion]) -> "SlotFacts":
        """The slots after ``excluded`` left them."""
        gone = {e.device for e in excluded}
        return SlotFacts(tuple(d for d in self.healthy if d not in gone), self.range,
                         self.isolated + tuple((e.device, e.rule) for e in excluded))

    def describe(self) -> str:
        """``devices 0,2 (isolated: 1 by xid.79)``, for the terminal and decisions."""
        text = f"devices {','.join(self.active) or '-'}"
        if self.isolated:
            text += " (isolated: " + ", ".join(f"{d} by {r or '?'}" for d, r in self.isolated) + ")"
        return text


@dataclass(frozen=True)
class RunFacts:
    """What a local run (``ftwatch run``) knows when it asks the policy; watch and replay give none.

    Attributes:
        running_ranks: ranks whose worker still runs.
        failed_ranks: ranks that failed on their own and are not running.
        slots: the devices and MIN:MAX (None: no local devices, nothing to isolate).
        strategies: the ``mindcluster`` section (off by default).
    """

    running_ranks: frozenset[int] = frozenset()
    failed_ranks: frozenset[int] = frozenset()
    slots: SlotFacts | None = None
    strategies: MindClusterConfig = dataclasses.field(default_factory=MindClusterConfig)


def plan_decision(decision: Decision, facts: RunFacts | None, *, sync: bool, modelarts: bool) -> Verdict:
    """The final decision and its plan.

    Args:
        decision: the policy's decision (D1-D4, R3/R5/R8, blame).
        facts: the local run's facts; None (watch, replay) plans from the action alone.
        sync: the job's execution mode is Sync (AIMaster ``--job-execution-mode``).
        modelarts: the ModelArts strategies decide (their job restarts are reschedulings, seed 002).

    Returns:
        The decision with its clause extended by each step that changed or explained it (D5, A1)
        and the Plan: ``in_place`` / ``instance`` ranks, ``job``, ``fail`` or ``none``, the devices
        to exclude and whether the next start is a rescheduling.
    """
    facts = facts or RunFacts()
    decision, plan = apply_strategies(decision, facts.strategies, set(facts.failed_ranks), bool(facts.running_ranks))
    excluded: list[Exclusion] = []
    if facts.slots is not None:
        decision, excluded = isolation(decision, facts.slots)
    if decision.action is Action.FAIL_JOB:
        return Verdict(decision, Plan("fail", exclude=tuple(excluded)))
    if plan.kind != "job":
        return Verdict(decision, plan)
    # A2: the job moves (MA_SCHEDULE_CNT + 1, MA_PROC_START_CNT back to 1) after an isolation,
    # a MindCluster recover, or any ModelArts job reschedule (seed 002: the job is rebuilt)
    reschedule = bool(excluded) or facts.strategies.has("recover") or (
        modelarts and decision.action in (Action.RESTART_JOB, Action.ISOLATE_NODE))
    one_instance = decision.action is Action.RESTART_INSTANCE or (
        not sync and decision.action is Action.RESTART_IN_PLACE)
    if one_instance and decision.target.rank is not None:
        return Verdict(decision, Plan("instance", (decision.target.rank,), reschedule=reschedule))
    return Verdict(decision, Plan("job", exclude=tuple(excluded), reschedule=reschedule))


def apply_strategies(decision: Decision, mc: MindClusterConfig, failed_ranks: set[int],
                     running: bool) -> tuple[Decision, Plan]:
    """The plan for ``decision`` under the MindCluster strategies (off: the policy's own action).

    Args:
        decision: the policy's decision.
        mc: the ``mindcluster`` section.
        failed_ranks: ranks that failed on their own and are not running.
        running: whether some worker still runs (in place needs survivors to make sense).

    Returns:
        (the decision, its clause extended by the strategy that chose the plan; the plan:
        ``in_place``, ``job``, ``fail`` or ``none``).
    """
    act = decision.action
    if act is Action.FAIL_JOB:
        if mc.enabled and not RECOVERING & set(mc.recover_strategy):
            return _clause(decision, f"D5 MindCluster {_names(mc)}: no recover strategy → exit: stop and fail"), Plan("fail")
        return decision, Plan("fail")
    if act not in RESTARTS:
        return decision, Plan("none")
    if not mc.enabled:
        return decision, Plan("job")
    if mc.has("recover-in-place") and act is not Action.ISOLATE_NODE and failed_ranks and running:
        ranks = tuple(sorted(failed_ranks))
        who = ", ".join(f"rank {r}" for r in ranks)
        target = Target(decision.target.job, f"worker-{ranks[0]}" if len(ranks) == 1 else None,
                        ranks[0] if len(ranks) == 1 else None, decision.target.node)
        decision = dataclasses.replace(decision, action=Action.RESTART_IN_PLACE, target=target)
        return _clause(decision, f"D5 MindCluster recover-in-place → restart {who} in place, "
                                 "the other workers run on"), Plan("in_place", ranks)
    if mc.has("recover"):
        why = "restart the job without the isolated device" if act is Action.ISOLATE_NODE else "restart the job"
        return _clause(decision, f"D5 MindCluster recover → {why}"), Plan("job")
    why = ("a device must be excluded: restart the job" if act is Action.ISOLATE_NODE
           else "no failed worker to restart alone: restart every worker")
    return _clause(decision, f"D5 MindCluster recover-in-place → {why}"), Plan("job")


def isolation_ranks(decision: Decision) -> list[int]:
    """The ranks whose devices an ``isolate_node`` decision takes out of the slots: the target's
    rank first, then every other rank with an isolate-level real finding in the incident (a second
    GPU that fell off the bus in the same incident goes too), in rank order."""
    ranks = [decision.target.rank] if decision.target.rank is not None else []
    for f in decision.findings:
        if (f.action is Action.ISOLATE_NODE and f.severity >= Severity.ERROR and f.rank is not None
                and f.failure_class not in (FailureClass.FALLOUT, FailureClass.INFO) and f.rank not in ranks):
            ranks.append(f.rank)
    return ranks[:1] + sorted(ranks[1:])


def isolation(decision: Decision, slots: SlotFacts) -> tuple[Decision, list[Exclusion]]:
    """What an ``isolate_node`` decision takes out on one machine: the device of every rank of
    ``isolation_ranks``, bounded by MIN (fewer than MIN devices left fails the job); where the
    root cause names its device in ``fields["device"]`` (a Bootcheck's NVML check) and that device
    is an active one, that device stands for the root cause's rank.

    Returns:
        (the decision, with its clause extended; FAIL_JOB when fewer than MIN devices are left;
        the devices to exclude, the root cause's first). A decision of another action comes back
        unchanged with none; one whose ranks have no device comes back unchanged but for the
        clause (then the job restarts with every device).
    """
    if decision.action is not Action.ISOLATE_NODE:
        return decision, []
    rc = decision.root_cause
    named = rc.fields.get("device") if rc is not None else None     # a health check names its device
    pairs: list[tuple[int | None, str | None]] = []
    if named is not None and str(named) in slots.active:
        pairs.append((slots.active.index(str(named)), str(named)))
    pairs += [(r, slots.device_of(r)) for r in isolation_ranks(decision)]   # all looked up before any leaves
    seen: set[str] = set()
    pairs = [(r, d) for r, d in pairs if d is not None and not (d in seen or seen.add(d))]
    if not pairs:
        return _clause(decision, f"A1 local: no device known for rank {decision.target.rank}; nothing isolated"), []
    by_rank: Mapping[int | None, Finding] = {f.rank: f for f in reversed(decision.findings)
                                             if f.action is Action.ISOLATE_NODE}
    excluded = []
    for rank, device in pairs:
        why = by_rank.get(rank) or rc
        excluded.append(Exclusion(str(device), rank, why.rule_id if why else None, why.line if why else None))
    after = slots.without(excluded)
    rng = slots.range
    what = ", ".join(f"device {e.device} (rank {e.rank})" for e in excluded)
    if not after.viable:
        text = (f"A1 local: isolated {what}; {after.nproc} healthy device(s) left, "
                f"below the minimum {rng.min} of --nproc-per-node {rng} → fail_job")
        return dataclasses.replace(_clause(decision, text), action=Action.FAIL_JOB), excluded
    return _clause(decision, f"A1 local: isolated {what}; restart with {after.nproc} "
                             f"worker(s) on {','.join(after.active)} (--nproc-per-node {rng})"), excluded


def below_min(job: str, slots: SlotFacts, now: float, restarts_used: int, attempt: int) -> Decision:
    """The job cannot start: devices isolated by an earlier ftwatch run of it left fewer than MIN
    (A1). Returns the FAIL_JOB decision (no budget left)."""
    rng = slots.range
    return Decision(now, Action.FAIL_JOB, Target(job), None,
                    f"A1 local: {slots.describe()}: {slots.nproc} healthy device(s), below the "
                    f"minimum {rng.min} of --nproc-per-node {rng} → fail_job", restarts_used, 0, attempt=attempt)


def retry_recovered(job: str, fault: Finding, stepped: Mapping[str, int], asked: int, now: float,
                    restarts_used: int, restarts_left: int, attempt: int) -> Decision:
    """The decision after a MindCluster ``retry`` that worked: every asked worker acknowledged and
    reported a step again (``stepped``: instance -> its first step since), so training goes on:
    NOTIFY, no budget spent."""
    steps = ", ".join(f"{i} at step {s}" for i, s in sorted(stepped.items()))
    return Decision(now, Action.NOTIFY, Target(job, fault.origin.instance, fault.rank, fault.origin.node),
                    fault, f"D5 MindCluster retry: {asked} worker(s) recovered in place and resumed "
                           f"({steps}) → training goes on", restarts_used, restarts_left, (fault,), attempt)


def retry_candidate(f: Finding) -> bool:
    """A finding ``retry`` may answer: a real, retryable error seen in a log (not an exit or a hang)
    whose rule recommends a restart short of isolation (the device is still there)."""
    return (f.severity >= Severity.ERROR and f.kind not in _NOT_RETRYABLE_KINDS
            and f.failure_class in (FailureClass.RETRYABLE_INFRA, FailureClass.HARDWARE_NODE)
            and f.action in (Action.RESTART_INSTANCE, Action.RESTART_IN_PLACE, Action.RESTART_JOB))


def _names(mc: MindClusterConfig) -> str:
    return "recover-strategy " + ",".join(mc.recover_strategy)


def _clause(decision: Decision, text: str) -> Decision:
    return dataclasses.replace(decision, policy_clause=f"{decision.policy_clause}; {text}")
