"""Bootcheck verdicts on faults (H1, seed 001 "硬件错误(如掉卡)将阻断任务"): what is a hardware fault,
what only warns, and what is merely absent.

Real files, real child processes (the agents), real ``npu-smi``-shaped output; NVML is a fake
module injected with ``sys.modules`` (no GPU here), shaped like nvidia-ml-py's (``NVMLError``
with ``value``, the ``NVML_ERROR_*`` codes).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import types

import pytest

from ftwatch.events import Action, FailureClass
from ftwatch.health import bootcheck
from ftwatch.health.bootcheck import ascend_check, disk_test, nvidia_check


# -- 1. disk tests sharing a folder ----------------------------------------------------------------

def test_concurrent_disk_tests_on_one_folder_do_not_see_each_other(tmp_path):
    """Two checks on one (shared) folder at once, many times: every one succeeds, none is left."""
    results = []

    def one():
        results.append(disk_test(tmp_path, 1 << 20))

    for _ in range(15):
        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 30
    bad = [r.lines for r in results if r.status != "ok"]
    assert bad == []
    assert list(tmp_path.iterdir()) == []
    files = {r.fields["file"] for r in results}
    assert len(files) == 30 and all(f"{os.getpid()}" in f for f in files)


def test_disk_tests_of_two_processes_on_one_folder(tmp_path):
    code = ("import sys; from pathlib import Path; from ftwatch.health.bootcheck import disk_test\n"
            "bad = [r.lines for r in (disk_test(Path(sys.argv[1]), 1 << 20) for _ in range(10)) if r.status != 'ok']\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert list(tmp_path.iterdir()) == []


# -- 6. missing and read-only paths ----------------------------------------------------------------

def test_a_missing_mount_fails_and_is_not_created(tmp_path):
    missing = tmp_path / "mnt" / "not-mounted"
    r = bootcheck.run_checks([missing], 4096, 0.0, world=1, allreduce=False, allreduce_bytes=4096,
                             timeout=5, python=str(tmp_path / "no-python"))[0]
    assert r.status == "fail" and r.blocks and r.failure_class is FailureClass.HARDWARE_NODE
    assert "no such folder: not mounted?" in r.lines[0]
    assert not missing.exists() and not missing.parent.exists()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
def test_a_read_only_mount_only_warns(tmp_path):
    """A real read-only tmpfs, mounted in a user namespace (EROFS from the kernel)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    code = ("import json, sys; from pathlib import Path; from ftwatch.health.bootcheck import disk_test\n"
            "r = disk_test(Path(sys.argv[1]), 4096); print(json.dumps(r.to_dict()))\n")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o ro tmpfs "$0" && exec "$1" -c "$2" "$0"',
                           str(ro), sys.executable, code], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "mount" in proc.stderr:
        pytest.skip(f"cannot mount in a user namespace here: {proc.stderr.strip()}")
    import json
    r = json.loads(proc.stdout)
    assert r["status"] == "warn" and r["action"] == "notify" and r["failure_class"] != "hardware_node"
    assert "Read-only file system" in r["lines"][0]


# -- 2. npu-smi's process table ----------------------------------------------------------------------

# `npu-smi info` on an Atlas 800T A2 (910B3) with a training process on NPU 0: the chip table, then
# the process table (its rows start like chip rows; the third column is a PID, not a health).
NPU_SMI_WITH_PROCESSES = """#!/bin/sh
cat <<'TABLE'
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3                 Version: 23.0.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 97.8        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3397 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | {health}      | 90.4        37                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3393 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 2187613       | python3.9                | 58250                   |
+===========================+===============+====================================================+
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
TABLE
"""


@pytest.mark.parametrize("health, status", [("OK", "ok"), ("Critical", "fail")])
def test_npu_processes_are_not_read_as_health(monkeypatch, tmp_path, health, status):
    exe = tmp_path / "npu-smi"
    exe.write_text(NPU_SMI_WITH_PROCESSES.format(health=health))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    r = ascend_check()
    assert r.lines[:2] == ("NPU Number: 2", "NPU Type: 910B3")
    assert r.status == status, r.lines
    if status == "fail":
        assert r.lines[-1] == "NPU Check: Failed: health Critical"


# -- 4, 5. NVML: absent, broken, fewer GPUs than the job needs -----------------------------------------

class _NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {12: "NVML Shared Library Not Found", 18: "RM has detected an NVML/RM version mismatch",
                9: "Driver Not Loaded", 15: "GPU is lost"}.get(self.value, f"error {self.value}")


def fake_pynvml(monkeypatch, count=2, init_error=None, lost=(), uuids=None, procs=None):
    """Install a pynvml stand-in with ``count`` A100s; ``lost`` indices answer GPU_IS_LOST;
    ``procs``: GPU index -> [(pid, bytes)] its compute processes (None: listing not supported)."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = _NVMLError
    mod.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    uuids = uuids or [f"GPU-{i:08x}-aaaa" for i in range(count)]
    calls = []

    def init():
        calls.append("init")
        if init_error is not None:
            raise _NVMLError(init_error)

    def handle(i):
        if i in lost:
            raise _NVMLError(15)
        return i

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: calls.append("shutdown")
    mod.nvmlDeviceGetCount = lambda: count
    mod.nvmlSystemGetDriverVersion = lambda: b"535.129.03"
    mod.nvmlSystemGetCudaDriverVersion = lambda: 12020
    mod.nvmlDeviceGetHandleByIndex = handle
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA A100-SXM4-40GB"
    mod.nvmlDeviceGetUUID = lambda h: uuids[h]

    def running(h):
        if procs is None:
            raise _NVMLError(3)          # NVML_ERROR_NOT_SUPPORTED
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs.get(h, [])]

    mod.nvmlDeviceGetComputeRunningProcesses = running
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return calls


def test_no_nvml_library_is_skipped(monkeypatch):
    fake_pynvml(monkeypatch, init_error=12)
    r = nvidia_check(["0"])
    assert r.status == "skipped" and "NVML Shared Library Not Found" in r.lines[0]


@pytest.mark.parametrize("code", [18, 9])
def test_a_broken_driver_is_a_hardware_fault(monkeypatch, code):
    """Driver/library version mismatch, driver not loaded: the node cannot run GPUs (seed 001)."""
    fake_pynvml(monkeypatch, init_error=code)
    r = nvidia_check(["0", "1"])
    assert r.status == "fail" and r.blocks and r.failure_class is FailureClass.HARDWARE_NODE
    assert r.lines[0].startswith("GPU Check: Failed: NVML cannot start")


def test_enough_gpus_pass(monkeypatch):
    calls = fake_pynvml(monkeypatch, count=2)
    r = nvidia_check(["0", "1"])
    assert r.status == "ok" and r.lines[0] == "GPU Number: 2" and calls == ["init", "shutdown"]


def test_a_gpu_fallen_off_the_bus_lowers_the_count_and_fails(monkeypatch):
    """Seed 001's 掉卡: the job sees 0,1 but NVML finds one GPU; device 1 is the one to isolate."""
    fake_pynvml(monkeypatch, count=1)
    r = nvidia_check(["0", "1"])
    assert r.status == "fail" and r.blocks and r.action is Action.ISOLATE_NODE
    assert r.fields["device"] == "1" and r.fields["missing"] == ["1"]
    assert r.lines[-1] == "GPU Check: Failed: 1 GPU(s) here, the job needs 2 (0,1); missing: 1"


def test_a_lost_gpu_names_its_device(monkeypatch):
    fake_pynvml(monkeypatch, count=2, lost=(1,))
    r = nvidia_check(["0", "1"])
    assert r.status == "fail" and r.fields["device"] == "1"
    assert "GPU Check: Failed: GPU 1: GPU is lost" in r.lines


def test_missing_gpu_by_uuid(monkeypatch):
    fake_pynvml(monkeypatch, count=1, uuids=["GPU-11111111-aaaa"])
    r = nvidia_check(["GPU-11111111", "GPU-22222222"])
    assert r.status == "fail" and r.fields["device"] == "GPU-22222222"


# -- 5. a CUDA error in the torch probe -----------------------------------------------------------------

FAKE_TORCH = '''
import warnings
__version__ = "2.2.0"
class version:
    cuda = "12.3"
class _Cuda:
    @staticmethod
    def is_available():
        {is_available}
    @staticmethod
    def device_count():
        raise RuntimeError("CUDA error: unknown error")
cuda = _Cuda()
'''


def _python_with_torch(tmp_path, is_available: str):
    pkg = tmp_path / "shadow" / "torch"
    (pkg / "distributed").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_TORCH.replace("{is_available}", is_available))
    (pkg / "distributed" / "__init__.py").write_text("")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={pkg.parent}:$PYTHONPATH exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("is_available, why", [
    # torch's answer to a driver that is too old: False, with c10's "CUDA initialization" warning
    ('warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old (found version '
     '11040)."); return False', "CUDA initialization: The NVIDIA driver on your system is too old"),
    # a probe that raises (the device count of a broken CUDA)
    ("return True", "RuntimeError: CUDA error: unknown error"),
])
def test_a_cuda_error_fails_the_versions_check(tmp_path, is_available, why):
    results = bootcheck.torch_checks(2, 1 << 20, timeout=5, python=str(_python_with_torch(tmp_path, is_available)))
    assert [r.check for r in results] == ["versions"], "no all-reduce after a failed probe"
    r = results[0]
    assert r.status == "fail" and r.blocks and r.failure_class is FailureClass.HARDWARE_NODE
    assert why in r.lines[0]


@pytest.fixture(autouse=True)
def host_pids(monkeypatch):
    """NVML's PIDs read as this machine's (the tests' fake NVML hands out local PIDs), wherever
    the tests run."""
    monkeypatch.setattr(bootcheck, "_host_pid_namespace", lambda: True)


@pytest.fixture
def stray():
    """A real process of this machine that is not ours (its parent shell exits, so it is
    re-parented away from us), standing in for an earlier job's leftover on a GPU."""
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
    pid = int(out.stdout)
    yield pid
    os.kill(pid, 9)


def test_a_live_process_on_the_jobs_gpu_fails_the_check(monkeypatch, stray):
    """Recorded on an H200 (tools/gpu_capture.sh gpu_held): another process held 139 GiB of the GPU
    and the job's first CUDA call failed with 'CUDA error: out of memory', on every restart. The
    check names the process; GPU 1 is not the job's, and a PID this machine does not show (another
    PID namespace, or gone) is not counted (gcm's running_procs)."""
    fake_pynvml(monkeypatch, count=2, procs={0: [(stray, 139 << 30), (4_000_000, 1 << 30)], 1: [(stray, 0)]})
    r = nvidia_check(["0"])
    assert r.status == "fail" and r.blocks and r.action is Action.ISOLATE_NODE
    assert r.failure_class is FailureClass.HARDWARE_NODE and r.fields["device"] == "0"
    assert r.lines[-1] == f"GPU Check: Failed: GPU 0 is in use by another process: pid {stray} (sleep, 139.0 GiB)"
    assert r.fields["in_use"] == [["0", stray, "sleep", 139 << 30]]


def test_a_process_on_the_gpu_only_warns_or_is_not_read_when_configured_so(monkeypatch, stray):
    fake_pynvml(monkeypatch, count=1, procs={0: [(stray, 1 << 30)]})
    r = nvidia_check(["0"], in_use="warn")
    assert r.status == "warn" and not r.blocks and r.action is Action.NOTIFY
    assert nvidia_check(["0"], in_use="off").status == "ok"
    assert nvidia_check(None).status == "ok"             # the job's GPUs are not known: none is read


def test_the_jobs_own_workers_on_its_gpus_are_not_counted(monkeypatch):
    """An instance restart's Bootcheck runs while the job's other workers hold their GPUs: they
    are ftwatch's descendants (here a child of this process, and a grandchild)."""
    child = subprocess.Popen([sys.executable, "-c", "import subprocess,sys,time; p=subprocess.Popen(['sleep','60']);"
                              " print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        fake_pynvml(monkeypatch, count=1, procs={0: [(child.pid, 1 << 30), (grandchild, 1 << 30)]})
        assert nvidia_check(["0"]).status == "ok"
    finally:
        subprocess.run(["pkill", "-P", str(child.pid)])
        child.kill()
        child.wait()


def test_inside_a_containers_pid_namespace_nvmls_pids_are_not_read(monkeypatch, stray):
    """NVML reports the host's PIDs: in a container's own PID namespace a PID there names another
    process (or none), so no process is counted and the check passes."""
    monkeypatch.setattr(bootcheck, "_host_pid_namespace", lambda: False)
    fake_pynvml(monkeypatch, count=1, procs={0: [(stray, 1 << 30)]})
    assert nvidia_check(["0"]).status == "ok"


def test_gpus_whose_processes_nvml_cannot_list_pass(monkeypatch):
    fake_pynvml(monkeypatch, count=2, procs=None)
    assert nvidia_check(["0", "1"]).status == "ok"
