"""Every node of a job timing out on its c10d rendezvous endpoint (ftwatch.policy.rdzvendpoint, issue 12):
the endpoint's own agent serves the store (c10d_rendezvous_backend._create_tcp_store), so when it times out
too the endpoint names no node of the job as it knows itself: configuration; fewer nodes keep the grade."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.initphase import NONE_YET, at_init
from ftwatch.policy.rdzvendpoint import every_node_unreachable
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
LAUNCH = ("+ torchrun --nnodes=2 --nproc_per_node=4 --rdzv_id=311 --rdzv_backend=c10d "
          "--rdzv_endpoint=10.244.3.17:2222 train.py")
TIMEOUT = ("TimeoutError: The client socket has timed out after 60s while trying to connect to "
           "(10.244.3.17, 2222).")


def node(name: str, launch: str = LAUNCH, timeout: str | None = TIMEOUT) -> list[Finding]:
    origin = Origin(name, None, "rdzv", name, "stderr", "process")
    text = f"{launch}\n" + (f'Traceback (most recent call last):\n  File "run.py", line 9, in <module>\n{timeout}\n'
                            if timeout else "")
    return ENGINE.feed(origin, text.encode(), T0, final=True)


def test_every_node_timing_out_on_the_endpoint_fails_the_job():
    found = [*node("worker-0"), *node("worker-1")]
    assert found[-1].rule_id == "torch.store_client_timeout"
    grade = at_init(found[-1], NONE_YET, found)
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE and grade.action is Action.FAIL_JOB
    assert "_create_tcp_store" in grade.source and "10.244.3.17" in grade.meaning


def test_one_node_of_two_timing_out_keeps_its_grade():
    found = [*node("worker-0", timeout=None), *node("worker-1")]
    assert every_node_unreachable(found[-1], found) is None


def test_the_node_count_and_a_c10d_backend_must_be_stated():
    for launch in (LAUNCH.replace("--nnodes=2", "--nnodes=3"), LAUNCH.replace("c10d", "etcd"),
                   LAUNCH.replace("--nnodes=2 ", "")):
        found = [*node("worker-0", launch), *node("worker-1", launch)]
        assert every_node_unreachable(found[-1], found) is None, launch
    elastic = LAUNCH.replace("--nnodes=2", "--nnodes=1:2")
    found = [*node("worker-0", elastic), *node("worker-1", elastic)]
    assert every_node_unreachable(found[-1], found) is not None      # MAX of MIN:MAX, all of them
    elastic = LAUNCH.replace("--nnodes=2", "--nnodes=2:4")
    found = [*node("worker-0", elastic), *node("worker-1", elastic)]
    assert every_node_unreachable(found[-1], found) is None          # the endpoint's node may be a late third


def test_timeouts_to_different_hosts_do_not_count_together():
    other = TIMEOUT.replace("10.244.3.17", "10.244.3.18")
    found = [*node("worker-0"), *node("worker-1", timeout=other)]
    assert every_node_unreachable(found[-1], found) is None


def test_after_progress_it_keeps_its_grade():
    found = [*node("worker-0"), *node("worker-1")]
    assert at_init(found[-1], T0 - 10, found) is None
