"""Rule 21 of rootcause: a fault graded "try again" that failed again on the same target in another
try the log holds (ftwatch.policy.retried)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.retried import retried_on_target
from ftwatch.policy.rootcause import analyse

T0 = 1_795_219_200.0
ORIGIN = Origin("recover", None, "job", "launcher-0", "stdout", "replay")


def reset_failed(host: str, device: int, t: float) -> Finding:
    return Finding("tt.post_reset_failed", "keyword", FailureClass.HARDWARE_NODE, Action.RESTART_JOB,
                   Severity.ERROR, ORIGIN, f"[{host}]  Error: POST_RESET failed for device {device}.",
                   T0 + t, seq=int(t))


def launch_failed(app: str, child: str, t: float, verb: str = "launch") -> Finding:
    line = (f"{verb} failed on x4201c0s4b0n0: Couldn't forward RPC {verb}({app}) to child "
            f"{child}.hsn.cm.aurora.alcf.anl.gov: Resource temporarily unavailable")
    return Finding("pals.rpc_forward_failed", "keyword", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB,
                   Severity.ERROR, ORIGIN, line, T0 + t, seq=int(t))


def test_the_same_device_failing_every_reset_run_is_isolated_on_its_host():
    fs = [reset_failed("glx-03", 5, t) for t in (1.0, 2.0, 3.0)]
    rc = analyse(fs).root_cause
    assert rc.rule_id == "tt.post_reset_failed"
    assert rc.failure_class is FailureClass.HARDWARE_NODE and rc.action is Action.ISOLATE_NODE
    assert rc.origin.node == "glx-03" and rc.fields["tries"] == 3


def test_one_failed_reset_keeps_its_retry_grade():
    rc = analyse([reset_failed("glx-03", 21, 1.0)]).root_cause
    assert rc.action is Action.RESTART_JOB and rc.origin.node == "launcher-0"


def test_failures_on_different_devices_or_hosts_are_no_repeat():
    assert retried_on_target(reset_failed("glx-03", 5, 1.0),
                             [reset_failed("glx-03", 5, 1.0), reset_failed("glx-03", 6, 2.0)]) is None
    assert retried_on_target(reset_failed("glx-03", 5, 1.0),
                             [reset_failed("glx-03", 5, 1.0), reset_failed("glx-04", 5, 2.0)]) is None


def test_two_launches_that_cannot_reach_the_same_child_isolate_the_child():
    fs = [launch_failed("8d2b61f0-47ae", "x4513c0s7b0n0", 1.0), launch_failed("f17c9e02-5d34", "x4513c0s7b0n0", 9.0)]
    rc = analyse(fs).root_cause
    assert rc.failure_class is FailureClass.HARDWARE_NODE and rc.action is Action.ISOLATE_NODE
    assert rc.origin.node == "x4513c0s7b0n0"      # the child, not the parent that forwarded


def test_one_applications_repeated_pings_are_one_try():
    fs = [launch_failed("5c1e70a2-9d13", "x4707c7s2b0n0", 1.0, "ping"),
          launch_failed("5c1e70a2-9d13", "x4707c7s2b0n0", 5.0, "ping")]
    rc = analyse(fs).root_cause
    assert rc.failure_class is FailureClass.RETRYABLE_INFRA and rc.action is Action.RESTART_JOB


def test_two_launches_failing_on_different_children_keep_the_retry_grade():
    fs = [launch_failed("8d2b61f0-47ae", "x4513c0s7b0n0", 1.0), launch_failed("f17c9e02-5d34", "x4600c0s1b0n0", 9.0)]
    assert analyse(fs).root_cause.action is Action.RESTART_JOB


def test_other_rules_are_not_read():
    f = Finding("nccl.unhandled_system_error", "keyword", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB,
                Severity.ERROR, ORIGIN, "NCCL error: unhandled system error", T0, seq=0)
    assert retried_on_target(f, [f, f]) is None
