"""The policy stage's last step (``Policy.verdict``, ``ftwatch.policy.plan``): the final decision and
its plan come out of the policy, from plain facts; nothing is changed on the way (pure)."""

from __future__ import annotations

from ftwatch.config.mindcluster import MindClusterConfig
from ftwatch.config.model import PolicyConfig
from ftwatch.config.supervisor import ElasticRange
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.plan import Exclusion, RunFacts, SlotFacts
from ftwatch.policy.policy import Incident, Policy

JOB = "train-42"
T0 = 1_795_219_200.0
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."


def policy(tmp_path, **flags) -> Policy:
    return Policy(PolicyConfig(**{"enable_job_restart": True, **flags}), BudgetStore(tmp_path / "b.json", JOB), JOB)


def xid(rank: int = 1) -> Finding:
    return Finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, Severity.CRITICAL,
                   Origin(f"worker-{rank}", rank, JOB, "n1", "stderr"), XID, T0 + 1)


def killed(rank: int = 1) -> Finding:
    return Finding("exit.sigkill", "exit_code", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB, Severity.ERROR,
                   Origin(f"worker-{rank}", rank, JOB, "n1", "process"), f"worker-{rank} was killed", T0 + 2)


def test_without_run_facts_the_verdict_is_the_decision_and_a_plain_plan(tmp_path):
    """watch and replay give no facts: the decision is decide()'s, the plan follows its action."""
    inc = Incident(xid(), (xid(),), 2, frozenset(), 0)
    decided = policy(tmp_path).decide(inc, T0 + 3)
    decision, plan = policy(tmp_path / "again").verdict(inc, T0 + 3)
    assert decision.action is decided.action is Action.ISOLATE_NODE
    assert decision.policy_clause == decided.policy_clause and "A1" not in decision.policy_clause
    assert plan.kind == "job" and plan.exclude == () and not plan.reschedule


def test_the_elastic_minimum_turns_an_isolation_into_fail_job_inside_the_policy(tmp_path):
    slots = SlotFacts(("0", "1"), ElasticRange(2, 2))
    facts = RunFacts(frozenset({0, 1}), frozenset(), slots, MindClusterConfig())
    decision, plan = policy(tmp_path).verdict(Incident(xid(), (xid(),), 2, frozenset(), 0, facts), T0 + 3)
    assert decision.action is Action.FAIL_JOB
    assert decision.policy_clause.endswith("A1 local: isolated device 1 (rank 1); 1 healthy device(s) left, "
                                           "below the minimum 2 of --nproc-per-node 2 → fail_job")
    assert plan.kind == "fail" and plan.exclude == (Exclusion("1", 1, "xid.79", XID),)
    assert slots.healthy == ("0", "1")                       # facts, not state: the actuator excludes


def test_an_isolation_above_min_plans_a_rescheduled_restart_without_the_device(tmp_path):
    slots = SlotFacts(("4", "5", "6"), ElasticRange(1, 3))
    facts = RunFacts(frozenset({0, 1, 2}), frozenset(), slots, MindClusterConfig())
    decision, plan = policy(tmp_path).verdict(Incident(xid(), (xid(),), 3, frozenset(), 0, facts), T0 + 3)
    assert decision.action is Action.ISOLATE_NODE
    assert plan.kind == "job" and [e.device for e in plan.exclude] == ["5"] and plan.reschedule
    assert "restart with 2 worker(s) on 4,6 (--nproc-per-node 1:3)" in decision.policy_clause


def test_recover_in_place_and_async_one_instance_restarts_are_plans(tmp_path):
    facts = RunFacts(frozenset({0}), frozenset({1}), SlotFacts(("0", "1"), ElasticRange(2, 2)),
                     MindClusterConfig(recover_strategy="recover-in-place"))
    decision, plan = policy(tmp_path, fault_tolerant_policy="OnFailure").verdict(
        Incident(killed(), (killed(),), 2, frozenset({"worker-1"}), 0, facts), T0 + 3)
    assert decision.action is Action.RESTART_IN_PLACE and plan.kind == "in_place" and plan.ranks == (1,)
    facts = RunFacts(frozenset({0}), frozenset({1}), SlotFacts(("0", "1"), ElasticRange(2, 2)))
    decision, plan = policy(tmp_path / "async", job_execution_mode="Async", fault_tolerant_policy="OnFailure").verdict(
        Incident(killed(), (killed(),), 2, frozenset({"worker-1"}), 0, facts), T0 + 3)
    assert decision.action is Action.RESTART_INSTANCE and plan.kind == "instance" and plan.ranks == (1,)


def test_below_min_and_a_recovered_retry_are_the_policys_decisions(tmp_path):
    p = policy(tmp_path)
    slots = SlotFacts(("0",), ElasticRange(2, 2), (("1", "xid.79"),))
    fail = p.below_min(slots, T0)
    assert fail.action is Action.FAIL_JOB and fail.restarts_left == 0 and fail.policy_clause == (
        "A1 local: devices 0 (isolated: 1 by xid.79): 1 healthy device(s), below the minimum 2 of "
        "--nproc-per-node 2 → fail_job")
    fault = killed()
    told = p.retry_recovered(fault, {"worker-1": 7, "worker-0": 7}, 2, T0 + 5)
    assert told.action is Action.NOTIFY and told.target.rank == 1 and told.restarts_left == 3
    assert told.policy_clause == ("D5 MindCluster retry: 2 worker(s) recovered in place and resumed "
                                  "(worker-0 at step 7, worker-1 at step 7) → training goes on")
