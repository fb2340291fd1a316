"""The recovery policies through the real CLI: a config's ModelArts annotations and the C4D flags
reach the decision `ftwatch replay` prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def replay(*args: str, cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "replay", "--json", *args], cwd=cwd,
                          capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_modelarts_annotations_in_the_config_choose_in_place_recovery(tmp_path):
    (tmp_path / "ftwatch.yaml").write_text('modelarts:\n  annotations:\n    "fault-tolerance/job-retry-num": "4"\n')
    (tmp_path / "rank0.log").write_text("2026-11-21 09:36:00 step 10 loss 1.0\n"
                                        "2026-11-21 09:36:03 [ERROR] DRV device 0 fault code 0x80CF8003\n")
    d = replay("--config", "ftwatch.yaml", "rank0.log", cwd=tmp_path)
    assert (d["action"], d["restarts_used"], d["restarts_left"]) == ("restart_in_place", 0, 4)
    assert d["policy_clause"].startswith("D4 in-place recovery: self-healable fault npu.80CF8003")


@pytest.mark.slow
def test_a_c4d_error_isolates_the_node_it_names(tmp_path):
    (tmp_path / "aimaster.log").write_text(
        "2026-11-21 09:36:00 aimaster started\n"
        "2026-11-21 09:36:05 [C4D] Error RankCommHang rank=1 node=gpu-node-7 duration=181s times=18\n")
    d = replay("--enable-job-restart=True", "--enable-job-hang-detection=True", "--enable-c4d-hang-detection=True",
               "aimaster.log", cwd=tmp_path)
    assert d["action"] == "isolate_node" and d["target"]["node"] == "gpu-node-7" and d["target"]["rank"] == 1
    assert d["policy_clause"].startswith("R8 C4D Error RankCommHang on node gpu-node-7 rank 1")
