"""Flushed RDMA work completions read across ranks (ftwatch.policy.verbs): a flush at both ends of a
connection with nothing before it is the node's PCIe path (NVIDIA/nccl#1353); a flush after another
completion error, a peer's death, or seen from one end only stays fallout."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import analyse
from ftwatch.policy.verbs import FLUSH_RULES, FLUSHED_ALONE
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
A, B = "::ffff:10.0.0.11", "::ffff:10.0.0.12"


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "verbs", f"node-{rank // 8}", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def completion(status: int, local: str, remote: str, vendor: int = 249) -> str:
    return (f"gpu-a:51029:51488 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
            f"{remote[7:]}<53127> with status={status} opcode=0 len=0 vendor err {vendor} (Recv) "
            f"localGid {local} remoteGids{remote}")


def watchdog(rank: int) -> str:
    # stamped on T0's day, after the (unstamped) completions fed at T0 + 1 s: c10's stamp is read
    return (f"[rank{rank}]:[E1121 00:00:01.864589111 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) "
            f"Rank {rank}] Process group watchdog thread terminated with exception: NCCL error: remote process "
            "exited or there was a network error, NCCL version 2.21.5")


def test_the_flush_rules_exist_and_stay_fallout():
    rules = {r.id: r for r in load_rules([], builtin=True)}
    assert FLUSH_RULES <= rules.keys()
    assert all(rules[r].failure_class is FailureClass.FALLOUT for r in FLUSH_RULES)


def test_flushes_at_both_ends_with_nothing_before_them_isolate_the_first_reporter(tmp_path: Path):
    found = [*logged(9, 1.0, completion(5, B, A), watchdog(9)), *logged(2, 1.5, completion(5, A, B), watchdog(2))]
    an = analyse(found)
    assert an.root_cause is not None and an.root_cause.rule_id == FLUSHED_ALONE
    assert an.root_cause.rank == 9 and not an.fallout_only
    assert an.root_cause.failure_class is FailureClass.HARDWARE_NODE
    assert an.root_cause.action is Action.ISOLATE_NODE and an.root_cause.severity is Severity.CRITICAL
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", "verbs"), "verbs")
    d = pol.decide(Incident(found[0], tuple(found), 16, frozenset({"worker-9"}), 0), T0 + 3)
    assert d.action is Action.ISOLATE_NODE and d.root_cause.rule_id == FLUSHED_ALONE


def test_flushes_from_one_end_only_stay_fallout():
    """The peer may have died out of sight: nothing says the host side failed."""
    found = [*logged(0, 1.0, completion(5, B, A), completion(5, B, A), watchdog(0))]
    an = analyse(found)
    assert an.fallout_only and an.root_cause is not None and an.root_cause.rule_id in FLUSH_RULES
    assert an.fallout_class is FailureClass.RETRYABLE_INFRA


def test_a_transport_error_before_the_flushes_is_the_root_cause():
    """NVIDIA/nccl#1405, #1814: status=12 (retry exceeded) first, then the QP's flushed requests."""
    found = [*logged(9, 1.0, completion(12, B, A, vendor=129), completion(5, B, A)),
             *logged(2, 1.5, completion(5, A, B))]
    an = analyse(found)
    assert an.root_cause is not None and an.root_cause.rule_id == "rdma.ib_retry_exceeded"


def test_a_peer_killed_by_a_signal_outranks_the_flushes():
    kill = exit_finding(ProcessExit(Origin("worker-5", 5, "verbs", "node-0", "stderr", "process"), 105, None, 9,
                                    T0 + 4.0), ExitCodeTable.load(), seq=400)
    assert kill is not None
    found = [*logged(9, 1.0, completion(5, B, A)), *logged(2, 1.5, completion(5, A, B)), kill]
    assert analyse(found).root_cause == kill
