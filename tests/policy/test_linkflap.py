"""A port that went down and came back is a flap, not a broken node (ftwatch.policy.linkflap, R7 rule 17):
its port errors become notices, the job's own errors decide; a port that stays down, a recovery of
another port, or a port that went down FLAP_LIMIT times keeps the node's isolation."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.linkflap import FLAP_LIMIT, recovered_flaps
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
DOWN = "node2:31877:31960 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : {port} Got async error event: port error"
UP = "node2:31877:31960 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : {port} Got async error event: port active"
RETRY = ("node2:31877:31990 [0] transport/net_ib.cc:2451 NCCL WARN NET/IB: Got completion from peer 10.6.0.11<40122> "
         "with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.6.0.12 remoteGids ::ffff:10.6.0.11")


def logged(t: float, *lines: str, rank: int = 4) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "dev", "node2", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def decide(found: list[Finding], tmp_path: Path):
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", "dev"), "dev")
    return pol.decide(Incident(found[0], tuple(found), 8, frozenset(), 0), T0 + 60)


def test_a_port_that_came_back_is_a_notice_and_the_jobs_errors_decide(tmp_path: Path):
    flap = logged(0.0, DOWN.format(port="mlx5_1:1"), UP.format(port="mlx5_1:1"))
    regraded = recovered_flaps(flap)
    assert regraded[0].severity is Severity.WARNING and regraded[0].failure_class is FailureClass.RETRYABLE_INFRA
    assert analyse(flap).real == ()
    d = decide(flap, tmp_path)       # the run went on: nothing is acted on (none since round 11: the notice's
    assert d.action is Action.NONE and d.root_cause is None   # own grade is none, MindCluster's NotHandleFault)
    died = [*flap, *logged(5.0, RETRY)]
    d = decide(died, tmp_path / "2")
    assert d.action is Action.RESTART_JOB and d.root_cause.failure_class is FailureClass.RETRYABLE_INFRA


def test_a_port_down_for_good_another_ports_recovery_or_five_downs_keep_the_isolation(tmp_path: Path):
    """Counterexamples: no port active; port active of another port; FLAP_LIMIT downs (MindCluster)."""
    stays = logged(0.0, DOWN.format(port="mlx5_1:1"))
    other = logged(0.0, DOWN.format(port="mlx5_1:1"), UP.format(port="mlx5_2:1"))
    flapping = logged(0.0, *[x.format(port="mlx5_1:1") for _ in range(FLAP_LIMIT) for x in (DOWN, UP)])
    for i, found in enumerate((stays, other, flapping)):
        rc = analyse(found).root_cause
        assert rc is not None and rc.rule_id == "nccl.ib_async_port_error"
        assert rc.failure_class is FailureClass.HARDWARE_NODE
        assert decide(found, tmp_path / str(i)).action is Action.ISOLATE_NODE


def test_a_flap_the_workers_died_of_with_only_fallout_restarts(tmp_path: Path):
    """The notice opened the incident, but the workers then failed (only fallout): D2 reads it as
    retryable, not as a notice the workers run on."""
    remote = ("RuntimeError: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5")
    found = [*logged(0.0, DOWN.format(port="mlx5_1:1"), UP.format(port="mlx5_1:1")), *logged(5.0, remote)]
    assert analyse(found).fallout_only
    d = decide(found, tmp_path)
    assert d.action is Action.RESTART_JOB
