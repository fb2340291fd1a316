"""The Ascend runtime / ACL return codes (aclError) are graded as a whole enum, not only the codes a
corpus happened to show (issue 12, knowledge widened from its sources).

The enum is the vendor's: ``rt_error_codes.h`` (hicann/runtime, ACL_ERROR_RT_*) and the ACL codes
torch_npu describes in ``NPUErrorCodes.h`` (acl_base.h's 1000xx, 1480xx, 2000xx, 5000xx). Every code
torch_npu can print after ``error code is`` must reach a rule of the ``acl.`` family (or ``aclnn.``),
and each grade follows the source named in ``npu_codes.yaml``.
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

RULES = load_rules()
LINE = ("RuntimeError: npuSynchronizeDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:508 "
        "NPU function error: AclrtSynchronizeDeviceWithTimeout, error code is {}")


def _codes(*spans: tuple[int, int]) -> list[int]:
    return [code for lo, hi in spans for code in range(lo, hi + 1)]


#: rt_error_codes.h (hicann/runtime@15c6c8db) and NPUErrorCodes.h's ACL codes.
RT_ENUM = _codes((107000, 107041), (207000, 207020), (507000, 507057), (507899, 507915))
ACL_ENUM = _codes((100000, 100045), (148046, 148052), (200000, 200007), (300000, 300000), (500000, 500005))


def _finding(line: str):
    findings = Engine(RULES).feed(Origin("worker-0"), (line + "\n").encode(), 1000.0, final=True)
    assert len(findings) == 1, [(f.rule_id, f.line) for f in findings]
    return findings[0]


@pytest.mark.parametrize("code", [c for c in RT_ENUM + ACL_ENUM if c < 300000])
def test_every_user_or_resource_code_reaches_an_acl_rule(code):
    """1XXXXX and 2XXXXX codes: the docs' rules 1 and 2 name the job's side, and a rule says so."""
    finding = _finding(LINE.format(code))
    assert finding.rule_id.startswith("acl."), (code, finding.rule_id)


@pytest.mark.parametrize("code, rule_id, failure_class, action", [
    (107000, "acl.rt_usage_error", FailureClass.USER_CODE, Action.FAIL_JOB),
    (148049, "acl.rt_usage_error", FailureClass.USER_CODE, Action.FAIL_JOB),        # ASCEND_OPP_PATH
    (207008, "acl.rt_usage_error", FailureClass.USER_CODE, Action.FAIL_JOB),        # no stream resource
    (507008, "acl.rt_usage_error", FailureClass.USER_CODE, Action.FAIL_JOB),        # SOC version
    (107019, "acl.rt_timeout", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (107020, "acl.rt_timeout", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (507014, "acl.rt_timeout", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (507046, "acl.rt_timeout", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (507047, "acl.rt_timeout", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (200000, "acl.rt_memory_allocation", FailureClass.OOM, Action.FAIL_JOB),
    (207005, "acl.rt_memory_allocation", FailureClass.OOM, Action.FAIL_JOB),
    (207001, "acl.rt_207001_memory_allocation", FailureClass.OOM, Action.FAIL_JOB),  # older rule kept
    (107022, "acl.rt_task_aborted", FailureClass.FALLOUT, Action.NONE),
    (507023, "acl.rt_task_aborted", FailureClass.FALLOUT, Action.NONE),
    (507010, "acl.rt_device_link_lost", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (507901, "acl.rt_device_link_lost", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (507043, "acl.rt_kernel_trap", FailureClass.USER_CODE, Action.FAIL_JOB),
    (207003, "acl.rt_overflow_status", FailureClass.USER_CODE, Action.RESTART_IN_PLACE),
    (107099, "acl.rt_code_1xxxxx", FailureClass.USER_CODE, Action.FAIL_JOB),         # a code newer than the header
    (207099, "acl.rt_code_2xxxxx", FailureClass.USER_CODE, Action.FAIL_JOB),
    (507054, "acl.rt_507054_hbm_multi_bit_ecc", None, None),                         # device faults keep their rules
])
def test_codes_are_graded_as_their_source_says(code, rule_id, failure_class, action):
    finding = _finding(LINE.format(code))
    assert finding.rule_id == rule_id
    if failure_class is not None:
        assert (finding.failure_class, finding.action) == (failure_class, action)


@pytest.mark.parametrize("line, rule_id", [
    ("        synchronize event failed, runtime result = 107020[FUNC:ReportCallError][FILE:log_inner.cpp][LINE:148]",
     "acl.rt_timeout"),
    ("[EXCEPTION] GE(1,f,python):2021-09-11-16:48:31.511.063 [runtime_model.cc:233] Run] Call rt api "
     "rtStreamSynchronize failed, ret: 507046", "acl.rt_timeout"),
    ("RuntimeError: ACL stream synchronize failed, error code:207005", "acl.rt_memory_allocation"),
])
def test_every_print_form_of_a_code_is_read(line, rule_id):
    assert _finding(line).rule_id == rule_id


@pytest.mark.parametrize("line", [
    "error code is 1070200",                                    # a longer number
    "[INFO] RUNTIME(553,python):2026-09-17-04:55:13.065.712 stream 107020 created",
    "HCCL function error: HcclAllReduce(...), error code is 7",  # an HcclResult, not an aclError
])
def test_other_numbers_are_no_acl_code(line):
    findings = Engine(RULES).feed(Origin("worker-0"), (line + "\n").encode(), 1000.0, final=True)
    assert not any(f.rule_id.startswith("acl.rt_") for f in findings)
