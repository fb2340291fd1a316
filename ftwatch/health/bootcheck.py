"""Bootcheck and Troubleshooting (SPEC H1, seed 001): the checks themselves.

``run_checks`` returns one :class:`~ftwatch.health.ftlog.CheckResult` per check, in the seed's
order: the disk test of each configured path (write + fsync + read back, with throughput), the
accelerators (NVIDIA through NVML where ``pynvml`` / ``nvidia-ml-py`` imports, Ascend through
``npu-smi`` where it is on the PATH, else the CPU), the versions (driver, CUDA, PyTorch, NCCL, from
a torch agent process), and an all-reduce over the job's worker slots with a bus-bandwidth
figure. A check whose package or device is absent says ``skipped: <why>`` and never fails.

Verdicts (seed 001: hardware errors block, slow nodes do not): a disk that returns other bytes
than were written, an I/O error, or a GPU that NVML cannot reach is ``hardware_node`` /
``isolate_node``; a failed all-reduce is ``retryable_infra`` / ``restart_job``; a slow disk or
a low bus bandwidth is a ``straggler`` warning (``notify``).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from ftwatch.events import Action, FailureClass
from ftwatch.health.agents import Agent, probe, run_group
from ftwatch.health.ftlog import CheckResult, skipped

_HARDWARE_ERRNOS = {errno.EIO, errno.EROFS, getattr(errno, "EUCLEAN", -1), getattr(errno, "EREMOTEIO", -1)}


def _rate(nbytes: int, seconds: float) -> str:
    """``5.9 GB/s`` / ``663 MB/s`` (decimal units, as the seed prints them)."""
    per = nbytes / max(seconds, 1e-9)
    return f"{per / 1e9:.1f} GB/s" if per >= 1e9 else f"{per / 1e6:.0f} MB/s"


def disk_test(path: Path, nbytes: int, min_mb_s: float = 0.0) -> CheckResult:
    """Write ``nbytes`` to ``<path>/.ftwatch_disktest`` (fsynced), read them back, compare, remove.

    Returns:
        ``ok`` with ``read_mb_s`` / ``write_mb_s``; ``warn`` when writing was slower than
        ``min_mb_s``; ``fail`` when the bytes differ or the OS reports an I/O error (hardware:
        isolate) or the path cannot be written at all (permissions, no space: notify).
        The read figure is usually the page cache's (as in seed 001's 5.9 GB/s).
    """
    probe_file = Path(path) / ".ftwatch_disktest"
    block = os.urandom(min(nbytes, 1 << 20))
    try:
        start = time.perf_counter()
        with open(probe_file, "wb") as fh:
            left = nbytes
            while left > 0:
                left -= fh.write(block[:left])
            fh.flush()
            os.fsync(fh.fileno())
        wrote = time.perf_counter() - start
        start = time.perf_counter()
        same = True
        with open(probe_file, "rb") as fh:
            left = nbytes
            while left > 0:
                data = fh.read(min(left, len(block)))
                if not data or data != block[:len(data)]:
                    same = False
                    break
                left -= len(data)
        read = time.perf_counter() - start
    except OSError as exc:
        hardware = exc.errno in _HARDWARE_ERRNOS
        return CheckResult("disk", "fail", (f"DiskTest {probe_file}: Failed ({exc.strerror or exc})",),
                           failure_class=FailureClass.HARDWARE_NODE if hardware else FailureClass.RETRYABLE_INFRA,
                           action=Action.ISOLATE_NODE if hardware else Action.NOTIFY,
                           fields={"path": str(path), "errno": exc.errno})
    finally:
        try:
            probe_file.unlink()
        except OSError:
            pass
    fields = {"path": str(path), "bytes": nbytes, "read_mb_s": round(nbytes / max(read, 1e-9) / 1e6, 1),
              "write_mb_s": round(nbytes / max(wrote, 1e-9) / 1e6, 1)}
    if not same:
        return CheckResult("disk", "fail", (f"DiskTest {probe_file}: Failed (read back other bytes than written)",),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE, fields=fields)
    lines = (f"DiskTest {probe_file}: Succeed", f"{path} RW TEST: {_rate(nbytes, read)} {_rate(nbytes, wrote)}")
    if min_mb_s and fields["write_mb_s"] < min_mb_s:
        return CheckResult("disk", "warn", lines + (f"{path} is slow: writes {fields['write_mb_s']} MB/s, "
                                                     f"below {min_mb_s:g} MB/s",),
                           failure_class=FailureClass.STRAGGLER, action=Action.NOTIFY, fields=fields)
    return CheckResult("disk", "ok", lines, fields=fields)


def nvidia_check() -> CheckResult:
    """GPU count, type and driver through NVML; ``skipped`` without pynvml or an NVIDIA driver."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return skipped("gpu", "pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded ...
        return skipped("gpu", f"NVML is not available here ({exc})")
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        names, lost = [], []
        for i in range(count):
            try:
                names.append(_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))))
            except Exception as exc:  # noqa: BLE001 - NVML_ERROR_GPU_IS_LOST: off the bus
                lost.append(f"GPU {i}: {exc}")
    finally:
        pynvml.nvmlShutdown()
    lines = [f"GPU Number: {count}", f"Driver Version: {driver}",
             f"CUDA Driver Version: {cuda // 1000}.{cuda % 1000 // 10}"]
    if names:
        lines.append(f"GPU Type: {names[0]}")
    fields = {"count": count, "driver": driver, "types": names}
    if lost:
        return CheckResult("gpu", "fail", tuple(lines + [f"GPU Check: Failed: {x}" for x in lost]),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE, fields=fields)
    return CheckResult("gpu", "ok", tuple(lines), fields=fields)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def ascend_check(timeout: float = 30.0) -> CheckResult:
    """NPU count and type from ``npu-smi info``; ``skipped`` where npu-smi is not on the PATH."""
    exe = shutil.which("npu-smi")
    if exe is None:
        return skipped("npu", "npu-smi is not on the PATH (not an Ascend machine)")
    try:
        proc = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CheckResult("npu", "fail", (f"NPU Check: Failed: npu-smi info: {exc}",),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE)
    if proc.returncode != 0:
        return CheckResult("npu", "fail", (f"NPU Check: Failed: npu-smi info exited {proc.returncode}: "
                                           f"{proc.stderr.strip()[:200]}",),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE)
    rows = _npu_rows(proc.stdout)
    health = [h for _, _, h in rows]
    bad = [h for h in health if h and h.split()[0] not in ("OK", "Warning")]
    lines = [f"NPU Number: {len(rows)}"] + ([f"NPU Type: {rows[0][1]}"] if rows else [])
    if bad:
        return CheckResult("npu", "fail", tuple(lines + [f"NPU Check: Failed: health {', '.join(bad)}"]),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE)
    return CheckResult("npu", "ok", tuple(lines), fields={"count": len(rows)})


def _npu_rows(text: str) -> list[tuple[str, str, str]]:
    """(NPU id, name, health) per row of ``npu-smi info``'s table: ``| 0     910B3  | OK  | ...``."""
    rows = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and line.startswith("|"):
            first = cells[1].split()
            if len(first) >= 2 and first[0].isdigit():
                rows.append((first[0], first[1], cells[2].strip()))
    return rows


def cpu_check() -> CheckResult:
    """The CPU, for machines without accelerators: count and model."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return CheckResult("cpu", "ok", (f"CPU Number: {os.cpu_count()}", f"CPU Type: {model or 'unknown'}"),
                       fields={"count": os.cpu_count(), "type": model})


def torch_checks(world: int, nbytes: int, timeout: float, python: str | None = None,
                 min_busbw_gbs: float = 0.0, allreduce: bool = True) -> list[CheckResult]:
    """Versions from a torch agent, then an all-reduce across ``world`` agents.

    ``skipped`` when torch cannot be imported by ``python``, when ``allreduce`` is False, or
    for one worker slot.
    """
    import sys
    python = python or sys.executable
    agents = [Agent(i, python) for i in range(max(1, world if allreduce else 1))]
    try:
        try:
            info = probe(agents[0], timeout=max(timeout, 60.0))
        except OSError as exc:               # the interpreter itself is missing
            return [skipped("versions", f"cannot start {python}: {exc.strerror or exc}")]
        if not info.get("ok"):
            return [skipped("versions", f"torch cannot run here ({info.get('error')})")]
        lines = [f"PyTorch Version: {info['torch']}",
                 f"CUDA: {'Available' if info['cuda_available'] else 'Unavailable'}"]
        if info.get("cuda"):
            lines.insert(0, f"CUDA Version: {info['cuda']}")
        if info.get("nccl"):
            lines.append(f"NCCL Version: {info['nccl']}")
        if info.get("device_name"):
            lines.append(f"GPU Type: {info['device_name']}")
        results = [CheckResult("versions", "ok", tuple(lines), fields=info)]
        if not allreduce:
            results.append(skipped("allreduce", "health.allreduce_check is off"))
            return results
        if world < 2:
            results.append(skipped("allreduce", "one worker slot: nothing to all-reduce with"))
            return results
        answers = run_group(agents, {"bytes": nbytes, "iters": 3, "gemm": 0}, timeout)
        results.append(_allreduce_result(answers, info["backend"], nbytes, min_busbw_gbs))
        return results
    finally:
        for agent in agents:
            agent.close()


def _allreduce_result(answers: Sequence[dict], backend: str, nbytes: int, min_busbw_gbs: float) -> CheckResult:
    world = len(answers)
    bad = [f"rank {i}: {a.get('error')}" for i, a in enumerate(answers) if not a.get("ok")]
    wrong = [f"rank {i}: wrong sum" for i, a in enumerate(answers) if a.get("ok") and not a.get("allreduce_ok")]
    if bad or wrong:
        return CheckResult("allreduce", "fail", (f"AllReduce Check: Failed ({'; '.join(bad + wrong)})",),
                           failure_class=FailureClass.RETRYABLE_INFRA, action=Action.RESTART_JOB,
                           fields={"errors": bad + wrong, "world": world})
    busbw = sum(a["busbw_gbs"] for a in answers) / world
    fields = {"world": world, "backend": backend, "bytes": nbytes, "busbw_gbs": round(busbw, 4)}
    lines = ("AllReduce Check: Succeed",
             f"{backend.upper()} Performance Check: Bus Bandwidth Average: {busbw:.4f} GB/s "
             f"({world} ranks, {nbytes >> 20} MiB)")
    if min_busbw_gbs and busbw < min_busbw_gbs:
        return CheckResult("allreduce", "warn", lines + (f"Bus bandwidth is slow: below {min_busbw_gbs:g} GB/s",),
                           failure_class=FailureClass.STRAGGLER, action=Action.NOTIFY, fields=fields)
    return CheckResult("allreduce", "ok", lines, fields=fields)


def run_checks(paths: Sequence[Path], disk_bytes: int, disk_min_mb_s: float, world: int,
               allreduce: bool, allreduce_bytes: int, timeout: float, python: str | None = None,
               min_busbw_gbs: float = 0.0) -> list[CheckResult]:
    """Every Bootcheck / Troubleshooting check, in order (see the module docstring).

    Args:
        paths: folders to disk-test (each is created if missing).
        world: worker slots for the all-reduce (the job's ``nproc_per_node``).
        allreduce: False skips the torch checks' all-reduce (versions are still read).
    """
    results: list[CheckResult] = []
    for path in paths:
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError:
            pass                      # the disk test reports it
        results.append(disk_test(Path(path), disk_bytes, disk_min_mb_s))
    accel = [nvidia_check(), ascend_check()]
    results += accel
    if all(r.status == "skipped" for r in accel):
        results.append(cpu_check())
    results += torch_checks(world, allreduce_bytes, timeout, python, min_busbw_gbs, allreduce)
    return results
