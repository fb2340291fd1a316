"""An abort graded by the report it prints about its own cause (issue 12 item 2, the C++ side of
"a traceback's final exception decides user code unless its class or its message says
infrastructure").

abort(3) is how a native runtime ends a process on a reason it prints first: libstdc++'s verbose
terminate handler (``terminate called after throwing an instance of 'T'`` then ``  what():  ...``;
libc++abi's ``terminating due to uncaught exception of type T: ...``), glibc's failed ``assert(3)``
(``<file>:<line>: <func>: Assertion `...' failed.``), torch_xla's ``XLA_CHECK`` (``<file>:<line> :
Check failed: ...``, thrown as ``std::runtime_error``). A bare abort with no such report stays a
weak exit that the policy restarts once (``process.abort_report``; the Lightning case that ran the
next day); a reason no rule grades infrastructure is the program's (``stacks_vocab.tsv``
``cpp.uncaught_exception_what``, ``process.assert_failed``, ``xla.check_failed_runtime_error``); a
``what()`` that is an errno's text (``std::system_error``: ``Connection reset by peer``) names a
failed system call, not whose doing it was, so it makes no finding and decides as before. Each test
fails without its change (the abort was restarted as a bare weak exit, or the line made no finding).
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass
from tests.rules.test_client_wordings import fed, replayed

RUN = ["epoch 0 step 10 loss 2.31", "epoch 0 step 20 loss 2.17"]
TERMINATE = "terminate called after throwing an instance of '{}'"


def abort_after(*report: str) -> str:
    return "\n".join([*RUN, *report, "Aborted (core dumped)"]) + "\n"


@pytest.mark.parametrize("report, rule", [
    ([TERMINATE.format("sycl::_V1::runtime_error"),
      "  what():  No device of requested type available. -1 (PI_ERROR_DEVICE_NOT_FOUND)"],
     "cpp.uncaught_exception_what"),
    (["[rank1]:" + TERMINATE.format("foo::ConfigError"), "[rank1]:  what():  unknown layer type 'gelu2'"],
     "cpp.uncaught_exception_what"),
    (["libc++abi: terminating due to uncaught exception of type std::invalid_argument: stoi: no conversion"],
     "cpp.uncaught_exception_what"),
    (["python: /src/ops/gather.cpp:212: void gather(int): Assertion `idx < n' failed."], "process.assert_failed"),
    (["RuntimeError: torch_xla/csrc/helpers.cpp:589 : Check failed: dim1 == dim2 || dim1 == 1 (4 vs. 7)"],
     "xla.check_failed_runtime_error"),
])
def test_an_abort_that_names_its_cause_fails_the_job(report, rule):
    decision = replayed(abort_after(*report))
    assert decision.action is Action.FAIL_JOB
    assert decision.root_cause is not None and decision.root_cause.rule_id == rule
    assert decision.root_cause.failure_class is FailureClass.USER_CODE


def test_a_bare_abort_keeps_its_restart():
    decision = replayed(abort_after())
    assert decision.action is Action.RESTART_JOB


@pytest.mark.parametrize("message", ["Connection reset by peer", "Broken pipe", "Resource temporarily unavailable"])
def test_a_system_error_what_makes_no_finding_and_the_abort_decides(message):
    found = fed([TERMINATE.format("std::system_error"), f"  what():  {message}"])
    assert not [f for f in found if f.rule_id == "cpp.uncaught_exception_what"]
    assert replayed(abort_after(TERMINATE.format("std::system_error"), f"  what():  {message}")).action \
        is Action.RESTART_JOB


def test_a_message_rule_outranks_the_what_catch_all():
    found = fed([TERMINATE.format("c10::DistBackendError"),
                 "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with "
                 "exception: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
                 "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds "
                 "before timing out."])
    assert "cpp.uncaught_exception_what" not in {f.rule_id for f in found}


@pytest.mark.parametrize("line, rule, grade", [
    ("RuntimeError: Native API failed. Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
     "sycl.ur_out_of_memory", (FailureClass.OOM, Action.FAIL_JOB)),
    ("  what():  Native API failed. Native API returns: 20 (UR_RESULT_ERROR_DEVICE_LOST)",
     "sycl.ur_device_lost", (FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)),
    ("level_zero backend failed with error: 20 (ZE_RESULT_ERROR_DEVICE_LOST)",
     "sycl.ur_device_lost", (FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)),
])
def test_a_unified_runtime_result_name_is_graded_by_its_meaning(line, rule, grade):
    found = [f for f in fed([line]) if f.failure_class is not FailureClass.INFO]
    assert [(f.rule_id, f.failure_class, f.action) for f in found] == [(rule, *grade)]


def test_a_what_that_a_catalog_grades_is_left_to_it():
    """``CUDA error: driver shutting down`` (cudaErrorCudartUnloading) is a shutdown status in the CUDA
    catalog, graded below the what() rule's priority: the catalog's grade stands, the abort is no
    program error (tests/pipeline/test_after_finish.py: W&B's failed exit then such an abort restarts)."""
    found = fed([TERMINATE.format("c10::CUDAError"), "  what():  CUDA error: driver shutting down"])
    assert not [f for f in found if f.rule_id == "cpp.uncaught_exception_what"]
    decision = replayed(abort_after(TERMINATE.format("c10::CUDAError"), "  what():  CUDA error: driver shutting down"))
    assert decision.action is Action.RESTART_JOB


def test_a_what_whose_message_a_catalog_rule_only_keys_on_stays_the_programs():
    """The CUDA catalog's rules take the runtime's message as their keyword and its printed forms
    as their condition: a ``what()`` holding the words in no form the catalog reads (KataGo's own
    ``CUDA Error, for <call>, ..., error unspecified launch failure``) is read by no catalog rule,
    so the what() rule grades it."""
    what = ("  what():  CUDA Error, for getOutput file cudabackend.cpp, func cudaMemcpy(a, b, n, "
            "cudaMemcpyDeviceToHost), line 3016, error unspecified launch failure")
    found = fed([TERMINATE.format("StringError"), what])
    assert [f.rule_id for f in found if f.failure_class is not FailureClass.INFO] == ["cpp.uncaught_exception_what"]
