"""A failed connect to a loopback address in a job that spans hosts (ftwatch.policy.loopback, issue 12):
loopback never leaves its host (RFC 1122 3.2.1.3, RFC 4291 2.5.3), so before any progress it is the
launch's configuration; on one host, with the hosts unknown, or after progress it keeps its grade."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.initphase import NONE_YET, at_init
from ftwatch.policy.loopback import job_hosts, loopback_target
from ftwatch.policy.policy import Incident, Policy
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
JOB = "loop"
FLAGS = {"fault_tolerant_policy": "ExitCodeAndErrorMsg", "enable_job_restart": True, "max_num_of_job_restart": 3}
GLOO = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:38117: Connection refused"
STORE = "TimeoutError: The client socket has timed out after 1800s while trying to connect to (127.0.0.1, 47102)."


def logged(line: str, node: str, rank: int, t: float = T0) -> list[Finding]:
    origin = Origin(f"rank{rank}", rank, JOB, node, "stderr", "process")
    text = f"Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n{line}\n"
    found = ENGINE.feed(origin, text.encode(), t, final=True)
    assert found and found[-1].failure_class is FailureClass.RETRYABLE_INFRA, [f.rule_id for f in found]
    return found


def test_the_target_of_each_librarys_connect():
    assert loopback_target(GLOO) == "127.0.1.1"
    assert loopback_target(STORE) == "127.0.0.1"
    assert loopback_target("NCCL WARN socketStartConnect: Connect to 127.0.0.1<41327> failed : Connection refused")
    assert loopback_target("The client socket has failed to connect to [::1]:29500 (errno: 111 - Connection refused).")
    assert loopback_target("failed to connect to [::ffff:127.0.0.1]:29500 (errno: 110 - Connection timed out).")
    assert loopback_target("trying to connect to (localhost, 29500)") == "localhost"
    assert loopback_target(GLOO.replace("127.0.1.1", "10.0.0.2")) is None
    assert loopback_target("Connect to 10.1.2.3<41327> failed : Connection refused") is None


def test_the_hosts_come_from_the_nodes_and_nccls_prefix_not_the_implicit_ones():
    found = [*logged(GLOO, "replay", 0), *logged(GLOO, "localhost", 1)]
    assert job_hosts(found) == frozenset()
    assert job_hosts([*logged(GLOO, "box-a", 0), *logged(GLOO, "box-b", 2)]) == {"box-a", "box-b"}
    nccl = "box-a:4410:4493 [0] misc/socket.cc:484 NCCL WARN socketPollConnect: connect to 127.0.0.1<43261> failed : Connection refused"
    one_host_two_names = [*logged(GLOO, "box-a.cluster.local", 0), *ENGINE.feed(
        Origin("rank1", 1, JOB, "box-a.cluster.local", "stderr", "process"), f"{nccl}\n".encode(), T0, final=True)]
    assert len(job_hosts(one_host_two_names)) == 1      # the node's FQDN and NCCL's short name: one host


def test_a_loopback_connect_across_two_hosts_before_progress_fails_the_job(tmp_path: Path):
    for line in (GLOO, STORE):
        found = [*logged(line, "box-a", 0), *logged(line, "box-b", 2)]
        grade = at_init(found[-1], NONE_YET, found)
        assert grade is not None and grade.failure_class is FailureClass.USER_CODE and "RFC 1122" in grade.source
        policy = Policy(Config().with_policy(**FLAGS).policy, BudgetStore(tmp_path / f"{len(line)}.json", JOB), JOB)
        d = policy.decide(Incident(found[-1], tuple(found), 2, frozenset(), 0, progress_at=NONE_YET), T0 + 10)
        assert d.action is Action.FAIL_JOB, d.policy_clause


def test_one_host_unknown_hosts_or_progress_keep_the_retryable_grade():
    one = [*logged(STORE, "box-a", 0), *logged(STORE, "box-a", 1)]
    assert at_init(one[-1], NONE_YET, one) is None           # on its host loopback does lead to the peer
    unknown = [*logged(GLOO, "replay", 0), *logged(GLOO, "replay", 2)]
    assert at_init(unknown[-1], NONE_YET, unknown) is None
    two = [*logged(GLOO, "box-a", 0, T0 + 50), *logged(GLOO, "box-b", 2, T0 + 50)]
    assert at_init(two[-1], T0, two) is None                  # it trained before
    routable = [*logged(GLOO.replace("127.0.1.1", "10.0.0.2"), "box-a", 0),
                *logged(GLOO.replace("127.0.1.1", "10.0.0.2"), "box-b", 2)]
    assert at_init(routable[-1], NONE_YET, routable) is None
