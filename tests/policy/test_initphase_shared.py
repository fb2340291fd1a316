"""Many ranks failing the same call of their own before any progress is the job's set-up
(``ftwatch.policy.sharedfailure`` through ``initphase.at_init``): NCCL's system / CUDA error codes
from three ranks or more (the CUDA code from two: a CUDA call is the rank's own), a rendezvous connect that timed out on rank 0 (its host) and others; one
or two ranks failing so, a lost peer beside them, workers without rank 0, or the same errors after
progress keep the rule's retryable grade."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.initphase import NONE_YET, at_init
from ftwatch.policy.sharedfailure import MIN_INSTANCES as SHARED_MIN_INSTANCES
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
SYSTEM = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
          "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3")
CUDA = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1331, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1")
REMOTE = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, "
          "remote process exited or there was a network error, NCCL version 2.19.3")


def ranks(line: str, *which: int) -> list[Finding]:
    out: list[Finding] = []
    for r in which:
        o = Origin(f"rank{r}", r, "shared", "node-0", "stderr", "process")
        out += ENGINE.feed(o, f"{line}\n".encode(), T0 + r / 100, final=True)
    return out


def test_every_rank_failing_the_same_call_at_init_is_the_set_up():
    for line in (SYSTEM, CUDA):
        found = ranks(line, *range(SHARED_MIN_INSTANCES + 1))
        grade = at_init(found[0], NONE_YET, found)
        assert grade is not None, line
        assert grade.failure_class is FailureClass.USER_CODE and grade.action is Action.FAIL_JOB
        assert grade.rule == found[0].rule_id


def test_one_or_two_ranks_keep_the_retryable_grade():
    found = ranks(SYSTEM, 0, 1)
    assert at_init(found[0], NONE_YET, found) is None


def test_a_lost_peer_beside_them_keeps_the_retryable_grade():
    found = [*ranks(SYSTEM, 0, 1, 2), *ranks(REMOTE, 3)]
    assert any(f.rule_id == "nccl.remote_error" for f in found)
    assert at_init(found[0], NONE_YET, found) is None


def test_the_same_errors_after_progress_keep_the_retryable_grade():
    found = ranks(SYSTEM, 0, 1, 2, 3)
    assert at_init(found[0], T0 - 60, found) is None


def test_two_ranks_failing_their_own_cuda_call_at_init_are_the_set_up():
    """ncclUnhandledCudaError is the rank's own CUDA call (NCCL's CUDACHECK): no link fails both ends with it."""
    found = ranks(CUDA, 0, 1)
    grade = at_init(found[0], NONE_YET, found)
    assert grade is not None and grade.action is Action.FAIL_JOB
    alone = ranks(CUDA, 1)
    assert at_init(alone[0], NONE_YET, alone) is None
    assert at_init(found[0], T0 - 60, found) is None


def test_the_two_codes_are_counted_apart():
    found = [*ranks(SYSTEM, 0, 1), *ranks(CUDA, 2)]
    assert at_init(found[0], NONE_YET, found) is None


STORE = ("torch.distributed.DistNetworkError: The client socket has timed out after 900s while trying to connect to "
         "(node-0, 29400).")
COORD = "jaxlib._jax.XlaRuntimeError: DEADLINE_EXCEEDED: Deadline Exceeded"
EXEC = ("E0101 10:00:00.000000 1 pjrt_stream_executor_client.cc:2809] Execution of replica 0 failed: "
        "DEADLINE_EXCEEDED: stream did not block host until done")


def test_the_rendezvous_hosts_own_connect_failing_with_others_is_the_launchs_address():
    for line in (STORE, COORD):
        found = ranks(line, 0, 1, 2, 3)
        grade = at_init(found[-1], NONE_YET, found)
        assert grade is not None and grade.action is Action.FAIL_JOB, line


def test_workers_that_cannot_reach_rank_0_keep_the_retryable_grade():
    """rank 0 hosts the store and said nothing: it may have started late (a transient)."""
    found = ranks(STORE, 1, 2, 3, 4)
    assert at_init(found[0], NONE_YET, found) is None
    alone = ranks(STORE, 0)
    assert at_init(alone[0], NONE_YET, alone) is None


def test_a_program_execution_past_its_deadline_is_no_rendezvous():
    found = ranks(EXEC, 0, 1, 2, 3)
    assert found and all(f.rule_id == "xla.status.deadline_exceeded" for f in found[:1])
    assert at_init(found[0], NONE_YET, found) is None
