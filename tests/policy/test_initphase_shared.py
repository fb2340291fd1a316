"""Many ranks failing the same NCCL call themselves before any progress is the job's set-up
(``ftwatch.policy.initphase._shared``); one or two ranks failing so, a lost peer beside them, or the
same errors after progress keep the rule's retryable grade."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.initphase import NONE_YET, SHARED_MIN_INSTANCES, at_init
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


def test_the_two_codes_are_counted_apart():
    found = [*ranks(SYSTEM, 0, 1), *ranks(CUDA, 2)]
    assert at_init(found[0], NONE_YET, found) is None
