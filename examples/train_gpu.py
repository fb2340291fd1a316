"""A tiny real CUDA trainer with GPU fault injection, to record real NCCL and CUDA failure output.

Run it under torchrun or ``ftwatch run --nproc-per-node N -- python examples/train_gpu.py`` on a
machine with an NVIDIA GPU and a CUDA build of PyTorch (``tools/gpu_capture.sh`` records every
fault below that way; the recordings are replay goldens in ``tests/golden/gpu_*``). It reads
``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` from the environment, trains a Linear(256 -> 1) on
synthetic data on ``cuda:<LOCAL_RANK % device count>`` and, when launched by a launcher
(``MASTER_ADDR`` set), all-reduces its gradients over NCCL each step, also with one rank. Output per step on rank 0: ``step 3/20 loss 0.9321``; at the end
``training finished at step 20``.

Fault injection (``FTWATCH_INJECT_FAULT``, on rank ``FTWATCH_INJECT_RANK``, default 0, at step
``FTWATCH_INJECT_STEP``, default 5):

* ``cuda_oom``: asks the caching allocator for twice the device's memory (``torch.OutOfMemoryError``;
  a plain cudaMalloc that fails, never managed memory);
* ``device_assert``: an index past the end of a CUDA tensor (the indexing kernel's device-side
  assert, then ``CUDA error: device-side assert triggered``);
* ``illegal_address``: a Triton kernel that stores 2^40 bytes past its tensor (``CUDA error: an
  illegal memory access was encountered``, a sticky error: the process's context is unusable);
* ``misaligned_address``: a Triton kernel that stores an 8-byte integer one byte into its buffer
  (``CUDA error: misaligned address``, cudaErrorMisalignedAddress, also sticky);
* ``launch_failure``: a Triton kernel that executes PTX ``trap;`` (the kernel aborts:
  ``CUDA error: unspecified launch failure``, cudaErrorLaunchFailure, the message a GPU's own
  faults are also reported with);
* ``nccl_init_oom``: the rank fills the GPU's free memory through the caching allocator, keeps it,
  then all-reduces on a new process group, whose NCCL communicator cannot allocate its buffers
  (``ncclUnhandledCudaError`` ... ``Cuda failure 2 'out of memory'``), as a job that sized its
  batch to the last MiB and then made a group for evaluation does;
* ``graph_capture``: a synchronising call (``.item()``) inside a CUDA graph capture (``CUDA error:
  operation not permitted when stream is capturing``, cudaErrorStreamCaptureUnsupported);
* ``fill_then_compute``: the rank fills the GPU's free memory (as ``nccl_init_oom``) and goes on
  with its step (with ``FTWATCH_INJECT_STEP=1``, before its first matrix product: cuBLAS makes
  its handle and workspace then);
* ``slow_collective``: the rank's compute stream spins for ``FTWATCH_SLEEP_SECONDS`` (default 90)
  before the step's all-reduce (``torch.cuda._sleep``), so the collective cannot finish within the
  process group's timeout (``FTWATCH_PG_TIMEOUT`` seconds, default torch's): ProcessGroupNCCL's
  watchdog reports the timed-out collective and takes the process down, as for a rank stuck in
  a collective;
* ``shared_gpu``: no injection at a step; every rank uses device 0 (``FTWATCH_GPU_PER_RANK=0``),
  so with world size > 1 NCCL reports the ranks' duplicate device at the first collective.

``FTWATCH_GPU_PER_RANK=local`` puts each rank on ``cuda:<LOCAL_RANK>`` as most training scripts do,
with no modulo: more ranks per node than GPUs then fail in ``torch.cuda.set_device`` (``invalid
device ordinal``), and a node that shows no GPU (``CUDA_VISIBLE_DEVICES=``) fails there too.

With ``NCCL_DEBUG=INFO`` in the environment NCCL prints its set-up lines (a clean run's output).
With ``FTWATCH_NO_FLUSH=1`` the trainer's lines are printed without a flush, so that under a pipe
or file (and no ``-u`` / ``PYTHONUNBUFFERED``) they wait in standard output's buffer, as most
training scripts' do.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="total training steps (default 20)")
    return p.parse_args(argv)


def device_for(local_rank: int) -> torch.device:
    """The rank's GPU: its local rank modulo the devices seen; device 0 for every rank when
    ``FTWATCH_GPU_PER_RANK=0`` (ranks sharing a GPU, which NCCL refuses); the local rank itself
    when ``FTWATCH_GPU_PER_RANK=local`` (no check that such a device exists)."""
    mode = os.environ.get("FTWATCH_GPU_PER_RANK", "1")
    if mode == "0":
        return torch.device("cuda", 0)
    if mode == "local":
        return torch.device("cuda", local_rank)
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def inject(kind: str, device: torch.device) -> None:
    """Cause the GPU fault ``kind`` (see the module docstring) on ``device``."""
    if kind == "cuda_oom":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=device)
    elif kind == "device_assert":
        table = torch.zeros(16, device=device)
        index = torch.tensor([64], device=device)
        table[index] += 1.0
        torch.cuda.synchronize(device)
    elif kind == "illegal_address":
        _store_far_out_of_bounds(device)
    elif kind == "misaligned_address":
        _store_misaligned(device)
    elif kind == "launch_failure":
        _trap(device)
    elif kind == "nccl_init_oom":
        _fill_memory(device)
        group = dist.new_group(list(range(dist.get_world_size())))
        dist.all_reduce(torch.ones(1, device=device), group=group)
        torch.cuda.synchronize(device)
    elif kind == "graph_capture":
        graph, x = torch.cuda.CUDAGraph(), torch.ones(4, device=device)
        with torch.cuda.graph(graph):
            (x * 2).sum().item()
    elif kind == "fill_then_compute":
        _fill_memory(device)
    elif kind == "slow_collective":
        seconds = float(os.environ.get("FTWATCH_SLEEP_SECONDS", "90"))
        torch.cuda._sleep(int(seconds * 2e9))    # GPU clock cycles: >= ``seconds`` at clocks <= 2 GHz
    elif kind:
        raise SystemExit(f"FTWATCH_INJECT_FAULT={kind}: not one of cuda_oom, device_assert, illegal_address, "
                         "misaligned_address, launch_failure, nccl_init_oom, graph_capture, fill_then_compute, "
                         "slow_collective, shared_gpu")


def _store_far_out_of_bounds(device: torch.device) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def far_store(ptr, offset):
        tl.store(ptr + offset, 1.0)

    buf = torch.zeros(4, device=device)
    far_store[(1,)](buf, 1 << 40)
    torch.cuda.synchronize(device)


def _store_misaligned(device: torch.device) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def misaligned_store(ptr):
        tl.store((ptr + 1).to(tl.pointer_type(tl.int64)), 1)

    buf = torch.zeros(64, dtype=torch.uint8, device=device)
    misaligned_store[(1,)](buf)
    torch.cuda.synchronize(device)


def _trap(device: torch.device) -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def trap(ptr):
        x = tl.load(ptr)
        y = tl.inline_asm_elementwise("trap; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                      is_pure=False, pack=1)
        tl.store(ptr, y)

    buf = torch.zeros(1, dtype=torch.int32, device=device)
    trap[(1,)](buf)
    torch.cuda.synchronize(device)


_held: list[torch.Tensor] = []


def _fill_memory(device: torch.device) -> None:
    """Take the device's free memory through the caching allocator, 1 GiB at a time, then smaller,
    down to 2 MiB (the allocator's smallest segment for large blocks), and keep it."""
    size = 1 << 30
    while size >= 1 << 21:
        try:
            _held.append(torch.empty(size, dtype=torch.uint8, device=device))
        except torch.OutOfMemoryError:
            size >>= 2
    free, total = torch.cuda.mem_get_info(device)
    print(f"holding {sum(t.numel() for t in _held) / 2**30:.2f} GiB of {total / 2**30:.2f}; "
          f"{free / 2**20:.0f} MiB free", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    flush = os.environ.get("FTWATCH_NO_FLUSH") != "1"
    device = device_for(local_rank)
    torch.cuda.set_device(device)
    print(f"rank {rank}/{world} on {device} ({torch.cuda.get_device_name(device)})", flush=flush)
    distributed = "MASTER_ADDR" in os.environ      # launched by torchrun or ftwatch run
    if distributed:
        timeout = os.environ.get("FTWATCH_PG_TIMEOUT")
        dist.init_process_group("nccl", device_id=device,
                                **({"timeout": datetime.timedelta(seconds=float(timeout))} if timeout else {}))
    kind = os.environ.get("FTWATCH_INJECT_FAULT", "").strip().lower()
    if kind == "shared_gpu":
        kind = ""
    fault_rank = int(os.environ.get("FTWATCH_INJECT_RANK", "0"))
    fault_step = int(os.environ.get("FTWATCH_INJECT_STEP", "5"))
    torch.manual_seed(1234 + rank)
    model = nn.Linear(256, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        if kind and rank == fault_rank and step == fault_step:
            inject(kind, device)
        x = torch.randn(512, 256, device=device)
        y = x[:, :1] * 0.5
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if distributed:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        if rank == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=flush)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        print(f"training finished at step {args.steps}", flush=flush)
    return 0


if __name__ == "__main__":
    sys.exit(main())
