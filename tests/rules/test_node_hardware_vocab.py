"""A GPU missing from its node, or a node cut off from its network, is a node fault in every tool's words
(issue 12, round 6).

The driver that cannot initialise a GPU (``RmInitAdapter failed``, with or without the bus id
older drivers leave out, and the OS layer's ``rm_init_adapter failed for device bearing minor
number N``), Slurm's registration check (``gres/gpu count reported lower than configured (k < n)``
with k > 0: some GPUs seen, some gone; 0 is how a slurmd without NVML or gres.conf registers) and
lspci's ``(rev ff)`` (config space reads all ones: the card is off the bus) all isolate the node;
so does a bond with no active member left (one member down is a degraded bond: notify).
Sources in ``ftwatch/rules/packs/kernel_vocab.tsv``.
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
NODE = Origin("node-a", None, "job-7", "node-a", "kern.log", "file")


def _findings(line: str):
    return Engine(BUILTIN).feed(NODE, f"{line}\n".encode(), 1_795_253_763.0, final=True)


@pytest.mark.parametrize(("line", "rule_id"), [
    ("[ 5.432100] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x65:1482)",
     "nvrm.rm_init_adapter_failed"),
    ("Mar 31 06:01:17 n26 kernel: [   38.773115] NVRM: RmInitAdapter failed! (0x26:0xffff:1127)",
     "nvrm.rm_init_adapter_failed_legacy"),
    ("[   38.773764] NVRM: rm_init_adapter failed for device bearing minor number 3",
     "nvrm.rm_init_adapter_failed_legacy"),
    ("gres/gpu count reported lower than configured (7 < 8)  slurm  2023-05-04T09:12:32 dagobah",
     "slurm.gres_gpu_count_below_configured"),
    ("   State=DOWN+DRAIN+INVALID_REG Reason=gres/gpu count reported lower than configured (3 < 4) [slurm@2026-07-28T17:13:24]",
     "slurm.gres_gpu_count_below_configured"),
    ("1c:00.0 VGA compatible controller: NVIDIA Corporation TU102GL [Quadro RTX 6000/8000] (rev ff)",
     "pci.gpu_config_space_all_ones"),
    ("0000:3b:00.0 3D controller [0302]: NVIDIA Corporation GA100 [A100 SXM4 80GB] [10de:20b2] (rev ff)",
     "pci.gpu_config_space_all_ones"),
])
def test_a_missing_gpu_isolates_the_node(line, rule_id):
    [finding] = _findings(line)
    assert (finding.rule_id, finding.failure_class, finding.action) == (
        rule_id, FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)


@pytest.mark.parametrize("line", [
    # slurmd found no GPU at all: a slurmd built without NVML or a gres.conf without File= lines
    "Reason=gres/gpu count reported lower than configured (0 < 4) [slurm@2026-07-28T17:13:24]",
    "1c:00.0 VGA compatible controller: NVIDIA Corporation TU102GL [Quadro RTX 6000/8000] (rev a1)",
    "00:1f.4 SMBus: Intel Corporation Device 7a23 (rev ff)",   # not a GPU or accelerator
    "[    5.110203] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  440.64  Fri Feb 21 01:17:26 UTC 2020",
])
def test_lines_that_name_no_lost_gpu_are_no_node_fault(line):
    assert [f for f in _findings(line) if f.action == Action.ISOLATE_NODE] == []


def test_a_bond_with_no_active_member_isolates_the_node_and_one_member_down_does_not():
    [finding] = _findings("[Thu Jun 13 10:41:28 2026] bond1: now running without any active interface!")
    assert (finding.rule_id, finding.action) == ("bonding.no_active_interface", Action.ISOLATE_NODE)
    for line in ("[Thu Jun 13 10:41:27 2026] bond1: (slave ens2f1np1): link status definitely down, disabling slave",
                 "[Thu Jun 13 10:41:27 2026] mlx5_core 0000:3b:00.1 ens2f1np1: Link down"):
        assert [f for f in _findings(line) if f.action == Action.ISOLATE_NODE] == []
