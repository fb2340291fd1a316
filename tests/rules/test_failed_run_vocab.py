"""Failed runs that no rule saw (issue 12, set 3's ``none`` decisions): the vocabulary of the stacks,
launchers and platforms they ran on, each graded by its source (the packs name it), and a process's
own abort report, which makes a log that ends in an abort a failed process rather than a finished job.
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def findings(*lines: str, t: float = 1.0):
    return ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"),
                       "".join(f"{x}\n" for x in lines).encode(), t, final=True)


@pytest.mark.parametrize("line, rule, failure_class, action", [
    ("ERROR: LoadError: RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile permanent error. Ran out of "
     "memory in memory space hbm. Used 209.44G of 31.25G hbm. Exceeded hbm capacity by 178.19G.",
     "xla.tpu_hbm_oom", FailureClass.OOM, Action.FAIL_JOB),
    ("Compilation failure: Ran out of memory in memory space hbm. Used 8.83G of 8.00G hbm. Exceeded hbm capacity "
     "by 848.88M.", "xla.tpu_hbm_oom", FailureClass.OOM, Action.FAIL_JOB),
    ("F0315 06:43:57.288104   21577 async_dynamic_index_emitter.cc:584] Check failed: a % b == 0 (1 vs. 0)",
     "absl.check_failed", FailureClass.USER_CODE, Action.FAIL_JOB),
    # TensorFlow's own logging (tsl/platform/default/logging.cc) prints a failed CHECK as "<date> <time>: F ..."
    ("[2019-07-03 06:41:12.730615: F byteps/common/core_loops.cc:309] Check failed: r == ncclSuccess NCCL error: "
     "invalid usage", "absl.check_failed", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Could not override 'trainer.max_epoch'.", "hydra.override_error", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Could not append to config. An item is already at 'trainer.val_before_train'.", "hydra.override_error",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("ping failed on x4616c0s4b0n0: Application 6a0f3d12-8b47-4c5e-9e21-b7d0c4a58f31 not found",
     "pals.ping_application_not_found", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("ping failed on x4707c6s4b0n0: Couldn't forward RPC ping(5c1e70a2) to child x4707c7s2b0n0: Resource "
     "temporarily unavailable", "pals.rpc_forward_failed", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("PreemptionError: Nodes of this job got pre-empted. Check if the run has failed or restarted.",
     "azureml.preemption_error", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("UnexpectedStatusException: Error for Training job ft-1: Failed. Reason: InternalServerError: We encountered "
     "an internal error.  Please try again.", "sagemaker.internal_server_error", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    # Vertex AI retries the whole job itself (up to 3 times) before this line: the fault outlived them (D4)
    ("2026-09-21 09:35:22.630 UTC service Job will not be retried, max error retry attempts reached.",
     "vertex.job_retries_exhausted", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("(WorkerDict pid=1751030) CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62",
     "vllm.cumem_cuda_oom", FailureClass.OOM, Action.FAIL_JOB),
    ("2018-12-01 11:47:30,512\tERROR worker.py:1616 -- The node with client ID 9e31f0a6 has been marked dead "
     "because the monitor has missed too many heartbeats from it.", "ray.node_marked_dead",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
])
def test_the_line_is_graded_as_its_source_says(line, rule, failure_class, action):
    [f] = [f for f in findings(line) if f.rule_id == rule]
    assert (f.failure_class, f.action) == (failure_class, action)


@pytest.mark.parametrize("line", [
    "Ran out of memory in memory space vmem while allocating scratch; falling back",
    "E0315 06:43:57.288104   21577 emitter.cc:584] Check failed: retrying the lookup",
    "2019-07-03 06:41:12.730615: E byteps/common/core_loops.cc:309] Check failed: retrying the lookup",
    "Overriding 'trainer.val_before_train' from the command line",
    "UnexpectedStatusException: Error for Training job ft-1: Failed. Reason: ClientError: Data download failed",
    "(WorkerDict pid=1751030) CUDA Error: invalid argument at /workspace/csrc/cumem_allocator.cpp:62",
    '2020-04-03 09:00:41.2: W tensorflow/core/distributed_runtime/rpc/grpc_remote_master.cc:157] RPC failed with '
    'status = "Invalid argument: bad graph" and grpc_error_string = "{}"',
    "RuntimeError: TPU pod-v3-32b is HEALTHY",
])
def test_near_misses_are_not_those_rules(line):
    ids = {f.rule_id for f in findings(line)}
    assert not ids & {"xla.tpu_hbm_oom", "absl.check_failed", "hydra.override_error",
                      "sagemaker.internal_server_error", "vllm.cumem_cuda_oom", "tf.grpc_master_unavailable",
                      "torch_xla.tpu_not_healthy"}


@pytest.mark.parametrize("line", [
    "Aborted (core dumped)",
    "Fatal Python error: Aborted",
    "*** SIGABRT received by PID 21577 (TID 21577) on cpu 41 from PID 21577; stack trace: ***",
    "train.sh: line 12: 48213 Aborted                 (core dumped) python train.py",
])
def test_a_log_that_ends_in_an_abort_is_a_failed_process(line):
    fs = findings("step 1 loss 2.0", line)
    [f] = fs
    assert f.rule_id == "process.abort_report"
    assert f.kind == "exit_code" and f.fields.get("signal") == 6     # read as the exit it reports: 134
    assert analyse(fs).root_cause is f


def test_a_real_error_before_the_abort_explains_it():
    fs = findings("F0315 06:43:57.288104   21577 emitter.cc:584] Check failed: x == 0 (1 vs. 0)",
                  "*** Check failure stack trace: ***",
                  "*** SIGABRT received by PID 21577 (TID 21577) on cpu 41 from PID 21577; stack trace: ***",
                  "Fatal Python error: Aborted")
    rc = analyse(fs).root_cause
    assert rc.rule_id == "absl.check_failed"


@pytest.mark.parametrize("line", [
    "    faulthandler.enable()  # print 'Fatal Python error' on a crash",
    "Aborted 3 stale requests",
    "INFO request aborted by client",
])
def test_abort_as_a_word_is_no_abort_report(line):
    assert not [f for f in findings(line) if f.rule_id == "process.abort_report"]
