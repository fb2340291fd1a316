"""Xid 154, the driver's recovery action (kernel_vocab.tsv ``gpu.xid154_reset_required``): a reset or
reboot it requires takes the node out of service; no action, drain P2P or an IMEX recovery leaves the
decision to the Xid it refers to (gpu_xid.tsv's row for 154: ignore)."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
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
