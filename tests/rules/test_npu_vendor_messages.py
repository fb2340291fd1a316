"""Vendor messages of the Ascend stack that name a cause (issue 12, knowledge widened from sources):
HCCL's heartbeat diagnosis (``ExceptionType:[...]``, one grade per type, as heartbeat.cc names
them) and MindSpore's device out-of-memory exceptions. Sources and grades are in
``ftwatch/rules/packs/npu_codes.yaml``.
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

RULES = load_rules()
HEAD = ("[ERROR]HCCL(835695,python):2025-10-23-17:28:06.049.385[task_exception_handler.cc:610][835695]"
        "[TaskExecStage][HeartbeatAbnormal]Cluster Exception Location[IP/ID]:[10.222.9.255/2], "
        "Arrival Time:[Thu Oct 23 17:25:58 2025], Discoverer:[10.222.9.255/0], ")


def _feed(text: str) -> list:
    return Engine(RULES).feed(Origin("worker-0"), (text.rstrip("\n") + "\n").encode(), 1000.0, final=True)


@pytest.mark.parametrize("kind, rule_id, failure_class, action", [
    ("Heartbeat Lost Occurred", "hccl.heartbeat_lost", FailureClass.FALLOUT, Action.RESTART_JOB),
    ("Stuck Occurred", "hccl.heartbeat_stuck", FailureClass.HANG, Action.RESTART_JOB),
    ("Error cqe Occurred", "hccl.heartbeat_error_cqe", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("Op Inconsistent Occurred", "hccl.heartbeat_op_inconsistent", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Notify Wait Error Occurred", "hccl.heartbeat_notify_wait_error", FailureClass.FALLOUT,
     Action.RESTART_IN_PLACE),
    ("OpRetry Not Supported Occurred", "hccl.heartbeat_opretry_not_supported", FailureClass.INFO, Action.NONE),
])
def test_each_heartbeat_exception_type_has_its_grade(kind, rule_id, failure_class, action):
    [finding] = _feed(HEAD + f"ExceptionType:[{kind}], Possible Reason:...")
    assert (finding.rule_id, finding.failure_class, finding.action) == (rule_id, failure_class, action)


def test_heartbeat_line_inside_an_ei0002_block_is_its_own_finding():
    """HCCL prints the abnormal device inside the EI0002 block of the rank that waited: the block's
    time-out stays fallout and the heartbeat line, which names the stuck rank, is a finding of its own."""
    findings = _feed(
        "EI0002: [PID: 7277] 2024-11-28-11:59:30.645.648 The wait execution of the Notify register times out. "
        "Reason: The Notify register has not received the Notify record from remote rank [unknown].base "
        "information: [streamID:[2282987520], taskID[5]] task information: [\n"
        "there are(is) 1 abnormal device(s):\n"
        "    Cluster Exception Location[IP/ID]:[90.90.92.240/1], Arrival Time:[Thu Nov 28 11:56:34 2024], "
        "Discoverer:[90.90.92.240/0], ExceptionType:[Stuck Occurred], Possible Reason:1.Host process is stuck, "
        "2.Device task is stuck\n]")
    by_rule = {f.rule_id: f for f in findings}
    assert by_rule["hccl.ei0002_notify_wait_timeout"].failure_class is FailureClass.FALLOUT
    assert by_rule["hccl.heartbeat_stuck"].failure_class is FailureClass.HANG


def test_the_docs_table_of_exception_types_is_no_finding():
    assert not _feed("| 2 | Process hang | STUCK | Stuck Occurred | Polls the ingress/egress counts |")


@pytest.mark.parametrize("line", [
    "RuntimeError: Out of Memory!!! Request memory size: 1088627200B, Memory Statistic:",
    "RuntimeError: Device(id:3) memory isn't enough and alloc failed, kernel name: Default/MatMul-op1, "
    "alloc size: 1073741824B.",
    "[EXCEPTION] DEVICE(1,f,python):2022-03-01-10:12:12.123.456 [ascend_memory_manager.cc:130] MallocDynamicMem] "
    "Out of memory!!! total[32212254720] (dynamic[0] memory pool[3221225472]) malloc [1073741824] failed!",
])
def test_mindspore_out_of_memory_is_oom(line):
    [finding] = [f for f in _feed(line) if f.rule_id == "mindspore.device_out_of_memory"]
    assert (finding.failure_class, finding.action) == (FailureClass.OOM, Action.FAIL_JOB)


def test_mindspore_memory_pool_warnings_are_no_oom():
    findings = _feed(
        "[WARNING] PRE_ACT(2312,f,python):2024-03-01-10:12:12.123.456 [mem_dynamic_allocator.cc:123] "
        "CalMemBlockAllocSize] Memory not enough: current free memory size[1048576] is smaller than required "
        "size[2097152].")
    assert not any(f.failure_class is FailureClass.OOM for f in findings)
