"""The same device failing again (ftwatch.policy.escalation ``DEVICE_REPEAT``): a device fault graded
below isolation (Xid 94 contained ECC: restart in place) that comes back on the same GPU in a later
attempt within 24 h isolates the node; another GPU, the same attempt, an application Xid, or a
repeat after the window do not (FakeClock)."""

from __future__ import annotations

from ftwatch.clock import FakeClock
from ftwatch.config.recovery import RecoveryConfig
from ftwatch.events import Action

from recovery_helpers import DAY, died, incident, line, policy

XID94 = "NVRM: Xid (PCI:0000:3b:00): 94, pid=3004, name=python3, Contained: SM (0x1). RST: No, D-RST: No"
XID13 = ("NVRM: Xid (PCI:0000:3b:00): 13, pid=3004, name=python3, Graphics SM Warp Exception on "
         "(GPC 2, TPC 5, SM 0): Out Of Range Address")


def attempt(p, clock, *texts, rank=1):
    found = [line(t, clock, rank) for t in texts]
    clock.advance(1)
    return p.decide(incident(died(clock, rank), *found, attempt=p.budgets.attempt), clock.time())


def test_a_contained_ecc_error_back_on_the_same_gpu_isolates_the_node(tmp_path):
    clock = FakeClock()
    p = policy(tmp_path)
    first = attempt(p, clock, XID94)
    assert first.action is Action.RESTART_IN_PLACE
    clock.advance(600)
    second = attempt(policy(tmp_path), clock, XID94)
    assert second.action is Action.ISOLATE_NODE, second.policy_clause
    assert "device repeat: xid.94 on node node-1 device 0000:3b:00: 2 hits in 24 h" in second.policy_clause
    assert second.target.node == "node-1"


def test_another_gpu_or_the_same_attempt_is_no_repeat(tmp_path):
    clock = FakeClock()
    assert attempt(policy(tmp_path), clock, XID94, XID94).action is Action.RESTART_IN_PLACE   # one attempt
    clock.advance(600)
    other = attempt(policy(tmp_path), clock, XID94.replace("0000:3b:00", "0000:86:00"))
    assert other.action is Action.RESTART_IN_PLACE, other.policy_clause


def test_a_repeat_after_24h_is_a_new_fault(tmp_path):
    clock = FakeClock()
    assert attempt(policy(tmp_path), clock, XID94).action is Action.RESTART_IN_PLACE
    clock.advance(DAY + 60)
    assert attempt(policy(tmp_path), clock, XID94).action is Action.RESTART_IN_PLACE


def test_an_application_xid_is_not_counted(tmp_path):
    """Xid 13 is the application's (catalog: RESTART_APP); its repeats are the program's to fix."""
    clock = FakeClock()
    flags = {"fault_tolerant_policy": "OnFailure"}
    first = attempt(policy(tmp_path, **flags), clock, XID13)
    clock.advance(600)
    second = attempt(policy(tmp_path, **flags), clock, XID13)
    assert first.action is second.action and second.action is not Action.ISOLATE_NODE


def test_escalation_off_leaves_the_repeat_alone(tmp_path):
    clock = FakeClock()
    off = RecoveryConfig(escalation=False)
    attempt(policy(tmp_path, recovery=off), clock, XID94)
    clock.advance(600)
    assert attempt(policy(tmp_path, recovery=off), clock, XID94).action is Action.RESTART_IN_PLACE


ULF = "[rank1]: RuntimeError: CUDA error: unspecified launch failure"


def test_an_ambiguous_cuda_error_back_on_the_same_rank_isolates_under_on_failure(tmp_path):
    """'unspecified launch failure' is graded relaunch-once; OnFailure relaunches in place, and the
    same error on the same device in the next attempt points at the device."""
    clock = FakeClock()
    flags = {"fault_tolerant_policy": "OnFailure"}
    first = attempt(policy(tmp_path, **flags), clock, ULF)
    assert first.action is Action.RESTART_IN_PLACE
    clock.advance(600)
    second = attempt(policy(tmp_path, **flags), clock, ULF)
    assert second.action is Action.ISOLATE_NODE, second.policy_clause
    assert "device repeat: cuda.unspecified_launch_failure on node node-1 device rank1" in second.policy_clause
    assert second.root_cause.failure_class.value == "hardware_node"


def test_an_ambiguous_cuda_error_on_another_rank_is_no_repeat(tmp_path):
    clock = FakeClock()
    flags = {"fault_tolerant_policy": "OnFailure"}
    attempt(policy(tmp_path, **flags), clock, ULF)
    clock.advance(600)
    other = attempt(policy(tmp_path, **flags), clock, ULF.replace("rank1", "rank2"), rank=2)
    assert other.action is Action.RESTART_IN_PLACE, other.policy_clause


def test_a_program_error_repeating_is_never_a_device_repeat(tmp_path):
    """An illegal address is graded the program's (sticky_program, fail): no device reading."""
    clock = FakeClock()
    flags = {"fault_tolerant_policy": "OnFailure"}
    ima = "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered"
    attempt(policy(tmp_path, **flags), clock, ima)
    clock.advance(600)
    assert attempt(policy(tmp_path, **flags), clock, ima).action is not Action.ISOLATE_NODE


POST_RESET = " Error: POST_RESET failed for device 21."


def test_a_tenstorrent_post_reset_failure_back_on_the_same_device_isolates(tmp_path):
    """tt-smi's POST_RESET failure is often transient (tt-metal issue 54391: retry), so one is a
    relaunch; the same device failing it again in the next attempt is a wedged chip."""
    clock = FakeClock()
    first = attempt(policy(tmp_path), clock, POST_RESET)
    assert first.action is Action.RESTART_JOB, first.policy_clause
    clock.advance(600)
    again = attempt(policy(tmp_path), clock, POST_RESET.replace("21", "5"))
    assert again.action is Action.RESTART_JOB, again.policy_clause      # another device: no repeat
    clock.advance(600)
    third = attempt(policy(tmp_path), clock, POST_RESET)
    assert third.action is Action.ISOLATE_NODE, third.policy_clause
