"""A tiny but real PyTorch DDP trainer (gloo, CPU) for ftwatch demos and tests.

Run it under ``ftwatch run --nproc-per-node 3 -- python examples/train_ddp.py`` (or torchrun): it
reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the environment, trains a
Linear(16 -> 1) on synthetic data, checkpoints atomically on rank 0 and resumes from the last
checkpoint on every start. Output per step: ``step 12/30 loss 0.4312`` (rank 0 every step, the other
ranks every ``LOG_EVERY`` steps); at the end ``training finished at step 30``.

Data parallelism is what DDP does, by hand: every step all-reduces (gloo) and averages the
gradients, then a small SGD-with-momentum updates the weights. Constructing
``DistributedDataParallel`` or any ``torch.optim`` optimizer imports ``torch._dynamo`` (about 800
modules, 1 to 1.5 s of CPU per process, measured with torch 2.13 CPU), which would double the run
time of a 3-worker job on 2 cores; ``--ddp`` uses the real wrapper when that matters.

Fault injection (environment):
    FTWATCH_INJECT_FAULT     ``sigkill`` (the rank SIGKILLs itself), ``keyerror`` (a user bug: an
                             uncaught KeyError from a config lookup, on every attempt), ``sigstop``
                             (the rank SIGSTOPs itself: a hang), ``exit0`` (the rank exits 0 early
                             while the others block silently in the next collective).
    FTWATCH_INJECT_RANK      the rank that fails (default 1).
    FTWATCH_INJECT_STEP      the step it fails at, before the step's collective (default 8).
    FTWATCH_INJECT_ATTEMPTS  ``first`` (default: only while TORCHELASTIC_RESTART_COUNT is 0) or
                             ``all`` (every attempt, to use up the restart budget).

``exit0`` and gloo: on NCCL a rank that leaves is not noticed by its peers until the watchdog times
out, so they hang silently. Gloo notices a closed TCP connection at once ("Connection closed by
peer"), so to reproduce the NCCL behaviour the leaving rank forks a small keeper process that holds
the rank's connections open (and drains them) until a peer closes one or ``--timeout`` passes. The
keeper lets go of stdout/stderr and stays in the worker's process group, so the supervisor still
sees the rank's exit 0 at once and kills the keeper with the group when it stops the job.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import stat
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

LOG_EVERY = 5                    # steps between progress lines on ranks other than 0
CHECKPOINT_NAME = "checkpoint.pt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="total training steps (default 30)")
    p.add_argument("--step-time", type=float, default=0.1,
                   help="seconds to sleep per step, to make the run observable (default 0.1)")
    p.add_argument("--checkpoint-dir", default="./checkpoints", help="where rank 0 saves (default ./checkpoints)")
    p.add_argument("--checkpoint-every", type=int, default=5, help="save every K steps (default 5)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="collective timeout in seconds (default 1800, torch's default for gloo)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ddp", action="store_true",
                   help="wrap the model in DistributedDataParallel (slower start, see above)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"rank {rank}/{world} starting: attempt {attempt}, "
          f"MA_PROC_START_CNT={os.environ.get('MA_PROC_START_CNT', '1')}", flush=True)
    fault = _fault_for(rank, attempt)

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    optimizer = SGD(list(model.parameters()), lr=args.lr)
    path = os.path.join(args.checkpoint_dir, CHECKPOINT_NAME)
    start = 0
    if os.path.exists(path):
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"resumed from checkpoint at step {start}", flush=True)
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model)
    else:
        ddp = model
    true_w = torch.linspace(-1.0, 1.0, 16)

    for step in range(start + 1, args.steps + 1):
        if fault is not None and step == fault[1]:
            _inject(fault[0], rank, step, args.timeout)
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(32, generator=gen)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(x).squeeze(1), y)
        loss.backward()
        if not args.ddp:                     # DDP all-reduces in backward(); else do it here
            for p in model.parameters():
                dist.all_reduce(p.grad)      # the collective every rank must reach
                p.grad /= world
        optimizer.step()
        if rank == 0 or step % LOG_EVERY == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        if rank == 0 and (step % args.checkpoint_every == 0 or step == args.steps):
            _save(path, model, optimizer, step)
        time.sleep(args.step_time)

    dist.barrier()
    print(f"training finished at step {args.steps}", flush=True)
    dist.destroy_process_group()
    return 0


def _exit(status: int) -> None:
    """Exit without the interpreter's teardown of torch's modules (0.5 s of CPU per process,
    measured with torch 2.13 CPU); the checkpoint is closed and the streams are flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class SGD:
    """SGD with momentum and the optimizer ``state_dict`` interface (without torch.optim's import cost).

    Args:
        params: the parameters (tensors with ``.grad``), in a fixed order.
        lr: the learning rate. momentum: the momentum factor.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float = 0.9):
        self.params, self.lr, self.momentum = params, lr, momentum
        self.buffers = [torch.zeros_like(p) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, buf in zip(self.params, self.buffers):
            buf.mul_(self.momentum).add_(p.grad)
            p.sub_(self.lr * buf)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum, "buffers": [b.clone() for b in self.buffers]}

    def load_state_dict(self, state: dict) -> None:
        self.lr, self.momentum = float(state["lr"]), float(state["momentum"])
        self.buffers = [b.clone() for b in state["buffers"]]


def _fault_for(rank: int, attempt: int) -> tuple[str, int] | None:
    """(kind, step) when this rank must fail in this attempt, else None."""
    kind = os.environ.get("FTWATCH_INJECT_FAULT", "").strip().lower()
    if not kind or rank != int(os.environ.get("FTWATCH_INJECT_RANK", "1")):
        return None
    if kind not in ("sigkill", "keyerror", "sigstop", "exit0"):
        raise SystemExit(f"unknown FTWATCH_INJECT_FAULT={kind!r}")
    every = os.environ.get("FTWATCH_INJECT_ATTEMPTS", "first").strip().lower() == "all"
    if kind != "keyerror" and not every and attempt != 0:
        return None
    return kind, int(os.environ.get("FTWATCH_INJECT_STEP", "8"))


def _inject(kind: str, rank: int, step: int, timeout: float) -> None:
    print(f"injecting fault {kind} at step {step}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "keyerror":
        config = {"lr": 0.05, "batch_size": 32, "schedule": "constant"}
        warmup = config["warmup_steps"]      # the bug: a key nobody set
        print(f"warmup {warmup}")
    elif kind == "exit0":
        print(f"rank {rank} has no more data at step {step}; leaving", flush=True)
        _keep_connections_open(timeout)
        os._exit(0)                          # no destructors: they would shut the sockets down


def _keep_connections_open(timeout: float) -> None:
    """Fork a keeper that holds this process's sockets open (see the module docstring)."""
    if os.fork() != 0:
        return
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        socks = set()
        for name in os.listdir("/proc/self/fd"):
            try:
                if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                    socks.add(int(name))
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while socks and time.monotonic() < deadline:
            readable, _, _ = select.select(list(socks), [], [], 1.0)
            for fd in readable:
                try:
                    if not os.read(fd, 65536):   # a peer is gone: the job is ending
                        os._exit(0)
                except OSError:                  # a listening socket: not ours to drain
                    socks.discard(fd)
    finally:
        os._exit(0)


def _save(path: str, model: nn.Module, optimizer: SGD, step: int) -> None:
    """Write the checkpoint atomically: a temporary file, fsync, then os.replace."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    _exit(main())
