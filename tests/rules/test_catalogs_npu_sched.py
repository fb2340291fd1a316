"""Issue 12 item 2 (NPU, schedulers, Python): the catalogs grade by their sources.

Table-driven: each row is (a line or traceback as the software prints it, the rule or catalog
entry that must decide it, its class and action). The sources are in the packs
(``npu_codes.yaml``, ``scheduler.yaml``, ``python_exceptions.tsv``); these tests keep the grading
and the matching honest.
"""

from __future__ import annotations

import builtins

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.exceptions import ExceptionCatalog, exception_line
from ftwatch.rules.loader import load_rules

ENGINE_RULES = load_rules()


def _decide(text: str):
    """The findings one engine makes of ``text`` (a whole log), fed at once."""
    engine = Engine(ENGINE_RULES)
    return engine.feed(Origin("worker-0"), (text.rstrip("\n") + "\n").encode(), 1000.0, final=True)


def _one(text: str):
    findings = _decide(text)
    assert len(findings) == 1, [(f.rule_id, f.line) for f in findings]
    return findings[0]


def _assert_decides(text: str, rule_id: str, failure_class: FailureClass, action: Action) -> None:
    f = _one(text)
    assert (f.rule_id, f.failure_class, f.action) == (rule_id, failure_class, action)


# --- HCCL: torch_npu's "HCCL function error: ..., error code is N" (HcclResult) -----------------

HCCL_TRACEBACK = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/home/user/verl/verl/workers/fsdp_workers.py", line 118, in __init__
[rank2]:     torch.distributed.barrier()
[rank2]:   File "/usr/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 4159, in barrier
[rank2]:     work = group.barrier(opts=opts)
[rank2]: RuntimeError: create_config:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:102 HCCL function error: hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is {code}
"""


def test_hccl_error_code_7_traceback_matches_a_rule_not_the_catch_all():
    # The case: it used to fall to python.uncaught_exception (user_code, fail_job).
    f = _one(HCCL_TRACEBACK.format(code=7))
    assert f.rule_id == "hccl.result_7_unavail"
    assert (f.failure_class, f.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
    assert f.origin.rank == 2


@pytest.mark.parametrize("code, rule_id, failure_class, action", [
    (1, "hccl.result_1_para", FailureClass.USER_CODE, Action.FAIL_JOB),
    (2, "hccl.result_2_ptr", FailureClass.USER_CODE, Action.FAIL_JOB),
    (3, "hccl.result_3_memory", FailureClass.OOM, Action.FAIL_JOB),
    (4, "hccl.result_4_internal", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (5, "hccl.result_5_not_support", FailureClass.USER_CODE, Action.FAIL_JOB),
    (6, "hccl.result_6_not_found", FailureClass.USER_CODE, Action.FAIL_JOB),
    (7, "hccl.result_7_unavail", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (8, "hccl.result_8_syscall", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (9, "hccl.result_9_timeout", FailureClass.HANG, Action.RESTART_JOB),
    (10, "hccl.result_10_open_file_failure", FailureClass.USER_CODE, Action.FAIL_JOB),
    (11, "hccl.result_11_tcp_connect", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (15, "hccl.result_15_runtime", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (20, "hccl.result_20_again", FailureClass.RETRYABLE_INFRA, Action.RESTART_IN_PLACE),
    (21, "hccl.result_21_remote", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    (22, "hccl.result_22_suspending", FailureClass.FALLOUT, Action.RESTART_JOB),
])
def test_hccl_result_codes_graded_by_the_enum(code, rule_id, failure_class, action):
    _assert_decides(HCCL_TRACEBACK.format(code=code), rule_id, failure_class, action)


def test_every_hccl_result_of_the_enum_has_a_rule():
    # hicann/hccl docs/api/context/HcclResult.md: HCCL_E_PARA = 1 ... HCCL_E_SUSPENDING = 22.
    ids = {r.id for r in ENGINE_RULES if r.id.startswith("hccl.result_")}
    assert {int(i.split("_")[1]) for i in ids} == set(range(1, 23))


# --- Ascend runtime / aclnn return codes and CANN error codes ----------------------------------

@pytest.mark.parametrize("line, rule_id, failure_class, action", [
    ("RuntimeError: npuSynchronizeDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:508 NPU function error: "
     "AclrtSynchronizeDeviceWithTimeout, error code is 507013", "acl.rt_507013_sys_dma",
     FailureClass.RETRYABLE_INFRA, Action.NOTIFY),
    ("BootstrapDispatcher: aclrtSynchronizeStream failed: 507018", "acl.rt_507018_aicpu_exception",
     FailureClass.RETRYABLE_INFRA, Action.NOTIFY),
    ("RuntimeError: ACL stream synchronize failed, error code:507035", "acl.rt_507035_vector_core_exception",
     FailureClass.RETRYABLE_INFRA, Action.NOTIFY),
    ("RuntimeError: alloc failed, error code is 207018", "acl.rt_207018_devide_oom", FailureClass.OOM, Action.FAIL_JOB),
    ("RuntimeError: call aclnnInplaceCopy failed, error code is 561103", "aclnn.inner_error",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("E30006: 2026-11-19-11:14:58.516.606 Failed to verify the OPP", "cann.e30006_opp_verify_failed",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("EL0004: [PID: 553] 2026-09-17-04:55:13.065.712 Failed to allocate memory.",
     "cann.el0004_driver_memory_alloc_failed", FailureClass.OOM, Action.FAIL_JOB),
    ("E19999: Inner Error!", "cann.internal_error_code", FailureClass.RETRYABLE_INFRA, Action.NOTIFY),
    ("EL0005: [PID: 3571] 2026-11-21-09:36:03.735.123 The resources are busy.", "cann.el0005_resource_busy",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_IN_PLACE),
    # 1XXXXX: environment or code logic (the aclError rules)
    ("RuntimeError: SetDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:127 NPU function error: "
     "aclrtSetDevice(device), error code is 107001", "acl.rt_107001_invalid_deviceid",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("RuntimeError: call aclrtGetCurrentContext failed, error code is 107002", "acl.rt_107002_context_null",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    # torch_npu's own ERR<submodule><ErrCode> line (_error_code.py)
    ("[ERROR] 2026-11-19-11:14:58 (PID:356, Device:0, RankID:-1) ERR00003 PTA invalid value",
     "torch_npu.err_caller_error", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("[ERROR] 2026-11-19-11:14:58 (PID:356, Device:0, RankID:-1) ERR01005 OPS internal error",
     "torch_npu.err_code", FailureClass.RETRYABLE_INFRA, Action.RESTART_IN_PLACE),
    ("[ERROR] 2026-11-19-11:14:58 (PID:356, Device:-1, RankID:-1) ERR99999 UNKNOWN application exception",
     "torch_npu.err_application_exception", FailureClass.INFO, Action.NONE),
    # llama.cpp's CANN backend aborting on a failed ACL call: graded as its abort (exit 134)
    ("/llama.cpp/ggml/src/ggml-cann/ggml-cann.cpp:63: CANN error", "ggml.cann_abort",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("E10001: [PID: 881] Value [x] for parameter [--model] is invalid.", "cann.user_error_code",
     FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_ascend_return_codes_graded_by_the_docs(line, rule_id, failure_class, action):
    _assert_decides(line, rule_id, failure_class, action)


def test_a_runtime_code_leaves_the_decision_to_the_cann_code_printed_with_it():
    # 507013 alone only notifies (rule 4: contact support); EL0004 after it is the real error.
    findings = _decide("RuntimeError: npuSynchronizeDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:508 "
                       "NPU function error: AclrtSynchronizeDeviceWithTimeout, error code is 507013\n"
                       "EL0004: [PID: 553] 2026-09-17-04:55:13.065.712 Failed to allocate memory.")
    real = [f for f in findings if f.action >= Action.RESTART_INSTANCE]
    assert [f.rule_id for f in real] == ["cann.el0004_driver_memory_alloc_failed"]


@pytest.mark.parametrize("code, rule_id, failure_class, action", [
    # the runtime codes of the faults torch_npu names (UCE ERROR, HBM MULTI BIT ECC ERROR, ...):
    # graded as the names are, so a log that shows only the code decides the same way
    (507053, "acl.rt_507053_device_mem_error", FailureClass.HARDWARE_NODE, Action.RESTART_IN_PLACE),
    (507054, "acl.rt_507054_hbm_multi_bit_ecc", FailureClass.HARDWARE_NODE, Action.RESTART_IN_PLACE),
    (507055, "acl.rt_507055_suspect_device_mem_error", FailureClass.HARDWARE_NODE, Action.RESTART_IN_PLACE),
    (507056, "acl.rt_507056_link_error", FailureClass.HARDWARE_NODE, Action.RESTART_JOB),
    (507057, "acl.rt_507057_suspect_remote_error", FailureClass.FALLOUT, Action.RESTART_JOB),
    (507904, "acl.rt_507904_comm_op_retry_fail", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
])
def test_runtime_codes_of_named_device_faults_grade_as_their_names(code, rule_id, failure_class, action):
    _assert_decides("RuntimeError: npuSynchronizeDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:508 "
                    f"NPU function error: AclrtSynchronizeDeviceWithTimeout, error code is {code}",
                    rule_id, failure_class, action)


def test_code_and_name_of_one_device_fault_agree():
    names = {r.id: r for r in ENGINE_RULES}
    for code_rule, name_rule in [("acl.rt_507053_device_mem_error", "torch_npu.uce_error"),
                                 ("acl.rt_507054_hbm_multi_bit_ecc", "torch_npu.hbm_multi_bit_ecc"),
                                 ("acl.rt_507055_suspect_device_mem_error", "torch_npu.suspect_mem_error"),
                                 ("acl.rt_507056_link_error", "torch_npu.hccs_link_error"),
                                 ("acl.rt_507057_suspect_remote_error", "torch_npu.suspect_remote_error"),
                                 ("acl.rt_507904_comm_op_retry_fail", "torch_npu.hccl_op_retry_failed")]:
        a, b = names[code_rule], names[name_rule]
        assert (a.failure_class, a.action) == (b.failure_class, b.action), code_rule


def test_operator_compiler_environment_failure_is_the_jobs_environment_not_an_internal_error():
    # EH9999 alone (an ACL internal code) only notifies; the message under it says the operator
    # compiler's environment could not be set up, which every attempt repeats.
    findings = _decide("EH9999: Inner Error!\n"
                       "EH9999  [Init][Env]init env failed![FUNC:ReportInnerError][FILE:log_inner.cpp][LINE:145]\n"
                       "        TraceBack (most recent call last):\n"
                       "        build op model failed, result = 500001[FUNC:ReportInnerError][FILE:log_inner.cpp][LINE:145]")
    real = [(f.rule_id, f.failure_class, f.action) for f in findings if f.action >= Action.RESTART_INSTANCE]
    assert real == [("acl.op_compile_env_init_failed", FailureClass.USER_CODE, Action.FAIL_JOB)]


def test_a_specific_cann_code_beats_the_generic_family():
    # EJ0001 has its own rule (ascend.yaml); the generic user-range rule never decides it.
    f = _one("EJ0001: [PID: 468348] 2026-04-24-16:14:56.975.866 Failed to initialize the HCCP process.")
    assert f.rule_id == "hccp.ej0001_init_failed"


# --- schedulers and orchestrators --------------------------------------------------------------

@pytest.mark.parametrize("line, rule_id, failure_class, action", [
    ("slurmstepd: error: *** JOB 4471023 ON gpu-r12n07 CANCELLED AT 2026-01-12T03:31:20 DUE TO PREEMPTION ***",
     "slurm.cancelled_preemption_or_node_failure", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("slurmstepd: error: *** STEP 51720844.0 ON nid02217 CANCELLED AT 2026-03-09T14:12:34 DUE TO NODE FAILURE ***",
     "slurm.cancelled_preemption_or_node_failure", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("slurmstepd: error: *** JOB 4471023 ON gpu-r12n07 CANCELLED AT 2026-01-12T03:31:20 DUE TO JOB REQUEUE ***",
     "slurm.cancelled_job_requeue", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("slurmstepd: error: *** JOB 123456 ON node-7 CANCELLED AT 2026-11-21T09:36:03 DUE TO TIME LIMIT ***",
     "scheduler.time_limit", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("   JobState=PREEMPTED Reason=None Dependency=(null)", "slurm.job_state_preempted_or_node_fail",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=318.batch cgroup. Some of your processes may "
     "have been killed by the cgroup out-of-memory handler.", "slurm.cgroup_oom_kill", FailureClass.OOM, Action.FAIL_JOB),
    ("srun: error: sdn4412: task 0: Out Of Memory", "slurm.task_out_of_memory", FailureClass.OOM, Action.FAIL_JOB),
    ("      Reason:       OOMKilled", "k8s.oom_killed", FailureClass.OOM, Action.FAIL_JOB),
    ("Message:        The node was low on resource: memory. Container egg was using 6188104Ki, which exceeds "
     "its request of 0. ", "k8s.evicted_memory_pressure", FailureClass.OOM, Action.FAIL_JOB),
    ("Warning  Evicted  pod/w-1  The node had condition: [DiskPressure].", "k8s.evicted_other_pressure",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("Normal  Preempted  pod/trainer-3  Preempted by default/critical-0 on node gpu-17", "k8s.preempted",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("Normal  NodeNotReady  node/gpu-17  Node gpu-17 status is now: NodeNotReady", "k8s.node_not_ready",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
])
def test_scheduler_lines_graded_by_the_docs(line, rule_id, failure_class, action):
    _assert_decides(line, rule_id, failure_class, action)


# Issue 12 item 2, one family per meaning across schedulers: a time limit the job asked for fails it
# (the limit named), a memory limit of its own is OOM, the cluster's doing (preemption, a lost
# node, a drain) restarts, a person's kill fails, a SIGTERM of the step's tasks is fallout.
@pytest.mark.parametrize("line, rule_id, failure_class, action", [
    ("slurmstepd: error: *** JOB 31580279 ON anode150 CANCELLED AT 2026-07-29T18:45:16 DUE TO NODE FAILURE, "
     "SEE SLURMCTLD LOG FOR DETAILS ***", "slurm.cancelled_preemption_or_node_failure",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("slurmstepd: error: *** STEP 8812.0 CANCELLED AT 2026-07-29T18:45:16 DUE TO NODE FAILURE ***",
     "slurm.cancelled_preemption_or_node_failure", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("slurmstepd: error: *** JOB 70121 CANCELLED AT 2026-11-26T03:42:59 ***", "slurm.cancelled",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)", "slurm.job_state_timeout",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("4471023      train.sh        gpu     proj      64   DEADLINE      0:0", "slurm.job_state_timeout",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("4471023.ba+      batch                proj      64 OUT_OF_ME+    0:125", "slurm.job_state_out_of_memory",
     FailureClass.OOM, Action.FAIL_JOB),
    ("4471023      train.sh        gpu     proj      64  BOOT_FAIL      0:0", "slurm.job_state_boot_fail",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("slurmstepd: error: *** JOB 6847502 STEPD TERMINATED ON udc-aw29-24b AT 2026-11-07T02:10:11 DUE TO JOB NOT "
     "ENDING WITH SIGNALS ***", "slurm.stepd_unkillable", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("srun: error: sdn4413: tasks 16-31: Terminated", "slurm.srun_task_terminated", FailureClass.FALLOUT,
     Action.RESTART_JOB),
    ("TERM_RUNLIMIT: job killed after reaching LSF run time limit.", "lsf.term_time_limit",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.", "lsf.term_memory_limit",
     FailureClass.OOM, Action.FAIL_JOB),
    ("TERM_PREEMPT: job killed after preemption.", "lsf.term_preempted_or_reclaimed",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("TERM_REQUEUE_OWNER: job killed and requeued by owner.", "lsf.term_preempted_or_reclaimed",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("TERM_OWNER: job killed by owner.", "lsf.term_killed_by_person", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("=>> PBS: job killed: walltime 3611 exceeded limit 3600", "pbs.walltime_exceeded",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("=>> PBS: job killed: vmem 17179869184b exceeded limit 16106127360b", "pbs.memory_exceeded",
     FailureClass.OOM, Action.FAIL_JOB),
    ("Warning  DeadlineExceeded  job/train-llm  Job was active longer than specified deadline",
     "k8s.deadline_exceeded", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("  Message:      Pod was active on the node longer than the specified deadline", "k8s.deadline_exceeded",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ('Warning  Evicted  pod/trainer-0  Container trainer exceeded its local ephemeral storage limit "20Gi". ',
     "k8s.ephemeral_storage_limit", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("  Message:      Node gpu-17 which was running pod trainer-worker-3 is unresponsive", "k8s.node_lost",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("    reason: EvictionByEvictionAPI", "k8s.disruption_target", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    # node disk pressure: the pod over its own storage request is evicted again (as for memory); within
    # its request, the node's pressure is the node's
    ("Message:        The node was low on resource: ephemeral-storage. Container trainer was using 10Gi, which "
     "exceeds its request of 0. ", "k8s.evicted_storage_over_request", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("The node was low on resource: ephemeral-storage. Threshold quantity: 10120387530, available: 9702960Ki. "
     "Container main was using 26498512Ki, request is 0, has larger consumption of ephemeral-storage. ",
     "k8s.evicted_storage_over_request", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Message:        The node was low on resource: ephemeral-storage. ", "k8s.evicted_other_pressure",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("PRTE has lost communication with a remote daemon.", "mpi.daemon_lost", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    ("ORTE has lost communication with its daemon located on node:", "mpi.daemon_lost",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("An ORTE daemon has unexpectedly failed after launch and before communicating back to mpirun. This could "
     "be caused by a number", "mpi.daemon_failed_at_launch", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("ORTE was unable to reliably start one or more daemons.", "mpi.daemon_failed_at_launch",
     FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_scheduler_families_graded_by_their_docs(line, rule_id, failure_class, action):
    _assert_decides(line, rule_id, failure_class, action)


@pytest.mark.parametrize("line", [
    # a call's deadline (gRPC, google-api-core) is no orchestrator time limit
    "google.api_core.exceptions.DeadlineExceeded: 504 Deadline Exceeded",
    # node disk pressure is no breach of the pod's own ephemeral-storage limit
    "Message:        The node was low on resource: ephemeral-storage. Container x was using 10Gi, which exceeds "
    "its request of 0.",
    # the kubelet's TerminationByKubelet also covers a pod evicted for its own memory use
    "    reason: TerminationByKubelet",
    "export NCCL_TIMEOUT=1800",
])
def test_scheduler_near_misses_are_not_scheduler_ends(line):
    findings = _decide(line)
    assert all(f.rule_id not in {"k8s.deadline_exceeded", "k8s.ephemeral_storage_limit", "k8s.disruption_target",
                                 "slurm.job_state_timeout"} for f in findings), [f.rule_id for f in findings]


def test_plain_cancel_line_is_not_a_preemption():
    findings = _decide("slurmstepd: error: *** STEP 20417731.0 ON sdn4412 CANCELLED AT 2026-03-09T10:58:40 ***")
    assert all(not f.rule_id.startswith("slurm.cancelled") for f in findings)


# --- Python: the final exception class decides -------------------------------------------------

def _traceback(final: str, frames: str = "    sock.recv(4)") -> str:
    return "\n".join(["Traceback (most recent call last):", '  File "/work/train.py", line 19, in <module>',
                      frames, final])


@pytest.mark.parametrize("final, rule_id, failure_class, action", [
    ("ConnectionResetError: [Errno 104] Connection reset by peer", None, FailureClass.RETRYABLE_INFRA, None),
    ("KeyError: 'lr'", "python.key_error", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("OSError: [Errno 5] Input/output error", None, FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("OSError: [Errno 116] Stale file handle", None, FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("TimeoutError: timed out", "python.exception.TimeoutError", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", None, FailureClass.OOM, Action.FAIL_JOB),
    ("KeyboardInterrupt", "python.exception.KeyboardInterrupt", FailureClass.FALLOUT, Action.NONE),
    ("SystemExit: 3", "python.exception.SystemExit", FailureClass.INFO, Action.NONE),
    ("RuntimeError: something the program checked", "python.exception.RuntimeError", FailureClass.USER_CODE,
     Action.FAIL_JOB),
])
def test_final_exception_class_grades_the_traceback(final, rule_id, failure_class, action):
    f = _one(_traceback(final))
    assert f.failure_class is failure_class, (f.rule_id, f.failure_class)
    if rule_id is not None:
        assert f.rule_id == rule_id
    if action is not None:
        assert f.action is action
    assert f.rule_id != "python.uncaught_exception"


def test_connection_reset_is_not_user_code_but_key_error_is():
    reset = _one(_traceback("ConnectionResetError: [Errno 104] Connection reset by peer"))
    key = _one(_traceback("KeyError: 'lr'"))
    assert reset.failure_class is not FailureClass.USER_CODE and reset.action < Action.FAIL_JOB
    assert (key.failure_class, key.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_a_rule_on_the_final_line_beats_a_rule_on_a_frame_line():
    # A frame line naming a missing file must not decide a traceback that ended in a reset.
    text = _traceback("ConnectionResetError: [Errno 104] Connection reset by peer",
                      '    raise FileNotFoundError("No such file or directory")')
    assert _one(text).failure_class is not FailureClass.USER_CODE


def test_generic_runtime_error_defers_to_a_rule_on_its_message():
    f = _one(_traceback("RuntimeError: CUDA error: an illegal memory access was encountered"))
    assert f.rule_id.startswith("cuda.")


def test_dataloader_reraise_defers_to_the_original_traceback():
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/work/train.py", line 209, in <module>',
        "    data.reraise()",
        "OSError: Caught OSError in DataLoader worker process 1.",
        "Original Traceback (most recent call last):",
        '  File "/site-packages/mmcv/fileio/file_client.py", line 536, in get',
        "    with open(filepath, 'rb') as f:",
        "OSError: [Errno 5] Input/output error: '/data/images/1.jpg'",
    ])
    findings = _decide(text)
    assert [f.failure_class for f in findings] == [FailureClass.FALLOUT, FailureClass.RETRYABLE_INFRA]


def test_exception_line_index():
    lines = _traceback("KeyError: 'lr'").split("\n")
    assert exception_line(lines) == 3
    assert exception_line(lines[:3]) is None


def test_catalog_rows_follow_pythons_own_hierarchy():
    # Every built-in class row names its real base class (Python's exception hierarchy).
    catalog = ExceptionCatalog.load()
    import importlib.resources
    text = importlib.resources.files("ftwatch.rules").joinpath("packs/python_exceptions.tsv").read_text()
    rows = [dict(zip(text.split("\n")[0].split("\t"), ln.split("\t"))) for ln in text.split("\n")[1:] if ln]
    checked = 0
    for row in rows:
        assert row["source"], row["name"]
        FailureClass(row["class"])
        Action[row["action"].upper()]
        assert row["decides"] in ("class", "message")
        cls = getattr(builtins, row["name"], None)
        if row["kind"] == "class" and cls is not None and cls.__name__ == row["name"] and row["parent"]:
            assert cls.__base__.__name__ == row["parent"], row["name"]
            checked += 1
        if row["kind"] == "errno":
            import errno
            assert getattr(errno, row["name"]) == int(row["parent"]), row["name"]
    assert checked >= 50
    assert catalog.lookup("torch.cuda.OutOfMemoryError").failure_class is FailureClass.OOM


def test_ggml_cann_abort_is_graded_as_the_abort_it_announces():
    from ftwatch.rules.exitcodes import ExitCodeTable
    row = ExitCodeTable.load().get(134)
    rule = next(r for r in ENGINE_RULES if r.id == "ggml.cann_abort")
    assert (rule.failure_class, rule.action) == (row.failure_class, row.action)


# --- torchelastic: a closed rendezvous restates another agent's end ---------------------------

_RDZV_CLOSED = "\n".join([
    "Traceback (most recent call last):",
    '  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 863, '
    "in _restart_workers",
    "    self._initialize_workers(self._worker_group)",
    "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"])


def test_rendezvous_closed_is_fallout_of_the_agent_that_closed_it():
    # dynamic_rendezvous.py: an agent's shutdown() closes the rendezvous; another agent's join then raises
    f = _one(_RDZV_CLOSED)
    assert (f.rule_id, f.failure_class, f.action) == ("torch_elastic.rendezvous_closed", FailureClass.FALLOUT,
                                                      Action.RESTART_JOB)


def test_the_closing_nodes_own_error_is_the_root_cause_not_the_closed_rendezvous():
    from ftwatch.policy.rootcause import analyse
    engine = Engine(ENGINE_RULES)
    error = engine.feed(Origin("node-0"), b"Traceback (most recent call last):\n  File \"train.py\", line 9, in "
                        b"<module>\nKeyError: 'labels'\n", 1.0, final=True)
    closed = engine.feed(Origin("node-1"), (_RDZV_CLOSED + "\n").encode(), 2.0, final=True)
    an = analyse(error + closed)
    assert an.root_cause is error[0] and an.root_cause.failure_class is FailureClass.USER_CODE
