"""A torch_npu return-code line spelled out by what CANN recorded for it (SPEC R7, root-cause rule
7 of ``ftwatch.policy.rootcause``): the code yields to the specific reading of the same failure.

torch_npu raises a failed ACL or HCCL call as one message whose first line carries only the
return code; the error CANN recorded for it follows on lines of their own (below), which a
traceback record does not take in. :meth:`CannRecords.spelled_out` says when such a code is followed by that
specific reading, so that the root cause is the recorded error, not the code.
"""

from __future__ import annotations

import bisect
import re
from typing import Sequence

from ftwatch.events import NOT_LOG_LINES, Finding

#: Ascend return-code lines (issue 12 item 2): torch_npu raises a failed ACL or HCCL call as one
#: message, ``<func>:<file>:<line> NPU function error: <call>, error code is N``, then its
#: ``[ERROR] ... ERRxxxxx`` line and ``[Error]: <meaning>``, then the error CANN recorded for it
#: (``EJ0001: ...``, ``EI0006: ...``, ``EL0004: ...``) on the lines after (Ascend/pytorch
#: torch_npu/csrc/core/npu/NPUException.h NPU_CHECK_ERROR / OPS_CHECK_ERROR:
#: ``"\n", c10_npu_get_error_message()``). A traceback record ends at the first line of that
#: message, so the rest arrive as findings of their own; the code's rule (priority 5 in
#: ``npu_codes.yaml``) then yields to the real error the same instance prints within
#: ``WRAPPED_WINDOW`` seconds after it, the more specific reading of the same failure.
WRAPPED_CODE_PREFIXES = ("hccl.result_", "acl.rt_", "aclnn.")
WRAPPED_CODE_RULES = frozenset({"torch_npu.synchronize_failed"})
WRAPPED_WINDOW = 2.0
#: Rules on lines that carry no CANN code of their own but spell out the internal error record
#: (``EZ9999``) printed after a return code: the AI Core's ``errorStr`` (the "extend info" line of
#: device_error_core_proc.cc) names what the faulting kernel did, so it is the specific reading too.
SPELLED_OUT_RULES = frozenset({"cann.aicore_errorstr_out_of_bounds"})
#: CANN's internal error records (code 9999) that lie between a return code and its ``errorStr``.
INTERNAL_RECORD_RULES = frozenset({"cann.ez9999_kernel_error", "cann.ee9999_runtime_internal_error"})
#: A CANN error code (level E, a module character, four digits: ``EJ0001``, ``EE1002``, ``EL0004``;
#: hiascend.com CANN troubleshooting "error code" reference) on the line that spells a code out.
#: Only the codes CANN files as specific errors (0000-8999): 9000-9999 are its internal errors
#: (``EE9999: Inner Error!``, ``EH9999``, ``EZ9999``), which the same reference says to read with
#: the messages around them, so they are no more specific than the return code (the aclError enum
#: in ``npu_codes.yaml`` grades each code by its own source).
_CANN_CODE = re.compile(r"\bE[0-9A-Z][0-8][0-9]{3}\b")
def wrapped_code(f: Finding) -> bool:
    """Says whether ``f`` is a torch_npu return-code line whose message goes on with what CANN
    recorded (``WRAPPED_CODE_PREFIXES``)."""
    return f.kind == "keyword" and (f.rule_id.startswith(WRAPPED_CODE_PREFIXES) or f.rule_id in WRAPPED_CODE_RULES)


class CannRecords:
    """An incident's real errors read once per instance, so that :meth:`spelled_out` asks about one
    return code in O(log n): each code searching every error (and, for an ``errorStr``, every error
    again between them) made root cause O(n^2) and worse in the codes (a 16-card job's log with its
    ``EE1002`` message repeated, ~30,000 lines: over 100 s).

    Args:
        errors: the real errors (root cause's candidates).
    """

    def __init__(self, errors: Sequence[Finding]):
        mine: dict[str, list[Finding]] = {}
        for e in errors:
            mine.setdefault(e.origin.instance, []).append(e)
        self._by: dict[str, tuple] = {}
        for instance, own in mine.items():
            own.sort(key=_key)
            keys = [_key(e) for e in own]
            # the errors on a line with a CANN code that may spell a return code out (their keys and times)
            spelling = [e for e in own if _may_spell(e) and _CANN_CODE.search(e.line)]
            plain = [len(own)] * (len(own) + 1)         # the first error from each place on that is no internal record
            for k in range(len(own) - 1, -1, -1):
                plain[k] = plain[k + 1] if own[k].rule_id in INTERNAL_RECORD_RULES else k
            self._by[instance] = (own, keys, [_key(e) for e in spelling], [e.time for e in spelling], plain)

    def spelled_out(self, f: Finding) -> bool:
        """Says whether the return-code line ``f`` is followed, on its instance and within
        ``WRAPPED_WINDOW`` seconds, by a real error on a line with a CANN error code: the rest of its
        message; or whether ``f`` (a return-code line or an internal ``EZ9999`` / ``EE9999`` record) is
        followed by an AI Core ``errorStr`` with only internal records between them."""
        internal = f.rule_id in INTERNAL_RECORD_RULES
        if not (wrapped_code(f) or internal) or f.origin.instance not in self._by:
            return False
        own, keys, spelling, times, plain = self._by[f.origin.instance]
        at = _key(f)
        if not internal:                # the first such error after it is the earliest: within the window?
            k = bisect.bisect_right(spelling, at)
            if k < len(spelling) and times[k] - f.time <= WRAPPED_WINDOW:
                return True
        nxt = plain[bisect.bisect_right(keys, at)]      # past the internal records right after it
        return nxt < len(own) and own[nxt].rule_id in SPELLED_OUT_RULES and _may_spell(own[nxt])


def _key(f: Finding) -> tuple[float, int]:
    return f.time, f.seq


def _may_spell(e: Finding) -> bool:
    """``e`` may be the rest of a return code's message: no return code itself, a logged line."""
    return not wrapped_code(e) and e.kind not in NOT_LOG_LINES
