"""Root cause rule 13, second half: a traceback whose exception nothing grades (the catch-all,
``python.uncaught_exception``) yields to the real error its exception's message carries on the
lines after the record (``ftwatch.policy.lasterror.message_named_by_next``).

CPython prints an exception's whole ``str()`` after its class (Lib/traceback.py
``TracebackException.format_exception_only``); a wrapper's message of several lines (here the
Azure ML SDK's ``ActivityFailedException`` quoting the service's JSON error) goes on past the
record's end, which the multiline parser puts at the message's first line.
"""

from __future__ import annotations

import dataclasses

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.policy.lasterror import Errors, message_named_by_next
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
T0 = 1_795_253_763.0
TRACEBACK = ["Traceback (most recent call last):",
             '  File "pipelines/run_batchscore.py", line 141, in <module>',
             "    run.wait_for_completion(show_output=True)",
             "azureml.exceptions._azureml_exception.ActivityFailedException: ActivityFailedException:",
             "\tMessage: Activity Failed:"]
JSON_ERROR = ["{", '    "error": {', '        "code": "UserError",',
              '        "message": "AzureMLCompute job failed.\\nPreemptionError: Nodes of this job got pre-empted.'
              ' Check if the run has failed or restarted.\\n\\tReason: Received pre-emption warning signal"',
              "    }", "}"]


def feed(chunks: list[tuple[float, list[str]]]) -> list:
    engine = Engine(BUILTIN)
    origin = Origin("combined", None, "job-m", "node-a", "stderr", "process")
    out = []
    for i, (dt, lines) in enumerate(chunks):
        out += engine.feed(origin, "".join(f"{x}\n" for x in lines).encode(), T0 + dt,
                           final=i == len(chunks) - 1)
    return out


def test_the_catch_all_yields_to_the_error_its_message_goes_on_to_name():
    fs = feed([(0.0, TRACEBACK + JSON_ERROR)])
    assert [f.rule_id for f in fs] == ["python.uncaught_exception", "azureml.preemption_error"]
    rc = analyse(fs).root_cause
    assert (rc.rule_id, rc.failure_class, rc.action) == ("azureml.preemption_error", FailureClass.RETRYABLE_INFRA,
                                                         Action.RESTART_JOB)
    assert message_named_by_next(fs[0], fs, fs)


def test_the_errors_are_asked_by_identity_whether_a_list_or_an_errors_set():
    """Root cause hands the candidates over as :class:`Errors` (O(1) an ask): the same answers as
    the list, and a finding equal to an error but not one of them is not among them."""
    fs = feed([(0.0, TRACEBACK + JSON_ERROR)])
    assert message_named_by_next(fs[0], fs, Errors(fs)) and message_named_by_next(fs[0], fs, fs)
    twin = dataclasses.replace(fs[1])                 # equal to the error, another object
    assert twin == fs[1] and twin is not fs[1]
    assert fs[1] in Errors(fs) and twin not in Errors(fs)
    assert not message_named_by_next(fs[0], [fs[0], twin], Errors(fs))
    assert not message_named_by_next(fs[0], [fs[0], twin], fs)
    assert not message_named_by_next(fs[0], fs, Errors(fs[:1]))


def test_a_message_no_rule_knows_leaves_the_catch_all():
    quiet = [x.replace("PreemptionError: Nodes of this job got pre-empted.", "JobFailed: see the portal.")
             .replace("Reason: Received pre-emption warning signal", "Reason: none") for x in JSON_ERROR]
    fs = feed([(0.0, TRACEBACK + quiet)])
    assert [f.rule_id for f in fs] == ["python.uncaught_exception"]
    assert analyse(fs).root_cause.rule_id == "python.uncaught_exception"


def test_an_error_printed_later_is_its_own_and_the_traceback_stays_first():
    fs = feed([(0.0, TRACEBACK), (5.0, JSON_ERROR)])
    assert [f.rule_id for f in fs] == ["python.uncaught_exception", "azureml.preemption_error"]
    assert not message_named_by_next(fs[0], fs, fs)
    assert analyse(fs).root_cause.rule_id == "python.uncaught_exception"


def test_a_graded_exception_keeps_its_own_reading():
    graded = TRACEBACK[:3] + ["ValueError: bad shape"]
    fs = feed([(0.0, graded + JSON_ERROR)])
    assert fs[0].rule_id != "python.uncaught_exception"
    assert not message_named_by_next(fs[0], fs, fs)
    assert analyse(fs).root_cause is fs[0]


# torch_npu raises a failed ACL call as a RuntimeError and writes the error CANN recorded as the
# rest of the same message (``RuntimeError`` decides by its message, python_exceptions.tsv).
NPU_TRACEBACK = ["Traceback (most recent call last):",
                 '  File "deepspeed/runtime/zero/stage3.py", line 1296, in __partition_grads',
                 "    cuda_grad_buffer = grad_buffer.to(grad_partition.device, non_blocking=True)",
                 "RuntimeError: ACL stream synchronize failed.",
                 "EL0004: Failed to allocate memory.",
                 "        Possible Cause: Available memory is insufficient."]


def test_a_generic_class_fallback_yields_to_the_cann_error_its_message_carries():
    fs = feed([(0.0, NPU_TRACEBACK)])
    assert [f.rule_id for f in fs][:2] == ["python.exception.RuntimeError", "cann.el0004_driver_memory_alloc_failed"]
    assert message_named_by_next(fs[0], fs, fs)
    rc = analyse(fs).root_cause
    assert (rc.rule_id, rc.failure_class, rc.action) == ("cann.el0004_driver_memory_alloc_failed", FailureClass.OOM,
                                                         Action.FAIL_JOB)


def test_a_class_that_decides_by_itself_keeps_its_grade_before_a_cann_line():
    fs = feed([(0.0, NPU_TRACEBACK[:3] + ["ValueError: ACL stream synchronize failed."] + NPU_TRACEBACK[4:])])
    assert fs[0].failure_class is FailureClass.USER_CODE and "RuntimeError" not in fs[0].rule_id
    assert not message_named_by_next(fs[0], fs, fs)
    assert analyse(fs).root_cause is fs[0]


SAVE = ["Traceback (most recent call last):",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/serialization.py", line 668, in _save',
        "    zip_file.write_record(name, storage.data_ptr(), num_bytes)",
        "RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter failed writing file data/112: "
        "file write failed",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/serialization.py", line 291, in __exit__',
        "    self.file_like.write_end_of_file()"]


def test_torch_saves_generic_write_failure_yields_to_the_errno_its_chained_oserror_names():
    fs = feed([(0.0, SAVE + ["OSError: [Errno 28] No space left on device"])])
    assert [f.rule_id for f in fs] == ["torch_npu.save_write_failed", "storage.no_space_left"]
    assert message_named_by_next(fs[0], fs, fs)
    rc = analyse(fs).root_cause
    assert (rc.rule_id, rc.action) == ("storage.no_space_left", Action.FAIL_JOB)


def test_a_write_failure_with_no_errno_after_it_keeps_its_own_grade():
    fs = feed([(0.0, SAVE + ["RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 1718592000 vs "
                             "1718591888"])])
    assert fs[0].rule_id == "torch_npu.save_write_failed"
    assert not message_named_by_next(fs[0], fs, fs)
    assert analyse(fs).root_cause.rule_id == "torch_npu.save_write_failed"


def test_the_writers_unexpected_pos_between_the_write_failure_and_its_errno_is_passed_over():
    """Finishing the archive after a short write trips PytorchStreamWriter's position check
    (inline_container.cc ostream_write_func, "unexpected pos"): fallout of the same write, so the
    errno printed after it still names the reason."""
    fs = feed([(0.0, SAVE + ["RuntimeError: [enforce fail at inline_container.cc:325] . unexpected pos 7431284928 vs "
                             "7431284816",
                             "OSError: [Errno 28] No space left on device"])])
    assert fs[0].rule_id == "torch_npu.save_write_failed"
    assert message_named_by_next(fs[0], fs, fs)
    rc = analyse(fs).root_cause
    assert (rc.rule_id, rc.action) == ("storage.no_space_left", Action.FAIL_JOB)
