"""Node hardware lines graded by their sources (kernel_vocab.tsv, stacks_vocab.tsv): warning-level
health findings notify (SPEC R8: DCGM's health-watch WARNING, an NVLink nvidia-smi lists as inactive, a
GPU nvidia-smi lists with its hardware thermal or power-brake slowdown active (NVML's clocks event reasons), a
NIC transmit queue the kernel's watchdog found stalled); wedged or dead devices isolate (a CPU soft
lockup, mlx4's catastrophic error, a Tenstorrent card with no device node)."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def graded(line: str) -> list[tuple[str, FailureClass, Action]]:
    found = ENGINE.feed(Origin("node"), f"{line}\n".encode(), 1000.0, final=True)
    return [(f.rule_id, f.failure_class, f.action) for f in found]


NOTIFY = (FailureClass.HARDWARE_NODE, Action.NOTIFY)
ISOLATE = (FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)


@pytest.mark.parametrize("line, rule_id, grade", [
    ("2026-01-09 14:07:31.204 ERROR [1514002:1514004] [[Health]] Detected a WARNING in health system Power: "
     "'Detected clocks event due to power violation in GPU 0.", "dcgm.health_watch_warning", NOTIFY),
    ("\t Link 5: <inactive>", "gpu.nvlink_link_inactive", NOTIFY),
    ("        HW Thermal Slowdown               : Active", "gpu.hw_thermal_slowdown", NOTIFY),
    ("2026-02-14T09:52:02Z gpu-07 GPU 00000004:00:00.0    HW Power Brake Slowdown           : Active",
     "gpu.hw_thermal_slowdown", NOTIFY),
    ("[ 812.1] mlx5_core 0000:3b:00.0 eth0: NETDEV WATCHDOG: CPU: 23: transmit queue 11 timed out 5376 ms",
     "net.tx_timeout", NOTIFY),
    ("[ 812.1] NETDEV WATCHDOG: ens3f0 (ice): transmit queue 4 timed out", "net.tx_timeout", NOTIFY),
    ("[ 840.2] watchdog: BUG: soft lockup - CPU#7 stuck for 26s! [nv_queue:1122]", "os.soft_lockup", ISOLATE),
    ("[ 840.2] BUG: soft lockup - CPU#7 stuck for 23s! [python3:4411]", "os.soft_lockup", ISOLATE),
    ("[ 1205.602207] mlx4_core 0000:04:00.0: mlx4_restart_one: ERROR: mlx4_load_one failed, pci_name=0000:04:00.0, "
     "err=-5", "mlx4.device_fatal", ISOLATE),
    ("ls: cannot access '/dev/tenstorrent': No such file or directory", "tt.device_node_missing", ISOLATE),
])
def test_each_line_carries_its_sources_grade(line, rule_id, grade):
    assert (rule_id, *grade) in graded(line), graded(line)


@pytest.mark.parametrize("line", [
    "[[Health]] Detected a FAILURE in health system Memory: 'A volatile double-bit ECC error ...'",
    "\t Link 5: 25.781 GB/s",
    "        HW Thermal Slowdown               : Not Active",
    "        HW Slowdown                       : Active",      # NVML: also during a P-state or clock change
    "        SW Power Cap                      : Active",
    "[ 1205.602131] mlx4_core 0000:04:00.0: device was reset successfully",
    "DeviceOpenFailed { id: 0, source: Os { code: 13, kind: PermissionDenied, message: \"Permission denied\" } }",
    "kernel.softlockup_panic = 0",
])
def test_near_misses_are_not_these_rules(line):
    ids = {"dcgm.health_watch_warning", "gpu.nvlink_link_inactive", "mlx4.device_fatal", "tt.device_node_missing",
           "os.soft_lockup", "net.tx_timeout", "gpu.hw_thermal_slowdown"}
    assert not [g for g in graded(line) if g[0] in ids], graded(line)
