"""Set-up faults that a vendor's own message names, read as the job's, not as transient infrastructure
(issue 12, round 14 k15b): every wording a source prints for the same fault, graded alike.

- A DataLoader worker killed by SIGBUS when /dev/shm is too small: PyTorch's and Paddle's wordings
  (Paddle ``paddle/fluid/imperative/data_loader.cc``: the worker's SIGBUS handler and the parent's
  ``killed by signal: Bus error`` report) name the shm size or the queue capacity as the fix.
- Shared memory that is full (PyTorch ``MapAllocator``: ``unable to write to file </torch_...>: No space
  left on device``; a file under ``/dev/shm``): the tmpfs size the container sets, not a disk to wait for.
- A process group with no mapping for a tensor's dtype (PyTorch's ProcessGroupNCCL, torch_npu's and
  OneFlow's HCCL, Intel Gaudi's ProcessGroupHCCL): the program's tensors, every relaunch the same.
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
W1 = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")
T0 = 1_795_253_763.0


def _decisive(*lines: str) -> list:
    findings = Engine(BUILTIN).feed(W1, "".join(f"{line}\n" for line in lines).encode(), T0, final=True)
    return [f for f in findings if f.failure_class is not FailureClass.INFO]


@pytest.mark.parametrize("line, rule", [
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
     "torch.dataloader_shm_bus_error"),
    ("ERROR: Unexpected BUS error encountered in DataLoader worker. This might be caused by insufficient shared "
     "memory (shm), please check whether use_shared_memory is set and storage space in /dev/shm is enough",
     "paddle.dataloader_shm_bus_error"),
    ("SystemError: (Fatal) DataLoader process (pid 5121) exited is killed by signal: Bus error.",
     "paddle.dataloader_shm_bus_error"),
])
def test_every_frameworks_shm_bus_error_of_a_dataloader_worker_is_the_jobs_set_up(line, rule):
    [finding] = [f for f in _decisive(line) if f.rule_id == rule]
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_a_paddle_worker_killed_by_another_signal_is_not_read_as_shm():
    findings = _decisive("SystemError: (Fatal) DataLoader process (pid 5121) exited is killed by signal: Killed.")
    assert all(f.rule_id != "paddle.dataloader_shm_bus_error" for f in findings)


@pytest.mark.parametrize("line", [
    "RuntimeError: Unsupported data type for NCCL process group",
    "RuntimeError: Unsupported data type for HCCL process group",
    "RuntimeError: Unsupported data type for HCCL process group[ERROR] 2024-05-06-10:00:00 (PID:4321, "
    "Device:0, RankID:0) ERR02005 DIST not support",
    "  what():  Getting size for given data type is not supported: 0",
])
def test_a_process_group_refusing_a_tensors_dtype_is_the_program(line):
    [finding] = [f for f in _decisive(line) if f.rule_id == "c10d.process_group_dtype_unsupported"]
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


@pytest.mark.parametrize("line", [
    "RuntimeError: unable to write to file </torch_18342_2906381424_0>: No space left on device (28)",
    "RuntimeError: unable to resize file </torch_18342_2906381424_3> to the right size: No space left on device (28)",
    "OSError: [Errno 28] No space left on device: '/dev/shm/streaming_shm_7f3a_index'",
])
def test_shared_memory_full_is_the_jobs_shm_size_not_a_disk_to_wait_for(line):
    [finding] = _decisive(line)
    assert finding.rule_id == "torch.shm_no_space"
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


@pytest.mark.parametrize("line, rule", [
    ("OSError: [Errno 28] No space left on device: '/mnt/ckpt/step_1200/optim.pt'", "storage.no_space_left"),
    ("OSError: [Errno 122] Disk quota exceeded: '/home/u/work_dirs/epoch_14.pth'", "storage.disk_quota_exceeded"),
])
def test_a_full_disk_or_quota_elsewhere_is_for_a_person_to_clear(line, rule):
    """MindCluster's fault knowledge graph grades a full disk in a training log as class User
    ("Clear the disk space"): a restart writes into the same full volume or quota again."""
    [finding] = _decisive(line)
    assert finding.rule_id == rule
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def _traceback(final: str) -> list[str]:
    return ["Traceback (most recent call last):",
            '  File "/opt/app/train.py", line 219, in main',
            "    trainer = build()",
            final]


@pytest.mark.parametrize("final, rule", [
    ("ConnectionError: The vLLM server can't be reached at 0.0.0.0:8000 after 240.0 seconds. Make sure the server "
     "is running by running `trl vllm-serve`.", "trl.vllm_server_never_reached"),
    ("ConnectionError: The async vLLM server can't be reached at http://10.0.0.7:8000 after 600 seconds. Make sure "
     "the server is running by running `trl vllm-serve-async`.", "trl.vllm_server_never_reached"),
    ("ConnectionError: Could not find any running Ray instance. Please specify the one to connect to by setting "
     "`--address` flag or `RAY_ADDRESS` environment variable.", "ray.no_running_instance"),
])
def test_a_companion_service_the_job_never_started_is_its_launch_not_a_transient_connection(final, rule):
    """A client that says, after its whole start-up wait, that the service the job starts beside it (TRL's
    vLLM server, a Ray cluster) is not running: the job's launch, not a ConnectionError to retry."""
    found = _decisive(*_traceback(final))
    assert [f.rule_id for f in found] == [rule], found
    assert (found[0].failure_class, found[0].action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_a_connection_error_of_another_client_keeps_its_transient_grade():
    found = _decisive(*_traceback("ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Read timed out."))
    assert found and all(f.failure_class is not FailureClass.USER_CODE for f in found), found
