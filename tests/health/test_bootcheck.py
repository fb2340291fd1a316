"""Bootcheck checks and the fault-tolerance log (H1): real files, real PATH look-ups, a real store."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import time

import pytest

from ftwatch.events import FailureClass
from ftwatch.health import bootcheck
from ftwatch.health.bootcheck import ascend_check, disk_test, nvidia_check, run_checks
from ftwatch.health.ftlog import CheckResult, FaultToleranceLog, format_block, skipped, verdict
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sinks.sqlite import SqliteStore


def test_disk_test_writes_reads_back_and_cleans_up(tmp_path):
    r = disk_test(tmp_path, 1 << 20)
    assert r.status == "ok"
    assert r.lines[0] == f"DiskTest {tmp_path}/.ftwatch_disktest: Succeed"
    assert r.lines[1].startswith(f"{tmp_path} RW TEST: ") and r.lines[1].endswith("/s")
    assert r.fields["read_mb_s"] > 0 and r.fields["write_mb_s"] > 0
    assert list(tmp_path.iterdir()) == []


def test_a_slow_disk_only_warns(tmp_path):
    r = disk_test(tmp_path, 1 << 16, min_mb_s=1e12)      # no disk writes a petabyte a second
    assert r.status == "warn" and not r.blocks
    assert r.failure_class is FailureClass.STRAGGLER and r.action.label == "notify"


def test_an_unwritable_path_fails_without_isolating(tmp_path):
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    r = disk_test(afile, 4096)
    assert r.status == "fail" and "Failed" in r.lines[0]
    assert r.action.label == "notify" and not r.blocks


def test_missing_nvml_package_is_skipped_not_failed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)        # import pynvml -> ImportError
    r = nvidia_check()
    assert r.status == "skipped" and r.lines == ("GPU Check: skipped: pynvml (nvidia-ml-py) is not installed",)


def _nvml_driver_present() -> bool:
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_no_nvidia_driver_is_skipped_not_failed():
    """nvidia-ml-py is a dependency; on a machine without the NVML library (no driver) the check
    says why it skipped, and never fails."""
    r = nvidia_check()
    if _nvml_driver_present():                 # pragma: no cover - a GPU machine
        assert r.status == "ok" and r.lines[0].startswith("GPU")
    else:
        assert r.status == "skipped" and r.lines[0].startswith("GPU Check: skipped: NVML is not available here")


def test_missing_npu_smi_is_skipped(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    r = ascend_check()
    assert r.status == "skipped" and r.lines == ("NPU Check: skipped: npu-smi is not on the PATH "
                                                 "(not an Ascend machine)",)


NPU_SMI = """#!/bin/sh
cat <<'TABLE'
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.0                   Version: 23.0.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.4        40                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | {health}      | 90.1        41                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
TABLE
"""


@pytest.mark.parametrize("health, status", [("OK", "ok"), ("Alarm", "fail")])
def test_npu_smi_table_is_read(monkeypatch, tmp_path, health, status):
    exe = tmp_path / "npu-smi"
    exe.write_text(NPU_SMI.format(health=health))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    r = ascend_check()
    assert r.status == status
    assert r.lines[:2] == ("NPU Number: 2", "NPU Type: 910B3")
    if status == "fail":
        assert r.blocks and r.failure_class is FailureClass.HARDWARE_NODE


def _python_without_torch(tmp_path):
    """A real interpreter whose ``import torch`` raises ImportError (a ``torch`` package that
    says it is not there shadows the real one)."""
    fake = tmp_path / "shadow" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={fake.parent}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_torch_absent_is_skipped(tmp_path):
    """An interpreter without torch: the versions and the all-reduce are skipped, nothing fails."""
    results = bootcheck.torch_checks(2, 1 << 20, timeout=5, python=str(_python_without_torch(tmp_path)))
    assert [r.status for r in results] == ["skipped"]
    assert "torch is not installed" in results[0].lines[0] and "No module named 'torch'" in results[0].lines[0]


def test_an_agent_that_dies_is_a_failure_not_skipped(tmp_path):
    """An interpreter that ends without answering (a crash in the driver) is no absent package."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    python.chmod(0o755)
    results = bootcheck.torch_checks(2, 1 << 20, timeout=5, python=str(python))
    assert [r.status for r in results] == ["fail"] and results[0].blocks
    assert results[0].lines[0].startswith("Versions Check: Failed: torch / CUDA cannot run here")


def test_a_missing_interpreter_is_skipped(tmp_path):
    results = bootcheck.torch_checks(2, 1 << 20, timeout=5, python=str(tmp_path / "no-python"))
    assert [r.status for r in results] == ["skipped"] and "cannot start" in results[0].lines[0]


def test_the_log_block_and_the_store(tmp_path):
    store = SqliteStore(tmp_path / "ftwatch.db")
    recorder = Recorder(store, out=open(os.devnull, "w"))
    log = FaultToleranceLog(tmp_path, recorder, "job1", "node-a")
    t = time.mktime((2024, 8, 5, 18, 11, 14, 0, 0, -1))
    ok = CheckResult("disk", "ok", ("DiskTest /mnt/x/.ftwatch_disktest: Succeed",), time=t + 4)
    bad = CheckResult("gpu", "fail", ("GPU Number: 1", "GPU Check: Failed: GPU 0: GPU is lost"), time=t + 13,
                      failure_class=FailureClass.HARDWARE_NODE, action=bootcheck.Action.ISOLATE_NODE)
    npu = dataclasses.replace(skipped("npu", "no npu-smi"), time=t + 13)
    findings = log.write("Bootchecking", t, [ok, bad, npu], "Check Finished.",
                         attempt=0, ended=t + 37)
    text = log.path.read_text()
    assert text.splitlines() == [
        "2024-08-05 18:11:14 Start to run Bootchecking...",
        "2024-08-05 18:11:18 DiskTest /mnt/x/.ftwatch_disktest: Succeed",
        "2024-08-05 18:11:27 GPU Number: 1",
        "2024-08-05 18:11:27 GPU Check: Failed: GPU 0: GPU is lost",
        "2024-08-05 18:11:27 NPU Check: skipped: no npu-smi",
        "2024-08-05 18:11:51 Check Finished.",
    ]
    assert [f.rule_id for f in findings] == ["health.gpu"]
    assert findings[0].action.label == "isolate_node" and "Failed" in findings[0].line
    events = [e for e in store.events("job1") if e["kind"] == "bootcheck"]
    assert len(events) == 1 and events[0]["detail"]["verdict"] == "blocked"
    assert [c["status"] for c in events[0]["detail"]["checks"]] == ["ok", "fail", "skipped"]
    assert [f["rule_id"] for f in store.findings_for("job1")] == ["health.gpu"]
    assert verdict([ok]) == "ok" and verdict([ok, skipped("x", "y")]) == "ok"


def test_format_block_orders_lines_as_given():
    r = CheckResult("cpu", "ok", ("CPU Number: 2",), time=100.0)
    block = format_block("Troubleshooting", 99.0, [r], "Check Finished, task will be restarted.", 101.0)
    lines = block.splitlines()
    assert lines[0].endswith("Start to run Troubleshooting...") and lines[-1].endswith("task will be restarted.")


@pytest.mark.slow
def test_run_checks_with_a_real_all_reduce(tmp_path):
    pytest.importorskip("torch")
    results = run_checks([tmp_path], 1 << 20, 0.0, world=2, allreduce=True, allreduce_bytes=1 << 20,
                         timeout=60)
    by = {r.check: r for r in results}
    assert by["disk"].status == "ok" and by["versions"].status == "ok"
    assert any(line.startswith("PyTorch Version: 2.") for line in by["versions"].lines)
    if not by["versions"].fields["cuda_available"]:      # a CPU machine says why, as every check does
        assert "NCCL Version: skipped: CUDA is not available" in by["versions"].lines
        if by["versions"].fields["cuda"] is None:
            assert by["versions"].lines[0] == "CUDA Version: skipped: this torch is built without CUDA"
    assert by["allreduce"].status == "ok", by["allreduce"].lines
    assert by["allreduce"].lines[0] == "AllReduce Check: Succeed"
    assert by["allreduce"].fields["busbw_gbs"] > 0
    assert "Bus Bandwidth Average" in by["allreduce"].lines[1]
