"""cuBLAS and cuDNN status codes (``cudalib_vocab.tsv``): graded from NVIDIA's descriptions, matched
where a caller raises them as errors, not where a library logs a status it recovers from."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def findings(text: str):
    return ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), f"{text}\n".encode(), 1.0, final=True)


@pytest.mark.parametrize("line, rule, cls, action", [
    ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "cudnn.alloc_failed", FailureClass.OOM, Action.FAIL_JOB),
    ("cuDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=ws-1 ; expr=finder(calgo, algoPerf)",
     "cudnn.alloc_failed", FailureClass.OOM, Action.FAIL_JOB),
    ("2026-02-14 10:21:07.5: E tensorflow/stream_executor/cuda/cuda_dnn.cc:329] Could not create cudnn handle: "
     "CUDNN_STATUS_INTERNAL_ERROR", "cudnn.internal_error", FailureClass.USER_CODE, Action.RESTART_IN_PLACE),
    ("tensorflow.python.framework.errors_impl.UnknownError: CUDNN_STATUS_EXECUTION_FAILED",
     "cudnn.execution_failed", FailureClass.USER_CODE, Action.RESTART_IN_PLACE),
    ("/torch/install/share/lua/5.1/cudnn/init.lua:58: Error in CuDNN: CUDNN_STATUS_BAD_PARAM",
     "cudnn.bad_param", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, "
     "&alpha, a, lda, b, ldb, &beta, c, ldc)`", "cublas.execution_failed", FailureClass.USER_CODE,
     Action.RESTART_IN_PLACE),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmStridedBatchedEx(handle)`",
     "cublas.not_supported", FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_a_raised_status_is_graded_as_the_catalog_says(line, rule, cls, action):
    [f] = findings(line)
    assert (f.rule_id, f.failure_class, f.action) == (rule, cls, action)


@pytest.mark.parametrize("line", [
    "W0914 10:21:07.5 conv_algorithm_picker.cc:828] cudnn status CUDNN_STATUS_NOT_SUPPORTED for algo 3, skipping",
    "cudnn_rnn: CUDNN_STATUS_EXECUTION_FAILED is retried with the persistent algorithm disabled",
])
def test_a_status_logged_in_passing_is_not_a_failure(line):
    assert not [f for f in findings(line) if f.rule_id.startswith(("cudnn.", "cublas."))]
