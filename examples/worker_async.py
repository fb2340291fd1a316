"""Independent workers for Async mode (no collectives): each one works alone and exits 0.

Run under ``ftwatch run --job-execution-mode=Async --nproc-per-node 3 -- python examples/worker_async.py``.
Each worker prints its ``MA_PROC_START_CNT`` at start, then ``rank R step i/N`` for ``--steps``
steps, then ``rank R done`` and exits 0. No torch: it starts in milliseconds.

Fault injection (environment):
    FTWATCH_INJECT_FAULT=crash  the rank ``FTWATCH_INJECT_RANK`` (default 1) raises an NCCL
        "unhandled system error" (a retryable infrastructure error) at step ``FTWATCH_INJECT_STEP``
        (default 3) and exits 1, on its first start only (``MA_PROC_START_CNT`` is 1), so that a
        restart of that one instance succeeds. ``FTWATCH_INJECT_ATTEMPTS=all`` crashes every start.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# The form of the error PyTorch's ProcessGroupNCCL raises for ncclSystemError (a system call, e.g. on
# a socket, failed); the file, line and NCCL version are an example, not a particular release.
NCCL_ERROR = ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled "
              "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="steps to run (default 10)")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds per step (default 0.05)")
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    starts = int(os.environ.get("MA_PROC_START_CNT", "1"))
    print(f"rank {rank} starting: MA_PROC_START_CNT={starts}", flush=True)
    crash_step = _crash_step(rank, starts)
    for step in range(1, args.steps + 1):
        if step == crash_step:
            _all_reduce_gradients(rank)
        print(f"rank {rank} step {step}/{args.steps}", flush=True)
        time.sleep(args.step_time)
    print(f"rank {rank} done", flush=True)
    return 0


def _crash_step(rank: int, starts: int) -> int | None:
    """The step this start must crash at, or None."""
    if os.environ.get("FTWATCH_INJECT_FAULT", "").strip().lower() != "crash":
        return None
    if rank != int(os.environ.get("FTWATCH_INJECT_RANK", "1")):
        return None
    every = os.environ.get("FTWATCH_INJECT_ATTEMPTS", "first").strip().lower() == "all"
    if starts != 1 and not every:
        return None
    return int(os.environ.get("FTWATCH_INJECT_STEP", "3"))


def _all_reduce_gradients(rank: int) -> None:
    """Stands in for a collective whose network fails: raises as ProcessGroupNCCL would."""
    raise RuntimeError(NCCL_ERROR)


if __name__ == "__main__":
    sys.exit(main())
