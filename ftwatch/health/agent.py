"""The torch side of the health checks: one process per worker slot, driven by JSON lines.

Run as ``python -m ftwatch.health.agent``; the monitor never imports torch itself (it costs a
second of CPU and must not touch the accelerators). The agent reads one JSON request per line on
stdin and answers one JSON line on stdout, so one torch import serves several rounds of a node
check. Requests:

    {"op": "probe"}
        -> {"ok": true, "torch": "2.13.0+cpu", "cuda": "12.3" | null, "cuda_available": bool,
            "nccl": "2.19.3" | null, "devices": int, "device_name": str | null,
            "npu_available": bool, "backend": "nccl" | "gloo"}
    {"op": "collective", "rank": r, "world": n, "addr": "127.0.0.1", "port": p, "timeout": s,
     "bytes": b, "iters": k, "gemm": m, "gemm_iters": g}
        -> {"ok": true, "gemm_s": seconds of g m x m matrix multiplies (0 when m = 0),
            "allreduce_ok": bool (the sum came out right), "allgather_s": ..., "allreduce_s":
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
from datetime import timedelta


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
    cuda = torch.cuda.is_available()
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
            "nccl": nccl, "devices": torch.cuda.device_count() if cuda else 0,
            "device_name": torch.cuda.get_device_name(0) if cuda else None,
            "npu_available": npu, "backend": "nccl" if cuda else "gloo"}


def _collective(torch, dist, req: dict) -> dict:
    rank, world = int(req["rank"]), int(req["world"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % max(1, torch.cuda.device_count())) if cuda else torch.device("cpu")
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
        return {"ok": True, "gemm_s": gemm_s, "allreduce_ok": ok, "allgather_s": allgather_s,
                "allreduce_s": per, "busbw_gbs": algbw * 2 * (world - 1) / world}
    finally:
        dist.destroy_process_group()


def main() -> int:
    """Serve requests until ``exit`` or end of input; an error answers and ends the agent."""
    import torch
    import torch.distributed as dist
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "exit":
            return 0
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
