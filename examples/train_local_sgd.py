"""A small real trainer whose ranks do not meet every step (local SGD, gloo, CPU): a straggler demo.

In synchronous data parallel training (``train_ddp.py``) every rank waits for the slowest in each
step's all-reduce, so the time between step lines is the same on every rank. Here each rank trains
its own copy of a Linear(16 -> 1) on its own data and the ranks average their weights (all-reduce)
only every ``--sync-every`` steps, as local SGD does; a slow rank's steps are visibly slower. Every
rank prints ``step N/M loss X`` every step; at the end ``training finished at step M``.

Run it under ``ftwatch run --nproc-per-node 3 -- python examples/train_local_sgd.py``.

Fault injection (environment): ``FTWATCH_SLOW_RANK`` (the rank that is slow, default none) and
``FTWATCH_SLOW_SECONDS`` (extra seconds per step on that rank, default 0.2): CPU contention or a
throttled accelerator, as far as the step lines can tell.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of sleep per step (default 0.05)")
    p.add_argument("--sync-every", type=int, default=5, help="average the weights every K steps (default 5)")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    slow = os.environ.get("FTWATCH_SLOW_RANK", "")
    extra = float(os.environ.get("FTWATCH_SLOW_SECONDS", "0.2")) if slow and int(slow) == rank else 0.0
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    true_w = torch.linspace(-1.0, 1.0, 16)
    for step in range(1, args.steps + 1):
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=gen)
        y = x @ true_w
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.05 * param.grad
        time.sleep(args.step_time + extra)
        if step % args.sync_every == 0:
            with torch.no_grad():
                for param in model.parameters():
                    dist.all_reduce(param)
                    param /= world
        print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    print(f"training finished at step {args.steps}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
