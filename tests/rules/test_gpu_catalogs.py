"""GPU catalogs are complete against their sources (issue 12 item 2, round 5).

The CUDA runtime enum (``cuda_errors.tsv``) holds every ``cudaError_t`` value of CUDA 13.0's
``driver_types.h`` (texts as ``cudaGetErrorString`` of libcudart 13.0 returns them), each with
the Driver API's ``CUresult`` name of the same number where one exists; the CUDA math libraries
(cuDNN 9's hierarchical sub-codes, cuFFT, cuSOLVER, cuSPARSE, cuRAND) are graded as cuBLAS is;
NCCL's numbered result texts (torch's ``NCCL Error N:``, XLA's ``NCCL operation ... failed:``)
and pynvml's GPU-state exceptions are findings.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("catalogs", REPO / "tools" / "catalogs.py")
catalogs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(catalogs)
CUDA_ROWS = catalogs.read_tsv(REPO / "ftwatch" / "rules" / "packs" / "cuda_errors.tsv", catalogs.CUDA_COLUMNS)
BUILTIN = load_rules()
W1 = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")

# cudaError_t in CUDA 13.0 driver_types.h (every enumerator but cudaSuccess).
CUDA_13_0 = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31,
             32, 34, 35, 36, 37, 43, 44, 45, 46, 49, 52, 53, 65, 66, 67, 68, 69, 98, 100, 101, 102, 103,
             127, 200, 201, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219,
             220, 221, 222, 223, 224, 225, 226, 300, 301, 302, 303, 304, 400, 401, 402, 500, 600, 700,
             701, 702, 703, 704, 705, 708, 709, 710, 711, 712, 713, 714, 715, 716, 717, 718, 719, 720,
             721, 800, 801, 802, 803, 804, 805, 806, 807, 808, 809, 810, 811, 812, 900, 901, 902, 903,
             904, 905, 906, 907, 908, 909, 910, 911, 912, 913, 914, 915, 999, 10000]
READ_BY_ANOTHER_ROW = {300: "cudaErrorInvalidKernelImage",   # cudaErrorInvalidSource prints 200's text
                       10000: None}                           # cudaErrorApiFailureBase: a base, no error


def _assert_graded(finding, rule_id: str, failure_class: FailureClass, action: Action) -> None:
    assert (finding.rule_id, finding.failure_class, finding.action) == (rule_id, failure_class, action)


def _finding(line: str):
    [finding] = Engine(BUILTIN).feed(W1, f"{line}\n".encode(), 1_795_253_763.0, final=True)
    return finding


def test_the_cuda_catalog_holds_every_runtime_error_of_cuda_13():
    numbers = {int(row["number"]) for row in CUDA_ROWS}
    missing = [n for n in CUDA_13_0 if n not in numbers and n not in READ_BY_ANOTHER_ROW]
    assert missing == []
    [row200] = [r for r in CUDA_ROWS if r["number"] == "200"]
    assert "cudaErrorInvalidSource (300" in row200["meaning"]


def test_a_message_that_extends_another_gets_the_same_verdict():
    """A rule's message pattern also hits every longer message that starts with it
    ('operation not supported' in 'operation not supported on global/shared address space'), so
    the two rows must agree on class and action or the line's verdict depends on rule order."""
    for short in CUDA_ROWS:
        for long in CUDA_ROWS:
            if long is not short and long["message"].startswith(short["message"]):
                assert catalogs.GRADES[short["grade"]][:2] == catalogs.GRADES[long["grade"]][:2], \
                    (short["enum"], long["enum"])


@pytest.mark.parametrize("enum, grade", [
    ("cudaErrorTensorMemoryLeak", "sticky_program"),     # the kernel left tensor memory allocated
    ("cudaErrorMpsClientTerminated", "sticky_ambiguous"),
    ("cudaErrorExternalDevice", "sticky_ambiguous"),
    ("cudaErrorPriorLaunchFailure", "sticky_ambiguous"),  # as cudaErrorLaunchFailure
    ("cudaErrorCallRequiresNewerDriver", "setup"),
    ("cudaErrorJitCompilerNotFound", "setup"),
    ("cudaErrorDeviceNotLicensed", "device"),
    ("cudaErrorTimeout", "hang"),
    ("cudaErrorMpsMaxClientsReached", "transient"),
    ("cudaErrorProfilerDisabled", "status"),
    ("cudaErrorStreamCaptureUnjoined", "usage"),
])
def test_the_new_runtime_rows_follow_the_documentation(enum, grade):
    [row] = [r for r in CUDA_ROWS if r["enum"] == enum]
    assert row["grade"] == grade


@pytest.mark.parametrize("line, rule_id, failure_class, action", [
    ("RuntimeError: CUDA error: the MPS client has been terminated by the server", "cuda.rt.mps_client_terminated",
     FailureClass.USER_CODE, Action.RESTART_IN_PLACE),
    ("cupy_backends.cuda.api.driver.CUDADriverError: CUDA_ERROR_TENSOR_MEMORY_LEAK: tensor memory not completely freed",
     "cuda.rt.tensor_memory_leak", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("RuntimeError: CUDA error: API call is not supported in the installed CUDA driver",
     "cuda.rt.call_requires_newer_driver", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("RuntimeError: CUDA error: wait operation timed out", "cuda.rt.timeout", FailureClass.HANG, Action.RESTART_JOB),
    ("jax.errors.JaxRuntimeError: INTERNAL: CUDA error: : CUDA_ERROR_NOT_FOUND: named symbol not found",
     "cuda.rt.symbol_not_found", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER", "cudnn.execution_failed_detail",
     FailureClass.USER_CODE, Action.RESTART_IN_PLACE),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", "cudnn.internal_alloc_failed",
     FailureClass.OOM, Action.FAIL_JOB),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH", "cudnn.not_supported_detail",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_BAD_PARAM", "cudnn.bad_param", FailureClass.USER_CODE, Action.FAIL_JOB),
    # pytorch#88038: a cuFFT build older than the GPU (no forward compatibility): setup, a retry repeats it
    ("RuntimeError: cuFFT error: CUFFT_INTERNAL_ERROR", "cufft.internal_error", FailureClass.USER_CODE,
     Action.FAIL_JOB),
    ("RuntimeError: cuFFT error: CUFFT_EXEC_FAILED", "cufft.exec_failed", FailureClass.USER_CODE,
     Action.RESTART_IN_PLACE),
    ("RuntimeError: cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
     "cusolver.alloc_failed", FailureClass.OOM, Action.FAIL_JOB),
    ("RuntimeError: CUDA error: CUSPARSE_STATUS_INSUFFICIENT_RESOURCES when calling `cusparseSpGEMM_compute`",
     "cusparse.invalid_request", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("RuntimeError: curand error: CURAND_STATUS_PREEXISTING_FAILURE", "curand.launch_failed",
     FailureClass.USER_CODE, Action.RESTART_IN_PLACE),
    ("RuntimeError: NCCL Error 4: invalid argument", "nccl.code_text.invalid_argument", FailureClass.USER_CODE,
     Action.FAIL_JOB),
    ("RuntimeError: NCCL Error 5: invalid usage", "nccl.code_text.invalid_usage", FailureClass.USER_CODE,
     Action.FAIL_JOB),
    ("pynvml.NVMLError_ResetRequired: GPU requires restart", "nvml.py_gpu_lost", FailureClass.HARDWARE_NODE,
     Action.ISOLATE_NODE),
])
def test_gpu_library_lines_are_graded(line, rule_id, failure_class, action):
    _assert_graded(_finding(line), rule_id, failure_class, action)


@pytest.mark.parametrize("line", [
    "RuntimeError: cuDNN error: CUDNN_STATUS_SUCCESS",
    "cufft plan cache size: 4096 (CUFFT_INTERNAL_ERROR is raised when the cache is full)",   # no caller's 'error: '
    "RuntimeError: NCCL Error 0: no error",
    "    except pynvml.NVMLError_GpuIsLost:",
    "[rank0]: RuntimeError: wait operation timed out",
])
def test_near_misses_make_no_gpu_library_finding(line):
    findings = Engine(BUILTIN).feed(W1, f"{line}\n".encode(), 1_795_253_763.0, final=True)
    families = ("cudnn", "cufft", "cusolver", "cusparse", "curand", "nccl", "nvml", "cuda")
    assert not any(f.rule_id.split(".")[0] in families for f in findings)


def _final(final: str):
    text = f'Traceback (most recent call last):\n  File "train.py", line 10, in <module>\n    model(x)\n{final}\n'
    [finding] = Engine(BUILTIN).feed(W1, text.encode(), 1_795_253_763.0, final=True)
    return finding


@pytest.mark.parametrize("final, rule_id, failure_class, action", [
    # Triton and torch.compile name their own failures: the program's kernel or graph
    ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 232448, Hardware limit: "
     "232448. Reducing block sizes or `num_stages` may help.",
     "python.exception.triton.runtime.errors.OutOfResources", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("triton.compiler.errors.CompilationError: at 10:4:", "python.exception.triton.compiler.errors.CompilationError",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
     "python.exception.torch._dynamo.exc.BackendCompilerFailed", FailureClass.USER_CODE, Action.FAIL_JOB),
    # ... but a wrapper's message decides: what the backend raised is graded by its own catalog
    ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised: RuntimeError: CUDA error: unknown error",
     "cuda.rt.unknown", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("torch._inductor.exc.InductorError: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
     "cuda.out_of_memory", FailureClass.OOM, Action.FAIL_JOB),
])
def test_compile_errors_are_the_programs_unless_their_message_says_otherwise(final, rule_id, failure_class, action):
    _assert_graded(_final(final), rule_id, failure_class, action)


@pytest.mark.parametrize("line, rule_id, failure_class, action", [
    # NCCL 2.19+ (net_ib/common.cc): one rule reads every version's wording of an IB async event
    ("gpu-node-3:2111:2203 [1] transport/net_ib/common.cc:123 NCCL WARN NET/IB : mlx5_2:1 async fatal event: "
     "local catastrophic error", "rdma.ib_async_fatal_event", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("gpu-node-3:2111:2203 [1] transport/net_ib/common.cc:140 NCCL WARN NET/IB : mlx5_2:1 async fatal event on QP "
     "(0x55d0c2a0) qpn=1234 handle=3 send_cq=1 recv_cq=2 state=6 sq_psn=11 rq_psn=12: "
     "local work queue catastrophic error",
     "nccl.ib_async_queue_error", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("gpu-node-3:2111:2203 [1] transport/net_ib/common.cc:127 NCCL WARN NET/IB : mlx5_2:1 async fatal event on CQ "
     "(0x55d0c2a0) handle=3 cqe=4095: CQ error", "nccl.ib_async_queue_error", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    ("gpu-node-3:2111:2203 [1] transport/net_ib/common.cc:179 NCCL WARN NET/IB : mlx5_2:1 Got non-fatal async event: "
     "port error(10)", "nccl.ib_async_port_error", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("gpu-node-3:2111:2203 [1] transport/net_ib.cc:132 NCCL WARN NET/IB : Got async event : port error",
     "nccl.ib_async_port_error", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("gpu-node-3:2111:2190 [1] transport/nvls.cc:376 NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory "
     "of size 1073741824 : CUDA error 999 'unknown error'.", "gpu.nvls_multicast_bind_failed",
     FailureClass.HARDWARE_NODE,
     Action.ISOLATE_NODE),
])
def test_nccl_ib_and_nvls_warnings_are_graded_in_every_wording(line, rule_id, failure_class, action):
    _assert_graded(_finding(line), rule_id, failure_class, action)


def test_a_non_fatal_ib_status_event_is_info():
    line = ("gpu-node-3:2111:2203 [1] transport/net_ib/common.cc:179 NCCL WARN NET/IB : mlx5_2:1 Got non-fatal async "
            "event: port active(9)")
    findings = Engine(BUILTIN).feed(W1, f"{line}\n".encode(), 1_795_253_763.0, final=True)
    assert all(f.failure_class is FailureClass.INFO for f in findings)


@pytest.mark.parametrize("line, rule_id, failure_class, action", [
    # NCCL's maintainers: a CUDA failure in the NVLS transport is the node's Fabric Manager / GPU reset state
    ("node2:242431:242479 [5] transport/nvls.cc:158 NCCL WARN Cuda failure 1 'invalid argument'",
     "gpu.nvls_cuda_failure", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("node2:242431:242479 [5] transport/nvls.cc:165 NCCL WARN Cuda failure 'invalid argument'",
     "gpu.nvls_cuda_failure", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    # ... an out-of-memory there stays the CUDA enum's, and the same failure elsewhere stays usage
    ("node2:242431:242479 [5] transport/nvls.cc:165 NCCL WARN Cuda failure 2 'out of memory'",
     "cuda.rt.memory_allocation", FailureClass.OOM, Action.FAIL_JOB),
    ("node2:242431:242479 [5] enqueue.cc:1556 NCCL WARN Cuda failure 1 'invalid argument'",
     "cuda.rt.invalid_value", FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_a_cuda_failure_in_nccls_nvls_transport_is_the_nodes(line, rule_id, failure_class, action):
    _assert_graded(_finding(line), rule_id, failure_class, action)


@pytest.mark.parametrize("line, rule_id", [
    ("slurmstepd: error: NVML: Failed to get usage(15): GPU is lost", "nvml.tool_gpu_lost"),
    ("[Tue Nov 24 08:12:33 2026] NVRM: API mismatch: the client has the version 535.104.05, but this kernel module "
     "has the version 535.54.03.  Please make sure that this kernel module and all NVIDIA driver components have "
     "the same version.", "nvrm.api_mismatch"),
])
def test_node_driver_states_isolate_the_node(line, rule_id):
    _assert_graded(_finding(line), rule_id, FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)


def test_an_nvml_status_that_names_no_device_state_is_no_finding():
    line = "slurmstepd: error: NVML: Failed to get usage(3): Not Supported"
    assert Engine(BUILTIN).feed(W1, f"{line}\n".encode(), 1_795_253_763.0, final=True) == []
