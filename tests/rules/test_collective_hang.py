"""Only collective timeouts on every rank read as a hang (issue 12 item 3, part B): the sets of
``ftwatch.policy.collectives`` in step with the packs' grades, the reading, and the policy clause."""

from __future__ import annotations

from pathlib import Path

import yaml

from ftwatch.config.policy import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.collectives import FOLLOW_ON_RULES, TIMEOUT_RULES, timeouts_only
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding

PACKS = Path(__file__).resolve().parents[2] / "ftwatch" / "rules" / "packs"
T0 = 1_795_219_200.0
FALL = FailureClass.FALLOUT


def _pack_rules() -> dict[str, dict]:
    out = {}
    for path in PACKS.glob("*.yaml"):
        for rule in (yaml.safe_load(path.read_text()) or {}).get("rules") or []:
            out[rule["id"]] = rule
    return out


def f(rule: str, rank: int, t: float, cls: FailureClass = FALL, kind: str = "keyword") -> Finding:
    return Finding(rule, kind, cls, Action.RESTART_IN_PLACE, Severity.ERROR, Origin(f"worker-{rank}", rank, "j"),
                   rule, T0 + t, int(t * 10))


def test_every_fallout_rule_its_source_grades_hang_is_a_timeout_or_its_follow_on():
    rules = _pack_rules()
    graded = {i for i, r in rules.items() if r.get("class") == "fallout" and r.get("source_class") == "hang"}
    assert graded <= TIMEOUT_RULES | FOLLOW_ON_RULES
    assert (TIMEOUT_RULES | FOLLOW_ON_RULES) <= set(rules)          # no id that no pack has
    assert all(rules[i]["class"] == "fallout" for i in TIMEOUT_RULES | FOLLOW_ON_RULES)


def test_only_timeouts_and_their_follow_on_lines_read_as_a_hang():
    watchdogs = [f("torch.nccl_watchdog_timeout", r, 600 + r) for r in range(4)]
    follow = [f("torch.nccl_operations_failed", r, 601 + r) for r in range(4)]
    abort = exit_finding(ProcessExit(Origin("worker-0", 0, "j"), 100, None, 6, T0 + 700), ExitCodeTable.load())
    assert timeouts_only(watchdogs + follow + [abort])
    an = analyse(watchdogs + follow + [abort])
    assert an.fallout_only and an.timeouts_only and an.fallout_class is FailureClass.HANG
    assert an.root_cause == watchdogs[0]                    # the earliest fallout stays the root cause


def test_a_peer_that_went_away_is_not_a_hang():
    closed = [f("gloo.connection_closed_by_peer", 1, 5.0)]
    assert not timeouts_only(closed)
    assert not timeouts_only([f("torch.nccl_watchdog_timeout", 0, 600)] + closed)
    assert not timeouts_only([f("torch.nccl_operations_failed", 0, 600)])       # no timeout itself
    assert analyse(closed).fallout_class is FailureClass.RETRYABLE_INFRA


def test_the_policy_restarts_an_all_timeout_incident_as_a_hang(tmp_path):
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", "j"), "j")
    stuck = [f("torch.nccl_heartbeat_timeout", r, 480 + r) for r in range(2)] + \
            [f("torch.nccl_watchdog_stuck", r, 480.5 + r) for r in range(2)]
    d = pol.decide(Incident(stuck[0], tuple(stuck), 2, frozenset(), 0), now=T0 + 500)
    assert d.action is Action.RESTART_JOB and d.root_cause == stuck[0]
    assert "only fallout found" in d.policy_clause and "read as hang" in d.policy_clause
