"""A collective stall beside an NVLink Xid of the waiting ranks' node (ftwatch.policy.devicefault rule 6,
R7 rule 10): the Xid explains the stall and isolates the node, although a Nonfatal NVLink5 Xid alone is a
notice (ftwatch.rules.faultcodes). Another node's Xid, a non-NVLink Xid, or a rank's own error pair nothing."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
NONFATAL = ("NVRM: Xid (PCI:0000:1b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (0x0409a0c2 0x00000008 "
            "0x00000001 0x00000000 0x00100000 0x00000004)")
FATAL = "NVRM: Xid (PCI:0000:66:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040 0x0 0x0 0x0 0x0)"
XID63 = "NVRM: Xid (PCI:0000:1b:00): 63, pid=0, Row Remapper: New row (0x51c4) marked for remapping, reset gpu to activate."


def host(t: float, line: str, node: str = "node-0") -> list[Finding]:
    o = Origin(f"host/{node}", None, "dev", node, "kernel", "host")
    return ENGINE.feed(o, f"{line}\n".encode(), T0 + t, final=True)


def timeout(rank: int, t: float, node: str = "node-0") -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "dev", node, "stderr", "process")
    line = (f"[rank{rank}]:[E622 18:12:14.300000000 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=88, OpType=_ALLGATHER_BASE, NumelIn=1, NumelOut=8, Timeout(ms)=600000) "
            "ran for 600031 milliseconds before timing out.")
    return ENGINE.feed(o, f"{line}\n".encode(), T0 + t, final=True)


def test_a_nonfatal_nvlink5_xid_alone_is_a_notice_and_a_fatal_one_isolates():
    [nonfatal] = host(0.0, NONFATAL)
    assert (nonfatal.action, nonfatal.failure_class) == (Action.NONE, FailureClass.INFO)
    assert analyse([nonfatal]).root_cause is None or analyse([nonfatal]).root_cause.action is Action.NONE
    [fatal] = host(0.0, FATAL)
    assert fatal.action is Action.ISOLATE_NODE


def test_every_rank_timed_out_beside_an_nvlink_xid_of_their_node_isolates_it():
    found = [*host(0.0, NONFATAL), *timeout(0, 600.0), *timeout(1, 601.0)]
    rc = analyse(found).root_cause
    assert rc is not None and (rc.rule_id, rc.action, rc.failure_class) == (
        "xid.145", Action.ISOLATE_NODE, FailureClass.HARDWARE_NODE)
    assert "nccl#2241" in rc.source


def test_another_nodes_nvlink_xid_or_a_non_nvlink_xid_explains_no_stall():
    for xid in (host(0.0, NONFATAL, node="node-9"), host(0.0, XID63)):
        rc = analyse([*xid, *timeout(0, 600.0), *timeout(1, 601.0)]).root_cause
        assert rc is not None and rc.rule_id != "xid.145" and rc.action is not Action.ISOLATE_NODE
