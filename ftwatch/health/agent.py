"""The torch side of the health checks: one process per worker slot, driven by JSON lines.

Run as ``python -m ftwatch.health.agent``; the monitor never imports torch itself (it costs a
second of CPU and must not touch the accelerators). The agent reads one JSON request per line on
stdin and answers one JSON line on stdout, so one torch import serves several rounds of a node
check. Requests:

    {"op": "probe"}
        -> {"ok": true, "torch": "2.13.0+cpu", "cuda": "12.3" | null, "cuda_available": bool,
            "cuda_error": "CUDA initialization: ..." | null, "nccl": "2.19.3" | null,
            "devices": int, "device_name": str | null,
            "npu_available": bool, "backend": "nccl" | "gloo", "env": {visible-devices variables}}
    {"op": "collective", "rank": r, "world": n, "addr": "127.0.0.1", "port": p, "timeout": s,
     "bytes": b, "iters": k, "gemm": m, "gemm_iters": g}
        -> {"ok": true, "gemm_s": seconds of g m x m matrix multiplies (0 when m = 0),
            "device": "cuda:0" | "cpu", "env": {...}, "allreduce_ok": bool (the sum came out right),
            "allgather_s": ..., "allreduce_s":
            seconds per all-reduce of b bytes, "busbw_gbs": bus bandwidth in GB/s}
        -> {"ok": false, "error": "..."} when the group could not form or a collective failed;
           the agent then exits (a process group that failed is not reused).
    {"op": "exit"}

Bus bandwidth follows nccl-tests' definition for all-reduce (PERFORMANCE.md there):
``algbw = bytes / time`` and ``busbw = algbw * 2 (n - 1) / n``.

Chaos for tests (DLRover, seed 003, reproduces these with chaosblade). The launcher gives each
agent ``FTWATCH_HEALTH_NODE`` (its node or worker-group index); ``FTWATCH_HEALTH_SLOW=1:0.5,3:2``
adds 0.5 s to node 1's GEMM time and 2 s to node 3's (a slow node: CPU load, a throttled GPU), and
``FTWATCH_HEALTH_CRASH=2`` makes node 2's agent SIGKILL itself inside every collective check
(a node that goes down).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from datetime import timedelta


_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "FTWATCH_HEALTH_DEVICE")


def _node() -> str:
    return os.environ.get("FTWATCH_HEALTH_NODE", "")


def _chaos_slow() -> None:
    """Sleep ``FTWATCH_HEALTH_SLOW``'s seconds for this agent's node (a real delay: the peers wait)."""
    for item in os.environ.get("FTWATCH_HEALTH_SLOW", "").split(","):
        node, _, seconds = item.partition(":")
        if node.strip() == _node() and seconds:
            time.sleep(float(seconds))


def _chaos_crash() -> bool:
    return _node() in [n.strip() for n in os.environ.get("FTWATCH_HEALTH_CRASH", "").split(",") if n.strip()]


def _probe(torch) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cuda = torch.cuda.is_available()
    # torch answers a broken driver with False and a "CUDA initialization: ..." warning
    # (c10's CUDA device count); a CPU build or a machine without GPUs warns nothing.
    cuda_error = next((str(w.message) for w in caught if "CUDA initialization" in str(w.message)), None)
    nccl = None
    if cuda:
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL
            nccl = None
    npu = False
    try:
        import torch_npu  # noqa: F401  (Ascend's plug-in, where installed)
        npu = bool(torch.npu.is_available())
    except Exception:  # noqa: BLE001 - not an Ascend machine
        npu = False
    return {"ok": True, "torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": cuda,
            "cuda_error": cuda_error[:300] if cuda_error else None,
            "nccl": nccl, "devices": torch.cuda.device_count() if cuda else 0,
            "device_name": torch.cuda.get_device_name(0) if cuda else None,
            "npu_available": npu, "backend": "nccl" if cuda else "gloo", "env": _env()}


def _env() -> dict:
    """The visible-devices variables this agent was started with (what its slot's device is)."""
    return {name: os.environ.get(name) for name in _ENV_NAMES}


def _device_index(rank: int, count: int) -> int:
    """The CUDA device of this agent: ``FTWATCH_HEALTH_DEVICE`` (its slot's device among those it
    sees; the launcher sets it, with the slot's device as the only visible one), else the
    group rank, both modulo ``count``."""
    chosen = os.environ.get("FTWATCH_HEALTH_DEVICE", "").strip()
    return (int(chosen) if chosen.isdigit() else rank) % max(1, count)


def _collective(torch, dist, req: dict) -> dict:
    rank, world = int(req["rank"]), int(req["world"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", _device_index(rank, torch.cuda.device_count())) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{req['addr']}:{req['port']}",
                            rank=rank, world_size=world, timeout=timedelta(seconds=float(req["timeout"])))
    try:
        gemm_s = 0.0
        m = int(req.get("gemm", 0))
        if m:
            a = torch.randn(m, m, device=device)
            b = torch.randn(m, m, device=device)
            torch.matmul(a, b)            # warm-up: the first call pays for allocation and dispatch
            start = time.perf_counter()
            for _ in range(int(req.get("gemm_iters", 1))):
                a = torch.matmul(a, b) / m
            if cuda:
                torch.cuda.synchronize()
            _chaos_slow()
            gemm_s = time.perf_counter() - start
        if _chaos_crash():
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()                    # the peers' GEMM time is not this node's collective time
        gathered = [torch.zeros(1, device=device) for _ in range(world)]
        start = time.perf_counter()
        dist.all_gather(gathered, torch.full((1,), float(rank), device=device))
        allgather_s = time.perf_counter() - start
        numel = max(1, int(req.get("bytes", 1 << 20)) // 4)
        buf = torch.ones(numel, device=device)
        dist.all_reduce(buf)              # warm-up, and the correctness check
        ok = bool(torch.all(buf == world).item()) and [int(t.item()) for t in gathered] == list(range(world))
        iters = max(1, int(req.get("iters", 3)))
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        if cuda:
            torch.cuda.synchronize()
        per = (time.perf_counter() - start) / iters
        algbw = numel * 4 / per / 1e9
        return {"ok": True, "gemm_s": gemm_s, "device": str(device), "env": _env(), "allreduce_ok": ok,
                "allgather_s": allgather_s, "allreduce_s": per, "busbw_gbs": algbw * 2 * (world - 1) / world}
    finally:
        dist.destroy_process_group()


def main() -> int:
    """Serve requests until ``exit`` or end of input; an error answers and ends the agent.

    Without torch (``import torch`` raises ImportError) every request is answered
    ``{"ok": false, "absent": true, "error": ...}``: the checks say skipped, not failed. Any other
    error of the import (a CUDA library that does not load) answers without ``absent``.
    """
    out = sys.stdout
    try:
        import torch
        import torch.distributed as dist
        broken = None
    except ImportError as exc:
        broken = {"ok": False, "absent": True, "error": f"{type(exc).__name__}: {exc}"[:500]}
    except Exception as exc:  # noqa: BLE001 - e.g. OSError: libcudart.so cannot be loaded
        broken = {"ok": False, "error": f"import torch: {type(exc).__name__}: {exc}"[:500]}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "exit":
            return 0
        if broken is not None:
            out.write(json.dumps(broken) + "\n")
            out.flush()
            return 3
        try:
            answer = _probe(torch) if op == "probe" else _collective(torch, dist, req)
        except Exception as exc:  # noqa: BLE001 - reported to the monitor, which decides
            out.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}) + "\n")
            out.flush()
            return 3
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    os._exit(code)
