"""A node of rank 1 or more told to rendezvous at a loopback address (ftwatch.policy.rdzvconfig, issue 12
item 3): its start-up hang is the launch's configuration; node rank 0 at localhost, a routable address,
or a hang after progress keep the hang reading."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.initphase import NONE_YET, STORE_CONNECT_TIMEOUTS, at_init
from ftwatch.policy.loopback import is_loopback
from ftwatch.policy.rdzvconfig import loopback_rendezvous
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())


def node_lines(instance: str, *lines: str) -> list[Finding]:
    o = Origin(instance, None, "rdzv", instance, "stdout", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0, final=True)


def hang() -> Finding:
    o = Origin("node0", 0, "rdzv", "node0", "stdout", "process")
    return Finding("hang.job", "hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR, o,
                   "no output from any of 2 instances for 1800 s", T0 + 1800.0, 10**6)


def launch(node_rank: int, addr: str) -> list[str]:
    return [f"NNODES=2 NODE_RANK={node_rank} MASTER_ADDR={addr} MASTER_PORT=6001 GPUS_PER_NODE=4"]


def test_the_config_lines_are_evidence_findings():
    found = node_lines("node1", *launch(1, "localhost"))
    assert [f.rule_id for f in found] == ["rendezvous.config_line"]
    assert found[0].failure_class is FailureClass.INFO


def test_a_second_node_pointed_at_localhost_hangs_by_its_launch():
    evidence = node_lines("node0", *launch(0, "localhost")) + node_lines("node1", *launch(1, "localhost"))
    grade = at_init(hang(), NONE_YET, evidence)
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE and grade.action is Action.FAIL_JOB
    assert "node1 is node rank 1" in grade.meaning


def test_torchrun_flags_and_deepspeed_node_rank_read_alike():
    evidence = node_lines("n1", "torchrun --nnodes=2 --node-rank=1 --master-addr=127.0.0.1 --master-port=29500 t.py")
    assert loopback_rendezvous(hang(), evidence) is not None
    evidence = node_lines("n1", "[INFO] [launch.py:145:main] nnodes=2, num_local_procs=8, node_rank=1",
                          "[INFO] [launch.py:150:main] master_addr=127.0.0.1, master_port=29500")
    assert loopback_rendezvous(hang(), evidence) is not None


def test_node_rank_zero_at_localhost_is_the_master_itself():
    assert at_init(hang(), NONE_YET, node_lines("master", *launch(0, "localhost"))) is None


def test_a_routable_master_address_keeps_the_hang_reading():
    evidence = node_lines("node1", *launch(1, "10.0.0.5")) + node_lines("node2", *launch(2, "gpu-node-a12"))
    assert at_init(hang(), NONE_YET, evidence) is None


def test_after_progress_the_hang_keeps_its_reading():
    evidence = node_lines("node1", *launch(1, "localhost"))
    assert at_init(hang(), T0 + 60.0, evidence) is None


def test_loopback_names():
    assert all(map(is_loopback, ["localhost", "127.0.0.1", "127.0.1.1", "::1"]))
    assert not any(map(is_loopback, ["10.0.0.5", "gpu-node-a12", "0.0.0.0", "fe80::1"]))


def rank_env(rank: int, port: int, addr: str = "127.0.0.1") -> str:
    return f"rank {rank} | MASTER_ADDR={addr} MASTER_PORT={port}, calling init_process_group(backend='nccl')"


def test_ranks_given_different_ports_for_one_address_never_meet():
    evidence = node_lines("train", rank_env(0, 41733), rank_env(1, 38855))
    grade = at_init(hang(), NONE_YET, evidence)
    assert grade is not None and grade.action is Action.FAIL_JOB and "different ports" in grade.meaning


def test_ranks_given_one_port_keep_the_hang_reading():
    assert at_init(hang(), NONE_YET, node_lines("train", rank_env(0, 29500), rank_env(1, 29500))) is None


def test_a_new_round_minutes_later_on_a_new_port_is_no_split():
    o = Origin("agent", None, "rdzv", "node0", "stdout", "process")
    first = ENGINE.feed(o, b"[default] Rendezvous complete: master_addr=worker-0 master_port=41207\n", T0 - 900, final=True)
    later = ENGINE.feed(o, b"[default] Rendezvous complete: master_addr=worker-0 master_port=52914\n", T0 - 300, final=True)
    assert at_init(hang(), NONE_YET, first + later) is None



def store_timeout(instance: str, host: str, launch_line: str) -> tuple[Finding, list[Finding]]:
    """The launch line, then the store connect that timed out, on one instance: (the timeout, all findings)."""
    line = ("torch.distributed.DistNetworkError: The client socket has timed out after 900s while trying to "
            f"connect to ({host}, 29500).")
    found = node_lines(instance, launch_line, line)
    timeouts = [f for f in found if f.rule_id in STORE_CONNECT_TIMEOUTS]
    assert len(timeouts) == 1
    return timeouts[0], found


def torchrun(node_rank: int, addr: str, extra: str = "") -> str:
    return (f"+ python -m torch.distributed.run --nproc_per_node 4 --nnodes 1 --node_rank {node_rank} "
            f"--master_addr {addr} --master_port 29500 {extra}train.py")


def test_node_rank_zero_timing_out_on_its_own_static_store_is_the_launch():
    f, found = store_timeout("n0", "192.168.0.1", torchrun(0, "192.168.0.1"))
    grade = at_init(f, NONE_YET, found)
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE and grade.action is Action.FAIL_JOB
    assert "node rank 0" in grade.meaning and "192.168.0.1" in grade.meaning


def test_another_node_or_address_or_a_dynamic_rendezvous_keeps_the_retryable_reading():
    f, found = store_timeout("n1", "192.168.0.1", torchrun(1, "192.168.0.1"))
    assert at_init(f, NONE_YET, found) is None                                  # a master that starts late
    f, found = store_timeout("n0", "10.0.0.7", torchrun(0, "192.168.0.1"))
    assert at_init(f, NONE_YET, found) is None                                  # not its own address
    dynamic = torchrun(0, "192.168.0.1", "--rdzv_backend c10d --rdzv_endpoint 192.168.0.1:29500 ")
    f, found = store_timeout("n0", "192.168.0.1", dynamic)
    assert at_init(f, NONE_YET, found) is None                                  # the endpoint's agent hosts it
