"""The stacks beyond torch+NCCL (``stacks_vocab.tsv`` and the JAX/TF/Ray/vLLM rows of
``python_exceptions.tsv``): XLA's status codes graded by gRPC's definition of each code, a code's
grade the same whichever stack prints it, the specific text an INTERNAL/UNKNOWN status wraps
deciding over the code, and the fallout reports of JAX's coordination service and vLLM's engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.exceptions import ExceptionCatalog
from ftwatch.rules.loader import load_rules

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("catalogs", REPO / "tools" / "catalogs.py")
catalogs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(catalogs)

ENGINE = Engine(load_rules())
ROWS = catalogs.read_tsv(REPO / "ftwatch" / "rules" / "packs" / "stacks_vocab.tsv", catalogs.VOCAB_COLUMNS)
GRPC_CODES = ["CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
              "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
              "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]
TF = "tensorflow.python.framework.errors_impl."
TF_CLASS = {"CANCELLED": "CancelledError", "UNKNOWN": "UnknownError", "INVALID_ARGUMENT": "InvalidArgumentError",
            "DEADLINE_EXCEEDED": "DeadlineExceededError", "NOT_FOUND": "NotFoundError",
            "ALREADY_EXISTS": "AlreadyExistsError", "PERMISSION_DENIED": "PermissionDeniedError",
            "RESOURCE_EXHAUSTED": "ResourceExhaustedError", "FAILED_PRECONDITION": "FailedPreconditionError",
            "ABORTED": "AbortedError", "OUT_OF_RANGE": "OutOfRangeError", "UNIMPLEMENTED": "UnimplementedError",
            "INTERNAL": "InternalError", "UNAVAILABLE": "UnavailableError", "DATA_LOSS": "DataLossError",
            "UNAUTHENTICATED": "UnauthenticatedError"}


def findings(*lines: str):
    text = "".join(f"{line}\n" for line in lines)
    return ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), text.encode(), 1.0, final=True)


def traceback(last: str) -> list[str]:
    return ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', "    step(state)", last]


def test_every_grpc_status_code_has_one_xla_rule():
    ids = {row["id"] for row in ROWS}
    assert {f"xla.status.{code.lower()}" for code in GRPC_CODES} <= ids


@pytest.mark.parametrize("code", GRPC_CODES)
def test_a_status_code_is_graded_alike_by_xla_and_tensorflow(code):
    """One code, one meaning: TensorFlow's OpError subclass for a code carries the XLA rule's grade
    (where the subclass decides by itself; a message-deciding one keeps the same action family)."""
    row = next(r for r in ROWS if r["id"] == f"xla.status.{code.lower()}")
    grade = ExceptionCatalog.load().lookup(TF + TF_CLASS[code])
    assert grade is not None, code
    if grade.decides_by_class:
        assert (grade.failure_class, grade.action) == (FailureClass(row["class"]), Action[row["action"].upper()])
    else:
        assert row["priority"] in {"5", "25"}, "a message-deciding class pairs with an ambiguous or oom code"


@pytest.mark.parametrize("printed", [
    "jaxlib.xla_extension.XlaRuntimeError: {code}: details",
    "jax.errors.JaxRuntimeError: {code}: details",
    "jaxlib._jax.XlaRuntimeError: {code}: details",
    "E0101 00:00:00.000000 1 pjrt_stream_executor_client.cc:2985] Execution of replica 0 failed: {code}: details",
    # a StatusOr read without handling its error: absl/status/statusor.cc Helper::Crash, a FATAL log line
    "2022-09-20 11:05:32.229988: F external/org_tensorflow/tensorflow/core/platform/statusor.cc:33] "
    "Attempting to fetch value instead of handling error {code}: details",
])
@pytest.mark.parametrize("code", GRPC_CODES)
def test_each_way_xla_prints_a_status_hits_its_code_rule(printed, code):
    assert f"xla.status.{code.lower()}" in {f.rule_id for f in findings(printed.format(code=code))}


@pytest.mark.parametrize("line", [
    "I0101 00:00:00.000000 1 service.cc:145] XLA service initialized for platform CUDA (this does not mean UNAVAILABLE)",
    "W0101 00:00:00 1 hlo_rematerialization.cc:3005] Can't reduce memory use below RESOURCE_EXHAUSTED budget",
    "status: INTERNAL",
])
def test_a_code_name_outside_a_raised_status_is_no_finding(line):
    assert not [f for f in findings(line) if f.rule_id.startswith("xla.status.")]


def test_the_cuda_text_an_internal_status_wraps_decides_over_the_code():
    [f] = findings("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: CUDA error: an illegal memory access "
                   "was encountered: CUDA_ERROR_ILLEGAL_ADDRESS")
    assert f.rule_id != "xla.status.internal"


@pytest.mark.parametrize("last, cls, action", [
    ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8.00GiB.",
     FailureClass.OOM, Action.FAIL_JOB),
    ("jaxlib.xla_extension.XlaRuntimeError: UNAVAILABLE: failed to connect to all addresses",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("jax.errors.JaxRuntimeError: INVALID_ARGUMENT: Argument does not match host shape",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    (TF + "UnavailableError: Socket closed", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (TF + "AbortedError: Session 8ac0 is not found.", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (TF + "DataLossError: truncated record at 1048576", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("ray.exceptions.NodeDiedError: Task failed because the node it ran on is dead or unreachable.",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("ray.exceptions.RaySystemError: System error: the raylet exited", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    ("lightning.fabric.utilities.exceptions.MisconfigurationException: No `training_step()` method defined.",
     FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_a_traceback_ended_by_a_stack_exception_is_graded_by_its_source(last, cls, action):
    [decided] = findings(*traceback(last))
    assert (decided.failure_class, decided.action) == (cls, action)


@pytest.mark.parametrize("last", [
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
    TF + "CancelledError: Step was cancelled by an explicit call to `Session::Close()`.",
])
def test_an_exception_that_reports_a_death_elsewhere_is_fallout(last):
    assert {f.failure_class for f in findings(*traceback(last))} == {FailureClass.FALLOUT}


@pytest.mark.parametrize("line, rule", [
    ("F0926 17:26:32.075587 157988 client.h:77] Terminating process because the JAX distributed service detected "
     "fatal errors. This most likely indicates that another task died; see the other task logs for more details.",
     "jax.distributed_fatal_errors"),
    ("E0926 17:26:32.075402 157988 coordination_service_agent.cc:332] Polled an error from coordination service "
     "(this can be an error from this or another task).", "jax.distributed_fatal_errors"),
    ("absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):",
     "jax.coordination_heartbeat_timeout"),
    ("(EngineCore_DP0 pid=265) ERROR 02-27 10:31:24 [multiproc_executor.py:231] Worker proc VllmWorker-0 died "
     "unexpectedly, shutting down executor.", "vllm.engine_core_failed"),
    ("ERROR ... [ray_executor_v2.py:464] RayWorkerProc rank=[3] died unexpectedly, shutting down executor.",
     "vllm.engine_core_failed"),
    ("(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
     "vllm.engine_core_failed"),
    ("[2026-02-27 15:27:13] Received sigquit from a child process. It usually means the child failed.",
     "sglang.child_failed"),
])
def test_a_report_that_another_process_failed_is_fallout(line, rule):
    hits = [f for f in findings(line) if f.rule_id == rule]
    assert hits and all(f.failure_class is FailureClass.FALLOUT for f in hits)


def test_an_actor_lost_with_its_node_is_retryable_and_a_memory_kill_is_oom():
    [node] = [f for f in findings("\tthe actor's node was terminated unexpectedly: health check failed due to "
                                  "missing too many heartbeats") if f.rule_id == "ray.actor_node_died"]
    assert (node.failure_class, node.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
    [oom] = [f for f in findings("ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running "
                                 "low on memory. Memory on the node (IP: 10.0.0.2) was 957.55GB / 1006.84GB "
                                 "(0.951040), which exceeds the memory usage threshold of 0.950000; Object store")
             if f.failure_class is FailureClass.OOM]
    assert oom.action is Action.FAIL_JOB


@pytest.mark.parametrize("line", [
    "2022-02-15 16:53:52,096\tWARNING worker.py:1462 -- The node with node id: 8f205b12 and ip: 10.128.0.103 has been "
    "marked dead because the detector has missed too many heartbeats from it. This can happen when a raylet crashes "
    "unexpectedly or has lagging heartbeats.",
    "ray.exceptions.NodeDiedError: Task failed because the node it was running on is dead or unavailable. Node IP: "
    "127.0.0.1, node ID: e55b8ca0.",
])
def test_a_node_the_ray_cluster_lost_is_retryable(line):
    assert {(f.failure_class, f.action) for f in findings(line)} == {(FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)}


@pytest.mark.parametrize("line", [
    "(BackendExecutor pid=5126, ip=10.128.0.32) 2022-02-15 16:53:52,097\tERROR utils.py:42 -- The actor died "
    "unexpectedly before finishing this task.",
    "(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the "
    "problem, check the logs for the dead worker.",
])
def test_a_logged_ray_actor_or_worker_death_is_fallout(line):
    assert {f.failure_class for f in findings(line)} == {FailureClass.FALLOUT}


OLD_PHRASE = {"CANCELLED": "Cancelled", "UNKNOWN": "Unknown", "INVALID_ARGUMENT": "Invalid argument",
              "DEADLINE_EXCEEDED": "Deadline exceeded", "NOT_FOUND": "Not found", "ALREADY_EXISTS": "Already exists",
              "PERMISSION_DENIED": "Permission denied", "RESOURCE_EXHAUSTED": "Resource exhausted",
              "FAILED_PRECONDITION": "Failed precondition", "ABORTED": "Aborted", "OUT_OF_RANGE": "Out of range",
              "UNIMPLEMENTED": "Unimplemented", "INTERNAL": "Internal", "UNAVAILABLE": "Unavailable",
              "DATA_LOSS": "Data loss", "UNAUTHENTICATED": "Unauthenticated"}


@pytest.mark.parametrize("printed", [
    "jaxlib.xla_extension.XlaRuntimeError: {name}: details",
    "RuntimeError: {name}: details",
    "E0612 21:44:07.301772 local_client.cc:672] Execution of replica 0 failed: {name}: details",
    "2021-03-05 11:02:45.702311: F tensorflow/stream_executor/lib/statusor.cc:34] "
    "Attempting to fetch value instead of handling error {name}: details",
])
@pytest.mark.parametrize("code", GRPC_CODES)
def test_the_pre_absl_phrase_of_a_code_hits_the_same_rule(printed, code):
    """Before absl::Status, XLA (and TensorFlow) printed a code as a phrase ('Resource exhausted: ');
    old jaxlib raised it as a plain RuntimeError. Same code, same rule."""
    assert f"xla.status.{code.lower()}" in {f.rule_id for f in findings(printed.format(name=OLD_PHRASE[code]))}


@pytest.mark.parametrize("line", [
    "RuntimeError: Internal error: the phrase is not followed by a colon",
    "RuntimeError: not found in the registry: Unavailable: lower-case lead",
])
def test_a_runtime_error_that_only_resembles_a_phrase_is_no_status(line):
    assert not [f for f in findings(line) if f.rule_id.startswith("xla.status.")]


@pytest.mark.parametrize("line", [
    "CRITICAL 02-25 11:11:34 launcher.py:101] MQLLMEngine is already dead, terminating server process",
    "ERROR 01-22 00:13:32 client.py:282] RuntimeError('Engine process (pid 77) died.')",
    "RuntimeError: Engine process failed to start. See stack trace for the root cause.",
    "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.",
])
def test_the_v0_engines_death_reports_are_fallout(line):
    assert {f.failure_class for f in findings(line)} == {FailureClass.FALLOUT}


def test_a_cause_quoted_in_a_fallout_report_outranks_the_report():
    """The fallout reports are wrappers (priority 0): vLLM quotes the worker's own error in
    'Worker failed with error ...', and that error decides."""
    [f] = findings("RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered', "
                   "please check the stack trace above for the root cause")
    assert f.failure_class is not FailureClass.FALLOUT and f.rule_id != "vllm.engine_core_failed"


def test_a_lost_ray_gcs_is_fallout_of_its_death():
    [f] = findings("[2025-12-19 15:55:39,521 E 3044 30260] rpc_client.h:203: Failed to connect to GCS within 60 "
                   "seconds. GCS may have been killed. It's either GCS is terminated by `ray stop` or is killed "
                   "unexpectedly.")
    assert (f.rule_id, f.failure_class) == ("ray.gcs_unreachable", FailureClass.FALLOUT)


@pytest.mark.parametrize("code, cls, action", [
    ("UNIMPLEMENTED", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("UNAVAILABLE", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("RESOURCE_EXHAUSTED", FailureClass.OOM, Action.FAIL_JOB),
])
def test_a_statusor_crash_is_graded_by_its_code_not_as_a_bare_abort(code, cls, action):
    """The glog FATAL line of a StatusOr crash is also a weak abort report
    (``process.glog_fatal_report``, priority -1); the status code it names decides."""
    [f] = findings("2022-09-20 11:05:32.229988: F external/org_tensorflow/tensorflow/core/platform/statusor.cc:33] "
                   f"Attempting to fetch value instead of handling error {code}: Unimplemented MHLO -> HloOpcode")
    assert (f.rule_id, f.failure_class, f.action) == (f"xla.status.{code.lower()}", cls, action)
