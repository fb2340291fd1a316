"""A torchrun rendezvous that failed after its c10d store server found its port in use
(ftwatch.policy.porttaken): the agent went on as a client of another job's store on that port, so
the launch's fixed port is the cause (user_code, fail_job), not a transient to restart."""

from __future__ import annotations

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.porttaken import port_taken
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
JOB = "ddp"
BIND = ["[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).",
        "[W socket.cpp:426] [c10d] The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use)."]
CLOSED = "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"


def logged(t: float, *lines: str) -> list[Finding]:
    o = Origin("slurm-1", None, JOB, "gpu-node-17", "stdout", "file")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def binds() -> list[Finding]:
    found = logged(0.0, *BIND)
    assert found and all(f.failure_class is not FailureClass.INFO for f in found)
    return found


def decide(tmp_path, evidence: list[Finding], notices: list[Finding]):
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", JOB), JOB)
    return pol.decide(Incident(evidence[0], tuple(evidence), 1, frozenset({"slurm-1"}), 0,
                               notices=tuple(notices)), T0 + 700)


def test_a_closed_rendezvous_after_the_stores_port_was_taken_is_the_launchs(tmp_path):
    closed = logged(600.0, CLOSED)
    d = decide(tmp_path, closed, binds())
    assert d.root_cause.rule_id == "rendezvous.store_port_taken", d.policy_clause
    assert (d.action, d.root_cause.failure_class) == (Action.FAIL_JOB, FailureClass.USER_CODE)


def test_without_the_bind_failure_a_closed_rendezvous_stays_fallout_to_restart(tmp_path):
    d = decide(tmp_path, logged(600.0, CLOSED), [])
    assert d.action is Action.RESTART_JOB


def test_a_bind_failure_after_the_rendezvous_failed_or_a_real_error_beside_it_reads_nothing():
    closed = logged(600.0, CLOSED)
    assert port_taken(closed, logged(900.0, *BIND)) is None          # the port was taken only later
    oom = logged(590.0, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert oom and port_taken(sorted(oom + closed, key=lambda f: f.time), binds()) is None   # the program's own error


def test_a_bind_failure_of_another_server_is_not_the_rendezvous_store():
    other = logged(0.0, "OSError: [Errno 98] Address already in use")
    assert port_taken(logged(600.0, CLOSED), other) is None
