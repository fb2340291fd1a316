"""R3 escalation: frequency and duration rules across attempts and ftwatch restarts (FakeClock)."""

from __future__ import annotations

import json

import pytest

from ftwatch.clock import FakeClock
from ftwatch.events import Action
from ftwatch.policy.escalation import ECC_CODES, Escalator, FaultHistory, FrequencyRule

from recovery_helpers import DAY, JOB, died, incident, line, policy

UCE = "[ERROR] DRV device 0 fault code 0x80E01801"          # RestartBusiness (L3), in the 2-in-24-h list


def fail_with(state, clock, text, *, rank=1, node=None, **kw):
    """One attempt that fails with ``text`` on ``rank`` then exit 1; a fresh Policy each time (as a
    restarted ftwatch would make)."""
    p = policy(state, **kw)
    f = line(text, clock, rank, node)
    clock.advance(1)
    d = p.decide(incident(died(clock, rank, node=node), f, attempt=p.budgets.attempt), clock.time())
    return d


def test_the_ecc_list_is_the_readme_list():
    assert len(ECC_CODES) == 41 and "80E01801" in ECC_CODES and "80E18005" not in ECC_CODES


def test_uce_twice_in_24h_isolates_across_restarts_of_ftwatch(tmp_path):
    clock = FakeClock()
    first = fail_with(tmp_path, clock, UCE)
    assert first.action is Action.RESTART_IN_PLACE
    clock.advance(23 * 3600)
    second = fail_with(tmp_path, clock, UCE)
    assert second.action is Action.ISOLATE_NODE
    assert second.target.node == "node-1"
    assert "R3 frequency: node node-1 chip 0 code 80E01801: 2 hits in 24 h (>= 2) → ManuallySeparateNPU" \
        in second.policy_clause
    assert second.root_cause.fields["level"].startswith("ManuallySeparateNPU")
    saved = json.loads((tmp_path / "escalation" / "chips.json").read_text())
    assert set(saved["hits"]) == {"node-1|0|80E01801"} and "node-1|0|80E01801" in saved["escalated"]


def test_hits_count_per_chip_across_jobs(tmp_path):
    """MindCluster counts per chip: job A's UCE on node-1 chip 0, then job B's on the same chip
    isolates; a third job's UCE on another chip does not."""
    clock = FakeClock()
    assert fail_with(tmp_path, clock, UCE).action is Action.RESTART_IN_PLACE
    clock.advance(3600)
    p = policy(tmp_path, job="other-job")
    f = line(UCE, clock, 1)
    clock.advance(1)
    d = p.decide(incident(died(clock, 1), f, attempt=0), clock.time())
    assert d.action is Action.ISOLATE_NODE, d.policy_clause
    assert "node-1 chip 0 code 80E01801: 2 hits in 24 h" in d.policy_clause
    p3 = policy(tmp_path, job="third-job")
    g = line(UCE.replace("device 0", "device 3"), clock, 1)
    clock.advance(1)
    d3 = p3.decide(incident(died(clock, 1), g, attempt=0), clock.time())
    assert d3.action is Action.RESTART_IN_PLACE, d3.policy_clause


def test_the_window_slides_past_24h(tmp_path):
    clock = FakeClock()
    assert fail_with(tmp_path, clock, UCE).action is Action.RESTART_IN_PLACE
    clock.advance(DAY + 1)                   # the first hit has left the window
    assert fail_with(tmp_path, clock, UCE).action is Action.RESTART_IN_PLACE
    clock.advance(DAY - 10)                  # the second is still inside: 2 in 24 h
    assert fail_with(tmp_path, clock, UCE).action is Action.ISOLATE_NODE


def test_an_escalated_chip_stays_escalated_until_released(tmp_path):
    clock = FakeClock()
    fail_with(tmp_path, clock, UCE)
    fail_with(tmp_path, clock, UCE)
    clock.advance(5 * DAY)
    d = fail_with(tmp_path, clock, UCE)
    assert d.action is Action.ISOLATE_NODE and "standing since an earlier escalation" in d.policy_clause


def test_hits_are_per_chip_and_per_node(tmp_path):
    clock = FakeClock()
    assert fail_with(tmp_path, clock, UCE).action is Action.RESTART_IN_PLACE
    assert fail_with(tmp_path, clock, UCE.replace("device 0", "device 1")).action is Action.RESTART_IN_PLACE
    assert fail_with(tmp_path, clock, UCE, rank=2).action is Action.RESTART_IN_PLACE      # node-2
    assert fail_with(tmp_path, clock, UCE.replace("device 0", "device 1")).action is Action.ISOLATE_NODE


def test_one_attempt_counts_once(tmp_path):
    clock = FakeClock()
    p = policy(tmp_path)
    a, b = line(UCE, clock), line(UCE, clock.advance(0.5) and clock)
    clock.advance(1)
    d = p.decide(incident(died(clock), a, b, attempt=p.budgets.attempt), clock.time())
    assert d.action is Action.RESTART_IN_PLACE
    again = p.decide(incident(died(clock, 2), a, b, attempt=d.attempt), clock.time())   # same attempt
    assert "R3 frequency" not in again.policy_clause


def test_hbmc_parity_needs_three(tmp_path):
    clock = FakeClock()
    text = "[ERROR] DRV device 2 fault code 0x80E18005"      # RestartNPU (L5)
    assert [fail_with(tmp_path, clock, text).action for _ in range(3)] == [
        Action.RESTART_JOB, Action.RESTART_JOB, Action.ISOLATE_NODE]


def test_link_down_five_times_then_released_after_48h_quiet(tmp_path):
    clock = FakeClock()
    text = "[ERROR] hccp: device 4 event id 0x81078603 (RoCE link down); HCCL connection timed out"

    def attempt():
        p = policy(tmp_path)
        down = line(text, clock, rank=3)
        clock.advance(30)
        nccl = line("EI0006: HCCL socket connection timed out", clock, rank=3)
        clock.advance(1)
        return p.decide(incident(died(clock, 3), down, nccl, attempt=p.budgets.attempt), clock.time())

    actions = []
    for _ in range(5):
        actions.append(attempt().action)
        clock.advance(3600)
    assert Action.ISOLATE_NODE not in actions[:4] and actions[4] is Action.ISOLATE_NODE
    clock.advance(49 * 3600)                 # 48 h without a link down: the isolation lapses
    assert attempt().action is not Action.ISOLATE_NODE


def test_link_down_lasting_over_20s_notes_preseparate(tmp_path):
    clock = FakeClock()
    p = policy(tmp_path)
    down = line("device 4 fault, event id: 0x81078603, assertion: 1", clock, rank=3)
    clock.advance(25)
    up = line("device 4 fault, event id: 0x81078603, assertion: 0", clock, rank=3)
    clock.advance(1)
    d = p.decide(incident(died(clock, 3, code=137), down, up, attempt=0), clock.time())
    assert "R3 duration: 81078603 on node node-3 chip 4 down 25 s (> 20 s) → PreSeparateNPU" in d.policy_clause

    p2 = policy(tmp_path / "other")
    down = line("device 4 fault, event id: 0x81078603, assertion: 1", clock, rank=3)
    clock.advance(5)
    up = line("device 4 fault, event id: 0x81078603, assertion: 0", clock, rank=3)
    clock.advance(30)
    d = p2.decide(incident(died(clock, 3, code=137), down, up, attempt=0), clock.time())
    assert "R3 duration" not in d.policy_clause


@pytest.mark.parametrize("code", ["80C98002", "80CB8002"])
def test_user_input_codes_never_isolate_even_under_a_frequency_rule(tmp_path, code):
    # The docs' example: set 80CB8002 to 2 in 24 h -> ManuallySeparateNPU. ftwatch caps it at a reschedule.
    clock = FakeClock()
    esc = Escalator(FaultHistory(None, JOB), [FrequencyRule(frozenset({code}), 2, DAY)])
    for attempt in range(3):
        f = line(f"[ERROR] DRV device 0 fault code 0x{code}", clock)
        esc.observe([f], str(attempt))
        (out,), clauses = esc.apply([f], clock.time())
        clock.advance(60)
    assert out.action is Action.RESTART_JOB and "never isolate" in clauses[0]


@pytest.mark.parametrize("code", ["80C98002", "80CB8002"])
def test_user_input_codes_restart_under_aimaster_and_never_isolate(tmp_path, code):
    clock = FakeClock()
    for _ in range(4):
        d = fail_with(tmp_path, clock, f"[ERROR] DRV device 0 fault code 0x{code}")
        assert d.action is Action.RESTART_IN_PLACE
        assert "user-input chip code: reschedule, never isolate" in d.policy_clause


def test_escalation_can_be_turned_off(tmp_path):
    from ftwatch.config.recovery import RecoveryConfig
    clock = FakeClock()
    off = RecoveryConfig(escalation=False)
    assert [fail_with(tmp_path, clock, UCE, recovery=off).action for _ in range(3)] == [Action.RESTART_IN_PLACE] * 3
