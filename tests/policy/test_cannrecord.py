"""A torch_npu return code spelled out by the error CANN recorded after it (``ftwatch.policy.cannrecord``,
root-cause rule 7): ``CannRecords`` reads an incident's errors once per instance and answers each code
as a search of every error does."""

from __future__ import annotations

import random

from ftwatch.events import NOT_LOG_LINES, precedes
from ftwatch.policy.cannrecord import (_CANN_CODE, INTERNAL_RECORD_RULES, SPELLED_OUT_RULES, WRAPPED_WINDOW,
                                       CannRecords, wrapped_code)
from ftwatch.testing import T0, finding

LINES = {
    "hccl.result_timeout": "npu function error: HcclAllReduce, error code is 4",
    "acl.rt_stream_sync_timeout": "aclrtSynchronizeStream failed, error code is 107020",
    "torch_npu.synchronize_failed": "RuntimeError: synchronize:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:1",
    "cann.ee1002_stream_sync_timeout": "EE1002: [PID: 1] 2026-11-20-10:00:00 The stream sync timed out.",
    "cann.ez9999_kernel_error": "EZ9999: Inner Error!",
    "cann.ee9999_runtime_internal_error": "EE9999: Inner Error!",
    "cann.aicore_errorstr_out_of_bounds": "errorStr: The DDR address of the MTE instruction is out of range.",
    "python.runtime_error": "RuntimeError: something else",
}


def searched(f, errors) -> bool:
    """The reading by a search of every error (as the rule was first written)."""
    def same_record(e):
        return all(g.rule_id in INTERNAL_RECORD_RULES for g in errors
                   if g.origin.instance == f.origin.instance and precedes(f, g) and precedes(g, e))
    internal = f.rule_id in INTERNAL_RECORD_RULES
    return (wrapped_code(f) or internal) and any(
        not wrapped_code(e) and e.kind not in NOT_LOG_LINES and e.origin.instance == f.origin.instance
        and precedes(f, e)
        and ((not internal and e.time - f.time <= WRAPPED_WINDOW and _CANN_CODE.search(e.line))
             or (e.rule_id in SPELLED_OUT_RULES and same_record(e)))
        for e in errors)


def test_each_return_code_is_answered_as_a_search_of_every_error_answers_it():
    rng = random.Random(7)
    positives = 0
    for _ in range(400):
        errors = []
        for seq in range(rng.randint(1, 20)):
            rule = rng.choice(list(LINES))
            errors.append(finding(rule, line=LINES[rule], time=T0 + rng.choice([0.0, 0.5, 1.0, 3.0, 6.0]), seq=seq,
                                  rank=rng.randint(0, 1), kind=rng.choice(["keyword"] * 6 + ["exit_code"])))
        rng.shuffle(errors)
        records = CannRecords(errors)
        for f in errors:
            assert records.spelled_out(f) is bool(searched(f, errors))
            positives += records.spelled_out(f)
    assert positives > 100
