"""Xid 154, the driver's recovery action (kernel_vocab.tsv ``gpu.xid154_reset_required``): a reset or
reboot it requires takes the node out of service; no action, drain P2P or an IMEX recovery leaves the
decision to the Xid it refers to (gpu_xid.tsv's row for 154: ignore)."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
LINE = "[ 9120.551203] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to {}"


def finding(line: str):
    [f] = ENGINE.feed(Origin("host", None, "j", "node-1", "kern", "file"), f"{line}\n".encode(), 1.0, final=True)
    return f


@pytest.mark.parametrize("to", ["0x1 (GPU Reset Required)", "0x2 (Node Reboot Required)", "0x1 (PF FLR)",
                                "0x4 (Drain and Reset)", "0x2 (OS Reboot)"])
def test_a_required_reset_or_reboot_isolates_the_node_over_the_xid_table_row(to: str):
    f = finding(LINE.format(to))
    assert f.rule_id == "gpu.xid154_reset_required"
    assert f.action is Action.ISOLATE_NODE and f.failure_class is FailureClass.HARDWARE_NODE


@pytest.mark.parametrize("to", ["0x0 (None)", "0x3 (Drain P2P)"])
def test_no_reset_leaves_the_xid_table_row(to: str):
    f = finding(LINE.format(to))
    assert f.rule_id == "xid.154" and f.action < Action.RESTART_INSTANCE


def _at(line: str, t: float, instance: str = "host", node: str = "node-1"):
    return ENGINE.feed(Origin(instance, None, "j", node, "kern", "file"), f"{line}\n".encode(), t, final=True)


XID13 = ("[ 9120.551100] NVRM: Xid (PCI:0000:01:00): 13, pid=2231, name=python3, Graphics Exception: "
         "ESR 0x514648=0x1000f 0x514650=0x0 0x514644=0xd3eff2 0x51464c=0x17f")


def test_the_drivers_required_reset_of_the_same_gpu_becomes_the_root_cause():
    """Xid 13 alone is an application error (restart in place); the driver's later Xid 154 on that
    GPU says a restart there fails until the GPU is reset."""
    first = _at(XID13, 1.0)
    assert first[0].rule_id == "xid.13" and first[0].action < Action.ISOLATE_NODE
    assert analyse(first).root_cause == first[0]
    reset = _at(LINE.format("0x1 (GPU Reset Required)"), 1.1)
    an = analyse([*first, *reset])
    assert an.root_cause == reset[0] and an.root_cause.action is Action.ISOLATE_NODE
    assert an.real[1:] == tuple(first)


def test_a_required_reset_of_another_gpu_or_node_leaves_the_root_cause():
    first = _at(XID13, 1.0)
    other_gpu = _at(LINE.format("0x1 (GPU Reset Required)").replace("0000:01:00", "0000:81:00"), 1.1)
    assert analyse([*first, *other_gpu]).root_cause == first[0]
    other_node = _at(LINE.format("0x1 (GPU Reset Required)"), 1.1, instance="host-2", node="node-2")
    assert analyse([*first, *other_node]).root_cause == first[0]
