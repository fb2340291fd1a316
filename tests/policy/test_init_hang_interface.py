"""A job hang before any progress while NCCL on different hosts uses the same (host-local) address
first (ftwatch.policy.initphase, issue 12 item 3): NCCL's troubleshooting guide says interfaces that
cannot reach the other nodes make it "fail during the init functions or even hang"; the same hang
with routable, distinct addresses, on one host, or after progress keeps the hang reading."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.initphase import NONE_YET, at_init
from ftwatch.policy.policy import Incident, Policy
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.testing import finding

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
JOB = "ifhang"
FLAGS = {"fault_tolerant_policy": "ExitCodeAndErrorMsg", "enable_job_restart": True, "max_num_of_job_restart": 3,
         "enable_job_hang_detection": True}


def socket_line(host: str, first: str, second: str) -> list[Finding]:
    line = (f"[1,0]<stdout>:{host}:31200:31261 [0] NCCL INFO NET/Socket : Using [0]{first} [1]{second}")
    found = ENGINE.feed(Origin("mpirun", None, JOB, "launcher", "stdout", "process"), f"{line}\n".encode(), T0,
                        final=True)
    assert [f.rule_id for f in found] == ["nccl.socket_interfaces_in_use"]
    return found


def hang() -> Finding:
    return finding("hang.job", kind="hang", failure_class=FailureClass.HANG, action=Action.RESTART_JOB,
                   time=T0 + 1800.0, seq=10**9, fields={"silent_for": 1800.0})


def docker0_on(*hosts: str) -> list[Finding]:
    return [f for i, h in enumerate(hosts) for f in socket_line(h, "docker0:172.17.0.1<0>", f"eth0:10.0.0.{i + 1}<0>")]


def test_a_hang_at_init_over_an_address_two_hosts_share_is_configuration():
    grade = at_init(hang(), NONE_YET, docker0_on("srv1", "srv2"))
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE and grade.action is Action.FAIL_JOB


def test_distinct_routable_addresses_one_host_or_progress_keep_the_hang():
    distinct = [f for i, h in enumerate(("srv1", "srv2")) for f in socket_line(h, f"eth0:10.0.0.{i + 1}<0>", "ib0:1<0>")]
    assert at_init(hang(), NONE_YET, distinct) is None
    assert at_init(hang(), NONE_YET, docker0_on("srv1", "srv1")) is None      # one host's ranks list it alike
    assert at_init(hang(), T0, docker0_on("srv1", "srv2")) is None           # it trained before: the network's


def test_the_policy_fails_the_job(tmp_path: Path):
    evidence = (*docker0_on("srv1", "srv2", "srv3"), hang())
    policy = Policy(Config().with_policy(**FLAGS).policy, BudgetStore(tmp_path / "b.json", JOB), JOB)
    d = policy.decide(Incident(evidence[-1], evidence, 3, frozenset(), 0, progress_at=NONE_YET), T0 + 1801.0)
    assert d.action is Action.FAIL_JOB, d.policy_clause
    assert "R6" in d.policy_clause


def nccl_failure(rule: str = "nccl.unhandled_system_error") -> Finding:
    return finding(rule, failure_class=FailureClass.RETRYABLE_INFRA, action=Action.RESTART_JOB,
                   time=T0 + 30.0, seq=10**9)


def host_line(host: str, text: str, rule: str) -> list[Finding]:
    """``text`` as NCCL logs it on ``host`` (its ``<host>:<pid>:<tid> [dev]`` prefix), read as ``rule``."""
    line = f"{host}:61:61 [0] NCCL INFO {text}"
    found = ENGINE.feed(Origin(host, None, JOB, host, "stdout", "process"), f"{line}\n".encode(), T0, final=True)
    assert [f.rule_id for f in found] == [rule]
    return found


def old_interface_line(host: str, interface: str) -> list[Finding]:
    """NCCL 2.4's form: one ``NET : Using interface`` line per interface (include/socket.h)."""
    return host_line(host, f"NET : Using interface {interface}", "nccl.socket_interfaces_in_use")


def test_an_nccl_network_failure_at_init_over_a_shared_address_is_configuration():
    """The guide's 'fail during the init functions', not only its 'or even hang'."""
    for rule in ("nccl.unhandled_system_error", "nccl.remote_error", "nccl.socket_connect_failed"):
        grade = at_init(nccl_failure(rule), NONE_YET, docker0_on("srv1", "srv2"))
        assert grade is not None and grade.failure_class is FailureClass.USER_CODE, rule
        assert grade.rule == rule
    oom = finding("cuda.out_of_memory", failure_class=FailureClass.OOM, action=Action.FAIL_JOB, time=T0 + 30.0)
    assert at_init(oom, NONE_YET, docker0_on("srv1", "srv2")) is None      # not the network's failure
    assert at_init(nccl_failure(), T0, docker0_on("srv1", "srv2")) is None   # it trained before: the network's


def test_addresses_of_each_hosts_default_docker_bridge_are_host_local():
    """Two containers on two hosts' default bridges (172.17.0.0/16): distinct addresses, neither
    reaches the other host (Docker: bridge networks apply to one daemon's host)."""
    bridged = [*old_interface_line("trainer-a", "eth0:172.17.0.2<0>"), *old_interface_line("trainer-b", "eth0:172.17.0.3<0>")]
    grade = at_init(nccl_failure(), NONE_YET, bridged)
    assert grade is not None and grade.action is Action.FAIL_JOB
    one_host = old_interface_line("trainer-a", "eth0:172.17.0.2<0>")
    assert at_init(nccl_failure(), NONE_YET, one_host) is None               # one host: its containers share it
    routable = [*old_interface_line("trainer-a", "eth0:172.18.0.2<0>"), *old_interface_line("trainer-b", "eth0:172.18.0.3<0>")]
    assert at_init(nccl_failure(), NONE_YET, routable) is None               # not the default bridge: a network
    second = [*socket_line("srv1", "eth0:10.0.0.1<0>", "docker0:172.17.0.1<0>"),
              *socket_line("srv2", "eth0:10.0.0.2<0>", "docker0:172.17.0.1<0>")]
    assert at_init(nccl_failure(), NONE_YET, second) is None                 # a routable first interface
    listed_second = [f for h, a in (("trainer-a", "1"), ("trainer-b", "2")) for f in (
        *old_interface_line(h, f"eth0:10.0.0.{a}<0>"), *old_interface_line(h, "docker0:172.17.0.1<0>"))]
    assert at_init(nccl_failure(), NONE_YET, listed_second) is None          # 2.4: the first line is the first


def bootstrap_line(host: str, address: str) -> list[Finding]:
    return host_line(host, f"Bootstrap : Using {address}", "nccl.bootstrap_interface_in_use")


def test_the_bootstrap_interface_line_is_read_as_the_socket_one():
    """NCCL's bootstrap searches its interface as its socket transport does (src/bootstrap.cc), and logs
    only ``Bootstrap : Using if:addr<0>`` when the job runs over NET/IB: two hosts on docker0's
    address, or on one address alike, cannot reach each other through it."""
    both = [*bootstrap_line("srv1", "docker0:172.17.0.1<0>"), *bootstrap_line("srv2", "docker0:172.17.0.1<0>")]
    grade = at_init(hang(), NONE_YET, both)
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE
    routable = [*bootstrap_line("srv1", "eth0:10.0.0.1<0>"), *bootstrap_line("srv2", "eth0:10.0.0.2<0>")]
    assert at_init(hang(), NONE_YET, routable) is None
    assert at_init(hang(), NONE_YET, bootstrap_line("srv1", "docker0:172.17.0.1<0>")) is None   # one host
