"""Bootcheck and Troubleshooting (SPEC H1, seed 001): the checks themselves.

``run_checks`` returns one :class:`~ftwatch.health.ftlog.CheckResult` per check, in the seed's
order: the disk test of each configured path (write + fsync + read back, with throughput), the
accelerators (NVIDIA through NVML where ``pynvml`` / ``nvidia-ml-py`` imports, Ascend through
``npu-smi`` where it is on the PATH, else the CPU), the versions (driver, CUDA, PyTorch, NCCL, from
a torch agent process), and an all-reduce over the job's worker slots with a bus-bandwidth
figure, each slot's agent on that slot's own device. A check whose package or library is absent
(ImportError, no NVML library, no npu-smi) says ``skipped: <why>`` and never fails; any other
error of a check (a CUDA error, a driver/library version mismatch) is a failure.

Verdicts (seed 001: hardware errors block, slow nodes do not): a disk that returns other bytes
than were written, an I/O error, a configured path that does not exist (a missing mount), a GPU
that NVML cannot reach, fewer GPUs than the job needs, a GPU of the job that another process holds
(``health.gpu_in_use``), or a broken CUDA / driver is
``hardware_node`` / ``isolate_node``; a failed all-reduce is ``retryable_infra`` / ``restart_job``; a slow disk or
a low bus bandwidth is a ``straggler`` warning (``notify``).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

from ftwatch.config.supervisor import DEVICE_ENV
from ftwatch.events import Action, FailureClass
from ftwatch.health.agents import Agent, probe, run_group
from ftwatch.health.ftlog import CheckResult, skipped

# EIO and friends: the device answered with an error. EROFS is not here: a mount made read-only on
# purpose answers it too, so it warns (a disk remounted read-only after I/O errors is caught by the
# kernel-log rules, and by the job's own writes).
_HARDWARE_ERRNOS = {errno.EIO, getattr(errno, "EUCLEAN", -1), getattr(errno, "EREMOTEIO", -1)}
PROBE_PREFIX = ".ftwatch_disktest"


def _rate(nbytes: int, seconds: float) -> str:
    """``5.9 GB/s`` / ``663 MB/s`` (decimal units, as the seed prints them)."""
    per = nbytes / max(seconds, 1e-9)
    return f"{per / 1e9:.1f} GB/s" if per >= 1e9 else f"{per / 1e6:.0f} MB/s"


def _open_probe(path: Path) -> tuple[int, Path]:
    """Create this process's own probe file in ``path`` (``O_EXCL``: never another's).

    The name is ``.ftwatch_disktest.<host>.<pid>.<random hex>``, so that checks of several
    processes or nodes sharing one folder (a shared file system) never read each other's bytes.
    """
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
    while True:
        probe_file = Path(path) / f"{PROBE_PREFIX}.{host}.{os.getpid()}.{secrets.token_hex(6)}"
        try:
            return os.open(probe_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), probe_file
        except FileExistsError:          # pragma: no cover - 48 random bits collided
            continue


def disk_test(path: Path, nbytes: int, min_mb_s: float = 0.0) -> CheckResult:
    """Write ``nbytes`` to a probe file of this process in ``path`` (fsynced), read them back,
    compare, remove it. The log names it ``<path>/.ftwatch_disktest`` (seed 001's shape); the
    real file (``fields["file"]``) carries host, pid and a random part (see :func:`_open_probe`).

    Returns:
        ``ok`` with ``read_mb_s`` / ``write_mb_s``; ``warn`` when writing was slower than
        ``min_mb_s``, or the path is read-only (EROFS: a read-only mount is not a hardware fault);
        ``fail`` when
          - ``path`` does not exist or is no folder (a data mount missing on this node: the node
            cannot run the job, as with a lost GPU: ``hardware_node`` / ``isolate_node``, so the
            start is blocked; seed 001 "硬件错误 ... 将阻断任务继续执行");
          - the bytes differ or the OS reports an I/O error (EIO: hardware, isolate);
          - the path cannot be written otherwise (not a folder, permissions, no space; the probe
            file vanished under us): ``retryable_infra`` / ``notify``, never a hardware verdict.
        The read figure is usually the page cache's (as in seed 001's 5.9 GB/s).
    """
    label = Path(path) / PROBE_PREFIX
    if not Path(path).exists():
        return CheckResult("disk", "fail", (f"DiskTest {label}: Failed ({path}: no such folder: not mounted?)",),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                           fields={"path": str(path), "missing": True})
    block = os.urandom(min(nbytes, 1 << 20))
    probe_file: Path | None = None
    try:
        start = time.perf_counter()
        fd, probe_file = _open_probe(Path(path))
        with open(fd, "wb") as fh:
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
        fields = {"path": str(path), "errno": exc.errno, "file": str(probe_file or label)}
        if exc.errno == errno.EROFS:
            return CheckResult("disk", "warn", (f"DiskTest {label}: Failed ({exc.strerror}: mounted read-only; "
                                                "not tested)",),
                               failure_class=FailureClass.RETRYABLE_INFRA, action=Action.NOTIFY, fields=fields)
        hardware = exc.errno in _HARDWARE_ERRNOS
        return CheckResult("disk", "fail", (f"DiskTest {label}: Failed ({exc.strerror or exc})",),
                           failure_class=FailureClass.HARDWARE_NODE if hardware else FailureClass.RETRYABLE_INFRA,
                           action=Action.ISOLATE_NODE if hardware else Action.NOTIFY, fields=fields)
    finally:
        if probe_file is not None:
            try:
                probe_file.unlink()
            except OSError:
                pass
    fields = {"path": str(path), "file": str(probe_file), "bytes": nbytes,
              "read_mb_s": round(nbytes / max(read, 1e-9) / 1e6, 1),
              "write_mb_s": round(nbytes / max(wrote, 1e-9) / 1e6, 1)}
    if not same:
        return CheckResult("disk", "fail", (f"DiskTest {label}: Failed (read back other bytes than written)",),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE, fields=fields)
    lines = (f"DiskTest {label}: Succeed", f"{path} RW TEST: {_rate(nbytes, read)} {_rate(nbytes, wrote)}")
    if min_mb_s and fields["write_mb_s"] < min_mb_s:
        return CheckResult("disk", "warn", lines + (f"{path} is slow: writes {fields['write_mb_s']} MB/s, "
                                                     f"below {min_mb_s:g} MB/s",),
                           failure_class=FailureClass.STRAGGLER, action=Action.NOTIFY, fields=fields)
    return CheckResult("disk", "ok", lines, fields=fields)


def nvidia_check(expected: Sequence[str] | None = None, in_use: str = "fail") -> CheckResult:
    """GPU count, type and driver through NVML, compared with the devices the job needs, and
    whether another process already holds one of them.

    Args:
        expected: the job's visible devices (``CUDA_VISIBLE_DEVICES`` entries: indices or
            ``GPU-<uuid>``), or None to compare with nothing (and no GPU is known to be the job's).
        in_use: what a live process on one of the job's GPUs is, other than this process and its
            descendants (the job's workers, which an instance restart's check runs beside):
            ``fail``, ``warn`` or ``off`` (``health.gpu_in_use``). NVML's compute processes
            (``nvmlDeviceGetComputeRunningProcesses``) whose PID this machine shows, as
            facebookresearch/gcm's ``running_procs`` health check reads them (CRITICAL for a real
            process, a PID that is gone does not count; not read inside a container's own PID
            namespace, where NVML's PIDs are the host's): recorded on an H200, a process holding
            the GPU's memory made the job's first CUDA call fail with ``CUDA error: out of
            memory``, again on every restart on that node.

    Returns:
        ``skipped`` only where NVML is absent: no pynvml package, or no NVML library
        (``NVMLError_LibraryNotFound``: no NVIDIA driver installed). ``fail`` (``hardware_node`` /
        ``isolate_node``; seed 001: "硬件错误(如掉卡)将阻断任务") when NVML cannot start otherwise
        (driver not loaded, driver/library version mismatch), when a GPU cannot be reached
        (``NVML_ERROR_GPU_IS_LOST``: off the bus), when fewer GPUs are there than the job
        needs (a GPU fallen off the bus lowers the count), or when another process holds one of
        the job's GPUs (``fields["in_use"]``: ``[device, pid, name, bytes]`` each).
        ``fields["device"]`` names the device to isolate where it is known (``fields["missing"]``:
        all of them).
    """
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return skipped("gpu", "pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, LibRmVersionMismatch
        if getattr(exc, "value", None) == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            return skipped("gpu", f"NVML is not available here ({exc})")
        return CheckResult("gpu", "fail", (f"GPU Check: Failed: NVML cannot start: {exc} (driver not loaded, "
                                           "or driver/library version mismatch)",),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                           fields={"error": str(exc)})
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        names, uuids, lost, held = [], set(), {}, []
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                names.append(_text(pynvml.nvmlDeviceGetName(handle)))
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                uuids.add(uuid)
            except Exception as exc:  # noqa: BLE001 - NVML_ERROR_GPU_IS_LOST: off the bus
                lost[str(i)] = f"GPU {i}: {exc}"
                continue
            device = _job_device(i, uuid, expected)
            if device is not None and in_use != "off":
                held += [(device, *p) for p in _other_processes(pynvml, handle)]
    finally:
        pynvml.nvmlShutdown()
    lines = [f"GPU Number: {count}", f"Driver Version: {driver}",
             f"CUDA Driver Version: {cuda // 1000}.{cuda % 1000 // 10}"]
    if names:
        lines.append(f"GPU Type: {names[0]}")
    fields: dict = {"count": count, "driver": driver, "types": names}
    failed = list(lost.values())
    missing = [d for d in lost if expected is None or d in expected]
    if expected:
        fields["expected"] = list(expected)
        gone = [d for d in expected if d not in missing and _missing(d, count, uuids)]
        missing += gone
        if gone or count < len(expected):
            failed.append(f"{count} GPU(s) here, the job needs {len(expected)} ({','.join(expected)})"
                          + (f"; missing: {','.join(gone)}" if gone else ""))
    busy = [f"GPU {d} is in use by another process: pid {pid} ({name}" + (f", {used / 2**30:.1f} GiB" if used else "")
            + ")" for d, pid, name, used in held]
    if held:
        fields["in_use"] = [list(h) for h in held]
    if failed or (busy and in_use == "fail"):
        if missing:
            fields.update(device=missing[0], missing=missing)
        elif held:
            fields["device"] = held[0][0]
        return CheckResult("gpu", "fail", tuple(lines + [f"GPU Check: Failed: {x}" for x in failed + busy]),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE, fields=fields)
    if busy:
        return CheckResult("gpu", "warn", tuple(lines + [f"GPU Check: {x}" for x in busy]),
                           failure_class=FailureClass.HARDWARE_NODE, action=Action.NOTIFY, fields=fields)
    return CheckResult("gpu", "ok", tuple(lines), fields=fields)


def _job_device(index: int, uuid: str, expected: Sequence[str] | None) -> str | None:
    """GPU ``index`` (``uuid``) as the job's visible-devices list names it, or None when it is not
    the job's (or ``expected`` is None: the job's devices are not known, or it sees none)."""
    for d in expected or ():
        if d == str(index) or (d.startswith("GPU-") and uuid.startswith(d)):
            return d
    return None


def _other_processes(pynvml, handle) -> list[tuple[int, str, int]]:
    """(pid, name, bytes held) of each compute process on the GPU that this machine shows and that
    is neither this process nor one of its descendants; ``[]`` where NVML cannot list them (not
    supported, no permission) or names them in another PID namespace than this process's."""
    if not _host_pid_namespace():
        return []
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED / NO_PERMISSION: nothing to say
        return []
    found = []
    for p in procs:
        pid = int(getattr(p, "pid", 0) or 0)
        if pid <= 0 or _descends_from_us(pid):
            continue
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:           # not a process of this machine (another PID namespace), or gone
            continue
        used = getattr(p, "usedGpuMemory", None)
        found.append((pid, name, int(used) if isinstance(used, int) else 0))
    return found


def _missing(device: str, count: int, uuids: set[str]) -> bool:
    """Whether visible-devices entry ``device`` names no GPU NVML sees (an index past the count,
    or a UUID (prefix, as CUDA accepts) of none); other forms (MIG) are not judged."""
    if device.isdigit():
        return int(device) >= count
    if device.startswith("GPU-"):
        return not any(u.startswith(device) for u in uuids)
    return False


def _host_pid_namespace() -> bool:
    """Whether this process sees PIDs as the kernel driver reports them: NVML gives the PIDs of
    the initial PID namespace, so in a container's own PID namespace (``NSpid`` of
    ``/proc/self/status`` lists more than one PID) they would name other processes, or none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) == 2
    except OSError:
        pass
    return True


def _descends_from_us(pid: int) -> bool:
    """Whether ``pid`` is this process or a descendant (``/proc/<pid>/stat``'s parent chain)."""
    me = os.getpid()
    for _ in range(64):
        if pid == me:
            return True
        if pid <= 1:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])     # after "(comm)": state, ppid
    return False


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
    """(NPU id, name, health) per row of ``npu-smi info``'s chip table: ``| 0     910B3  | OK  | ...``.

    Reading stops at the process table (header ``| NPU  Chip | Process id | Process name |
    Process memory(MB) |``), whose rows have the same first cells but a PID where health is.
    """
    rows = []
    for line in text.splitlines():
        if "process id" in line.lower() or "process name" in line.lower():
            break                     # the process table: its columns are PIDs, not health
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


def device_env(device: str | None, index: int | None = None) -> dict[str, str]:
    """The environment of a check agent for one worker slot: its device as the only visible one
    (CUDA and Ascend, as the slot's worker sees it; ``ftwatch.config.supervisor.DEVICE_ENV``) and
    ``FTWATCH_HEALTH_DEVICE=0``; with no device, ``FTWATCH_HEALTH_DEVICE=index`` (modulo the
    devices the agent sees), or nothing."""
    if device is not None:
        return {**{name: device for name in DEVICE_ENV}, "FTWATCH_HEALTH_DEVICE": "0"}
    return {"FTWATCH_HEALTH_DEVICE": str(index)} if index is not None else {}


def torch_checks(world: int, nbytes: int, timeout: float, python: str | None = None,
                 min_busbw_gbs: float = 0.0, allreduce: bool = True,
                 devices: Sequence[str] | None = None, missing: Sequence[str] = ()) -> list[CheckResult]:
    """Versions from a torch agent, then an all-reduce across ``world`` agents.

    Args:
        devices: the job's visible devices in slot order: agent ``i`` sees only ``devices[i]``
            (:func:`device_env`), so each slot tests its own device and never an isolated one.
        missing: devices the GPU check found absent: an agent put on one sees no GPU and never
            joins the group (each rank waits out ``timeout``), so the all-reduce is not tried.

    Returns:
        ``skipped`` when torch is absent (the agent's ``import torch`` raised ImportError, or the
        interpreter cannot be started), when ``allreduce`` is False, for one worker slot, or
        when a slot's device is ``missing``.
        A probe that failed otherwise (a CUDA error, an agent that died: a broken driver) is a
        ``fail`` (``hardware_node`` / ``isolate_node``, seed 001), and no all-reduce is tried.
    """
    import sys
    python = python or sys.executable
    devs = list(devices or [])
    agents = [Agent(i, python, env=device_env(devs[i] if i < len(devs) else None))
              for i in range(max(1, world if allreduce else 1))]
    try:
        try:
            info = probe(agents[0], timeout=max(timeout, 60.0))
        except OSError as exc:               # the interpreter itself is missing
            return [skipped("versions", f"cannot start {python}: {exc.strerror or exc}")]
        if not info.get("ok") and info.get("absent"):
            return [skipped("versions", f"torch is not installed for {python} ({info.get('error')})")]
        if not info.get("ok") or info.get("cuda_error"):
            why = info.get("cuda_error") or info.get("error")
            return [CheckResult("versions", "fail", (f"Versions Check: Failed: torch / CUDA cannot run here: {why}",),
                                failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                                fields={k: v for k, v in info.items() if k != "ok"})]
        results = [CheckResult("versions", "ok", _version_lines(info), fields=info)]
        if not allreduce:
            results.append(skipped("allreduce", "health.allreduce_check is off"))
            return results
        if world < 2:
            results.append(skipped("allreduce", "one worker slot: nothing to all-reduce with"))
            return results
        absent = [d for d in devs[:world] if d in missing]
        if absent:
            results.append(skipped("allreduce", f"no GPU for the slot(s) of device {','.join(absent)} (GPU Check)"))
            return results
        answers = run_group(agents, {"bytes": nbytes, "iters": 3, "gemm": 0}, timeout)
        results.append(_allreduce_result(answers, info["backend"], nbytes, min_busbw_gbs))
        return results
    finally:
        for agent in agents:
            agent.close()


def _version_lines(info: dict) -> tuple[str, ...]:
    """Seed 001's version lines; what a CPU machine lacks says ``skipped: <why>``."""
    cuda = info.get("cuda")
    lines = [f"CUDA Version: {cuda}" if cuda else "CUDA Version: skipped: this torch is built without CUDA",
             f"PyTorch Version: {info['torch']}",
             f"CUDA: {'Available' if info['cuda_available'] else 'Unavailable'}"]
    if info.get("nccl"):
        lines.append(f"NCCL Version: {info['nccl']}")
    else:
        lines.append("NCCL Version: skipped: " + ("CUDA is not available" if not info["cuda_available"]
                                                  else "this torch is built without NCCL"))
    if info.get("device_name"):
        lines.append(f"GPU Type: {info['device_name']}")
    return tuple(lines)


def _allreduce_result(answers: Sequence[dict], backend: str, nbytes: int, min_busbw_gbs: float) -> CheckResult:
    world = len(answers)
    bad = [f"rank {i}: {a.get('error')}" for i, a in enumerate(answers) if not a.get("ok")]
    wrong = [f"rank {i}: wrong sum" for i, a in enumerate(answers) if a.get("ok") and not a.get("allreduce_ok")]
    if bad or wrong:
        return CheckResult("allreduce", "fail", (f"AllReduce Check: Failed ({'; '.join(bad + wrong)})",),
                           failure_class=FailureClass.RETRYABLE_INFRA, action=Action.RESTART_JOB,
                           fields={"errors": bad + wrong, "world": world})
    busbw = sum(a["busbw_gbs"] for a in answers) / world
    fields = {"world": world, "backend": backend, "bytes": nbytes, "busbw_gbs": round(busbw, 4),
              "devices": [a.get("device") for a in answers],
              "visible": [(a.get("env") or {}).get("CUDA_VISIBLE_DEVICES") for a in answers]}
    lines = ("AllReduce Check: Succeed",
             f"{backend.upper()} Performance Check: Bus Bandwidth Average: {busbw:.4f} GB/s "
             f"({world} ranks, {nbytes >> 20} MiB)")
    if min_busbw_gbs and busbw < min_busbw_gbs:
        return CheckResult("allreduce", "warn", lines + (f"Bus bandwidth is slow: below {min_busbw_gbs:g} GB/s",),
                           failure_class=FailureClass.STRAGGLER, action=Action.NOTIFY, fields=fields)
    return CheckResult("allreduce", "ok", lines, fields=fields)


def run_checks(paths: Sequence[Path], disk_bytes: int, disk_min_mb_s: float, world: int,
               allreduce: bool, allreduce_bytes: int, timeout: float, python: str | None = None,
               min_busbw_gbs: float = 0.0, devices: Sequence[str] | None = None,
               gpu_in_use: str = "fail") -> list[CheckResult]:
    """Every Bootcheck / Troubleshooting check, in order (see the module docstring).

    Args:
        paths: folders to disk-test. They must exist: a missing one is a failed check (a data
            mount missing on this node), never created here.
        world: worker slots for the all-reduce (the job's ``nproc_per_node``).
        allreduce: False skips the torch checks' all-reduce (versions are still read).
        devices: the job's visible devices in slot order (``ftwatch.pipeline.actuators.slots.Slots.active``),
            or None: the NVML check compares the GPU count with them and agent ``i`` of the
            all-reduce sees only ``devices[i]``.
        gpu_in_use: ``nvidia_check``'s ``in_use``.
    """
    results: list[CheckResult] = [disk_test(Path(path), disk_bytes, disk_min_mb_s) for path in paths]
    accel = [nvidia_check(devices, gpu_in_use), ascend_check()]
    results += accel
    if all(r.status == "skipped" for r in accel):
        results.append(cpu_check())
    results += torch_checks(world, allreduce_bytes, timeout, python, min_busbw_gbs, allreduce, devices,
                            accel[0].fields.get("missing", ()))
    return results
