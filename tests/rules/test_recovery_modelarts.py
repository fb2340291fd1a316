"""D4 ModelArts strategies and degrade rules: one golden scenario each (seeds/002), FakeClock time.

Every step makes a fresh Policy over the same state folder, as a restarted ftwatch would, so the
streaks, memos and fault history are shown to persist.
"""

from __future__ import annotations

import pytest

from ftwatch.clock import FakeClock
from ftwatch.events import Action, Origin
from ftwatch.rules.timers import HangTracker

from recovery_helpers import DAY, died, incident, line, policy

RETRY = {"fault-tolerance/job-retry-num": "3"}
UNCOND = {**RETRY, "fault-tolerance/job-unconditional-retry": "true"}
HANG = {**RETRY, "fault-tolerance/hang-retry": "true"}
POD = {**RETRY, "fault-tolerance/pod-retry-num": "2"}
L2 = "[ERROR] DRV device 0 fault code 0x80CF8003"       # RestartRequest (L2), not in a frequency rule
L6 = "[ERROR] DRV device 5 fault code 0x80E18402"       # SeparateNPU (L6): cannot self-heal
USER = "[ERROR] DRV device 0 fault code 0x80C98002"     # user input
XID94 = "NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, Contained ECC error."   # RESTART_APP: not a chip self-heal


def step(state, clock, ann, text=None, *, rank=1, code=1, node=None, failed=None):
    """One failing attempt: ``text`` (if any) on ``rank``, then its exit with ``code``."""
    p = policy(state, annotations=ann)
    found = [line(text, clock, rank, node)] if text else []
    clock.advance(1)
    exit_ = died(clock, rank, code, node)
    d = p.decide(incident(exit_, *found, attempt=p.budgets.attempt, failed=failed), clock.time())
    clock.advance(600)
    return d, p.budgets


def hang(state, clock, ann):
    p = policy(state, annotations=ann)
    tracker = HangTracker(60.0, None)
    tracker.reset(clock.time())
    tracker.started(Origin("worker-0", 0, node="node-0"), clock.time())
    clock.advance(61)
    [finding] = tracker.check(clock.time())
    d = p.decide(incident(finding, attempt=p.budgets.attempt, failed=set()), clock.time())
    return d, p.budgets


# ------------------------------------------------------------------ in-place recovery

def test_in_place_recovery_costs_no_restart(tmp_path):
    clock = FakeClock()
    d, b = step(tmp_path, clock, RETRY, L2)
    assert d.action is Action.RESTART_IN_PLACE and d.target.node is None
    assert d.policy_clause.startswith("D4 in-place recovery: self-healable fault npu.80CF8003 (RestartRequest (L2))")
    assert (b.restarts_used, b.free_restarts, b.attempt, d.restarts_left) == (0, 1, 1, 3)


def test_in_place_degrades_to_isolation_when_self_healing_fails(tmp_path):
    clock = FakeClock()
    step(tmp_path, clock, RETRY, L2)
    d, b = step(tmp_path, clock, RETRY, L2.replace("80CF8003", "80C98003"))   # same chip, next attempt
    assert d.action is Action.ISOLATE_NODE and d.target.node == "node-1"
    assert "D4 in-place degrade: self-healing of node node-1 chip 0 code 80C98003 failed" in d.policy_clause
    assert "isolating job reschedule: isolate node node-1 first" in d.policy_clause
    assert b.restarts_used == 1


def test_same_node_device_fault_three_times_in_a_row_isolates(tmp_path):
    """Seed 002: 24 小时内连续3次 the same fault on one chip → isolating reschedule. An unlisted code
    (self-heal not tracked across its attempts) shows the count; user codes show it below."""
    clock = FakeClock()
    ds = [step(tmp_path, clock, RETRY, XID94)[0] for _ in range(3)]
    assert [d.action for d in ds] == [Action.RESTART_JOB] * 2 + [Action.ISOLATE_NODE]
    assert "D4 in-place degrade: node node-1 device rank1 fault xid.94 3 times in a row within 24 h (>= 3) → isolate" \
        in ds[2].policy_clause


def test_another_incident_in_between_breaks_the_same_fault_row(tmp_path):
    """"In a row" (seed 002 连续): a different fault between two hits starts the count again."""
    clock = FakeClock()
    other = "[ERROR] other: fault code 0x80CB8009"   # RestartRequest on node-2, between the hits
    ds = [step(tmp_path, clock, RETRY, text, rank=rank)[0]
          for text, rank in ((L2, 1), (other, 2), (L2, 1), (other, 2), (L2, 1))]
    assert [d.action for d in ds] == [Action.RESTART_IN_PLACE] * 5, [d.policy_clause for d in ds]


def test_a_non_npu_hardware_fault_is_a_job_reschedule_not_a_free_in_place(tmp_path):
    """Only self-healing NPU faults (L2-L5) recover in place for free: Xid 94 spends job-retry-num,
    so eight of them cannot restart the job eight times for free."""
    clock = FakeClock()
    ds = []
    for i in range(4):          # on four different nodes: no same-fault degrade, only the budget
        d, budgets = step(tmp_path, clock, RETRY, XID94, rank=i, node=f"node-{i}")
        ds.append(d)
    assert [d.action for d in ds] == [Action.RESTART_JOB] * 3 + [Action.FAIL_JOB], [d.policy_clause for d in ds]
    assert "xid.94 on node node-0 is not a self-healing chip fault (MindCluster L2-L5)" in ds[0].policy_clause
    assert "job-retry-num is exhausted (3/3) → fail_job" in ds[3].policy_clause
    assert budgets.free_restarts == 0 and budgets.restarts_used == 3


def test_same_fault_window_slides_past_24h(tmp_path):
    clock = FakeClock()
    step(tmp_path, clock, RETRY, L2)
    step(tmp_path, clock, RETRY, "[ERROR] other: fault code 0x80CB8009", rank=2)
    step(tmp_path, clock, RETRY, L2)
    clock.advance(DAY)                  # the first two hits of 80CF8003 leave the window
    step(tmp_path, clock, RETRY, "[ERROR] other: fault code 0x80CB8009", rank=3)
    d, _ = step(tmp_path, clock, RETRY, L2)
    assert d.action is Action.RESTART_IN_PLACE


@pytest.mark.parametrize("code", ["80C98002", "80CB8002"])
def test_user_input_code_three_times_reschedules_without_isolating(tmp_path, code):
    clock = FakeClock()
    text = USER.replace("80C98002", code)
    actions = []
    for i in range(5):
        d, b = step(tmp_path, clock, {"fault-tolerance/job-retry-num": "5"}, text)
        actions.append(d.action)
        assert d.target.node is None
    # the 2nd comes right after the 1st (a failed self-heal for any other code): still no isolation
    assert actions == [Action.RESTART_IN_PLACE] * 2 + [Action.RESTART_JOB] * 3
    assert "a user-input code → job reschedule, no node isolated" in d.policy_clause
    assert b.restarts_used == 3


# ------------------------------------------------------------------ unconditional job reschedule

def test_unconditional_reschedule_then_the_fourth_fails_as_user_code(tmp_path):
    clock = FakeClock()
    ann = {**UNCOND, "fault-tolerance/job-retry-num": "10"}
    ds = [step(tmp_path, clock, ann, "KeyError: 'lr'")[0] for _ in range(4)]
    assert [d.action for d in ds] == [Action.RESTART_JOB] * 3 + [Action.FAIL_JOB]
    assert ds[2].policy_clause == "D4 unconditional job reschedule: rebuild every pod (3/3 in a row)"
    assert "3 unconditional reschedules in a row with no node or chip fault" in ds[3].policy_clause


def test_a_chip_fault_between_resets_the_unconditional_streak(tmp_path):
    clock = FakeClock()
    ann = {**UNCOND, "fault-tolerance/job-retry-num": "10"}
    for _ in range(3):
        step(tmp_path, clock, ann, "KeyError: 'lr'")
    assert step(tmp_path, clock, ann, L2)[0].action is Action.RESTART_IN_PLACE
    d, b = step(tmp_path, clock, ann, "KeyError: 'lr'")
    assert d.action is Action.RESTART_JOB and b.streak("unconditional") == 1


def test_without_unconditional_retry_a_software_failure_fails(tmp_path):
    d, _ = step(tmp_path, FakeClock(), RETRY, "KeyError: 'lr'")
    assert d.action is Action.FAIL_JOB and "job-unconditional-retry is off" in d.policy_clause


def test_job_retry_num_bounds_the_reschedules(tmp_path):
    clock = FakeClock()
    ann = {"fault-tolerance/job-retry-num": "2", "fault-tolerance/job-unconditional-retry": "true"}
    ds = [step(tmp_path, clock, ann, "KeyError: 'lr'")[0] for _ in range(3)]
    assert [d.action for d in ds] == [Action.RESTART_JOB, Action.RESTART_JOB, Action.FAIL_JOB]
    assert "job-retry-num is exhausted (2/2)" in ds[2].policy_clause and ds[1].restarts_left == 0


# ------------------------------------------------------------------ isolating and pod reschedule

def test_isolating_job_reschedule_for_a_chip_that_cannot_self_heal(tmp_path):
    d, b = step(tmp_path, FakeClock(), RETRY, L6, rank=2)
    assert d.action is Action.ISOLATE_NODE and d.target.node == "node-2" and d.target.instance == "worker-2"
    assert "D4 isolating job reschedule: isolate node node-2 first, then rebuild the job" in d.policy_clause
    assert b.restarts_used == 1


def test_isolating_job_reschedule_for_a_node_fault(tmp_path):
    xid = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    d, _ = step(tmp_path, FakeClock(), RETRY, xid, rank=3)
    assert d.action is Action.ISOLATE_NODE and d.target.node == "node-3"


def test_pod_reschedule_recreates_only_the_failed_pod(tmp_path):
    d, b = step(tmp_path, FakeClock(), POD, L6, rank=2)
    assert d.action is Action.ISOLATE_NODE
    assert (d.target.instance, d.target.node) == ("worker-2", "node-2")
    assert "D4 pod reschedule: isolate node node-2, recreate only the failed pod worker-2 (1/2)" in d.policy_clause
    assert b.restarts_used == 0 and b.attempt == 1


def test_a_failed_pod_reschedule_degrades_to_a_job_reschedule(tmp_path):
    clock = FakeClock()
    step(tmp_path, clock, POD, L6, rank=2)
    d, b = step(tmp_path, clock, POD, "KeyError: 'lr'", rank=2)
    assert d.action is Action.RESTART_JOB
    assert "D4 pod reschedule degrade: the pod reschedule of worker-2 failed" in d.policy_clause
    assert b.restarts_used == 1


def test_pod_retries_exhausted_fall_back_to_isolating_job_reschedule(tmp_path):
    clock = FakeClock()
    ann = {**POD, "fault-tolerance/pod-retry-num": "1", "fault-tolerance/job-unconditional-retry": "true"}
    step(tmp_path, clock, ann, L6, rank=2)
    step(tmp_path, clock, ann, "KeyError: 'x'", rank=1)     # an unrelated attempt in between
    d, _ = step(tmp_path, clock, ann, L6.replace("device 5", "device 6"), rank=3)
    assert d.action is Action.ISOLATE_NODE and d.target.node == "node-3"
    assert "pod-retry-num exhausted (1/1)" in d.policy_clause and "isolating job reschedule" in d.policy_clause


# ------------------------------------------------------------------ hang restart

def test_hang_restart_three_in_a_row_then_fail(tmp_path):
    clock = FakeClock()
    ds = []
    for _ in range(4):
        d, b = hang(tmp_path, clock, HANG)
        ds.append(d)
    assert [d.action for d in ds] == [Action.RESTART_IN_PLACE] * 3 + [Action.FAIL_JOB]
    assert ds[0].policy_clause.startswith("D4 hang restart: kill the processes and rerun")
    assert "hang 4 in a row after 3 hang restarts" in ds[3].policy_clause
    assert b.restarts_used == 0 and b.free_restarts == 3


def test_another_incident_breaks_the_hang_streak(tmp_path):
    clock = FakeClock()
    ann = {**HANG, "fault-tolerance/job-unconditional-retry": "true"}
    hang(tmp_path, clock, ann)
    hang(tmp_path, clock, ann)
    step(tmp_path, clock, ann, "KeyError: 'lr'")
    d, b = hang(tmp_path, clock, ann)
    assert d.action is Action.RESTART_IN_PLACE and b.streak("hang") == 1


def test_without_hang_retry_a_hang_only_notifies(tmp_path):
    d, _ = hang(tmp_path, FakeClock(), RETRY)
    assert d.action is Action.NOTIFY and "hang-retry is off" in d.policy_clause


def test_modelarts_off_leaves_the_aimaster_policy(tmp_path):
    d, _ = step(tmp_path, FakeClock(), {}, L2)
    assert d.policy_clause.startswith("D2 ExitCodeAndErrorMsg")
