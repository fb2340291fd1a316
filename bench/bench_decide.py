"""`make bench` (decide): decision time and memory for a failure log of 8 / 64 / 512 / 4,096 ranks.

Each log is one combined file (torchrun's ``[rankN]:`` prefixes): every rank prints 20 Megatron
step lines, then one rank raises a KeyError (the recorded traceback of ``tests/golden``) and every
other rank prints gloo's ``Connection closed by peer`` fallout. A child process replays it with the
default config's engine (the step tap on) and reports the CPU seconds from the first line to the
decision, the step tap's own share of it, and the memory the replay added (peak RSS minus RSS
before); each log is replayed by ``RUNS`` children, the runs going round the sizes (``series``),
and the median CPU counts. Beside the 4,096-vs-512 ratio, the same ratio of the step tap's CPU
and of the rest's (no goal): which part grows.

Goal: decision time linear in ranks: the CPU per rank at 4,096 ranks at most 1.5x that at 512 (and
beside it, no goal, 8,192 against 4,096: more ranks than a 1 MiB chunk has step lines, each rank
printing in every second chunk, no longer in every one, where a per-rank cost of a chunk that
misses the rank shows: a parse of each such rank's last stamp, ~1 s of a 5-7 s replay, until the
step tap held those unread (``stragglers.HELD_CHUNKS``, now ``HELD_BYTES`` too); with the same work per chunk, it then read
1.3-1.5x, the collector's young passes rescanning twice the ranks' state, until a replay raised their
threshold (``replay.REPLAY_GC_THRESHOLD``): 1.0-1.2x since); the
same where the step lines carry no time and state no duration (``failure_log(untimed=True)``:
each line's time is counted from the lines before it, a count that once ran from the chunk's
start for every line); and the same where every rank prints a traceback of its own and then
nothing (``traceback_log``: a store timeout, as every rank of a job whose store went away prints it).

Beside it (no goal): an error-dense log, the same failures printed again and again (``REPEATS``
times one unit: two recorded corpus failures, a hung NCCL watchdog glued to a progress bar and an
Ascend stream-sync timeout, then a kernel's assert printed by 64 threads before its process raises
cudaErrorAssert, then a run of NCCL result codes), and its CPU per unit at the most repeats against
the fewest: ~1x while the decision's reading of each finding stays linear in the findings.
"""

from __future__ import annotations

import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import ROOT, at_most, info, report, say, step_lines, workdir  # noqa: E402

RANKS = (8, 64, 512, 4_096, 8_192)
STEPS = 20
REPEATS = (100, 400)
RUNS = 3            # children per log; the median CPU counts (``series``)
#: recorded failures the repeated unit holds (tests/corpus)
UNIT_CASES = ("flagembedding-negatives-cross-device-all-gather-watchdog-timeout-4gpu/train.log",
              "npu-16card-ee1002-stream-sync-timeout/combined.log")
ASSERT = ("[rank{r}]: /opt/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [{b},0,0], "
          "thread: [{t},0,0] Assertion `index >= -sizes[i] && index < sizes[i] && \"index out of bounds\"` failed.")
NCCL_CODE = ("[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
             "NCCLUtils.hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1")


#: every rank's own traceback in ``traceback_log``: a store timeout at the start, as each rank of a job whose store
#: went away prints it (c10d's ``DistBackendError``), the C++ stack's heading last (the rank prints nothing after)
STORE_TIMEOUT = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', "    dist.barrier()",
                 "torch.distributed.DistBackendError: [{r}] is setting up NCCL communicator and retrieving ncclUniqueId "
                 "from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout",
                 "Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:604 (most recent call "
                 "first):"]


def traceback_log(ranks: int, path: Path) -> Path:
    """Every rank's step lines, then every rank's own traceback (:data:`STORE_TIMEOUT`), in one file."""
    with path.open("w") as fh:
        for line in step_lines(STEPS * ranks, ranks=ranks):
            fh.write(line.decode() + "\n")
        for r in range(ranks):
            fh.writelines(f"[rank{r}]: {line.format(r=r)}\n" for line in STORE_TIMEOUT)
    return path


def repeated_log(repeats: int, path: Path) -> Path:
    """The error-dense log: ``repeats`` units (the module docstring) in one combined file."""
    unit = "".join((ROOT / "tests" / "corpus" / case).read_text() for case in UNIT_CASES).splitlines()
    with path.open("w") as fh:
        for k in range(repeats):
            fh.writelines(line + "\n" for line in unit)
            fh.writelines(ASSERT.format(r=k % 4, b=k, t=t) + "\n" for t in range(64))
            fh.write(f"[rank{k % 4}]: RuntimeError: CUDA error: device-side assert triggered\n")
            fh.writelines(NCCL_CODE.format(r=r) + "\n" for r in range(8))
    return path


def run_child(path: Path) -> dict | None:
    """The child's figures for one log (None when it failed: said)."""
    proc = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    if proc.returncode:
        say(f"child failed: {proc.stderr.strip()[-400:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def failure_log(ranks: int, path: Path, untimed: bool = False) -> Path:
    """The module docstring's failure log; ``untimed``: its step lines carry no timestamp and
    state no duration (``[rankN]: step S loss X``), so the step tap times each from the lines
    before it in its chunk, asked rank by rank (``ftwatch.rules.lineclock``)."""
    golden = (ROOT / "tests" / "golden" / "torchrun_keyerror" / "combined.log").read_text().splitlines()
    traceback = [line.split("]:", 1)[1] for line in golden if line.startswith("[default1]:")]
    bad = ranks // 2
    with path.open("w") as fh:
        if untimed:
            for s in range(STEPS):
                fh.writelines(f"[rank{r}]: step {s} loss 0.{r % 97:02d} lr 1e-4\n" for r in range(ranks))
        else:
            for line in step_lines(STEPS * ranks, ranks=ranks):
                fh.write(line.decode() + "\n")
        for line in traceback:
            fh.write(f"[rank{bad}]:{line}\n")
        for r in range(ranks):
            if r != bad:
                fh.write(f"[rank{r}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                         f"Connection closed by peer [10.0.{r // 256}.{r % 256}]:29500\n")
    return path


def child(path: str) -> None:
    from ftwatch.config.model import Config
    from ftwatch.pipeline.build import build_engine, build_policy
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.replay import replay
    from ftwatch.policy.budgets import BudgetStore
    config = Config()
    engine = build_engine(config)
    # budgets in memory, as ``ftwatch replay`` keeps them without --state-dir: a file under the
    # bench's folder was read and written by every child in turn, so a child's decision wrote
    # back every earlier child's attempts and same-error counts (4,096 after the tracebacks' log)
    policy = build_policy(config, "bench", BudgetStore(None, "bench"), in_memory=True, state_dir=Path(path).parent)
    steps, tap = engine._steps, [0.0]

    def timed_steps(*args, **kwargs):                 # the step tap's own CPU (as bench_engine times it)
        start = time.process_time()
        try:
            return steps(*args, **kwargs)
        finally:
            tap[0] += time.process_time() - start
    engine._steps = timed_steps
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    cpu = time.process_time()
    result = replay([Path(path)], engine, policy, "bench", recorder=Recorder(out=io.StringIO(), resolve_after=None))
    cpu = time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"cpu": cpu, "tap": tap[0], "added_mib": (peak - max(rss, 0)) / 1024.0 if peak > before else 0.0,
                      "action": result.decision.action.label, "findings": len(result.findings)}))


def series(figures: list, sizes: tuple[int, ...], make: Callable[[int], Path], label: str,
           lines: Callable[[int], str] | None = None, taps: dict[int, float] | None = None) -> dict[int, float]:
    """Replay the log ``make(size)`` of each size in a child, ``RUNS`` times (the median CPU: one
    run's CPU varied by ~15 % from run to run); its decision and memory figures go to ``figures``,
    labelled ``label`` (``{size}`` in it); returns per size the CPU seconds per unit of size (a
    rank, a repeat), and puts the step tap's own share of them (its median) in ``taps``.

    The runs go round the sizes (every size once, then again): the sizes' medians then span the same
    stretch of time, not each its own. That did not remove the ratios' swing; its likely cause is a
    machine whose caches are shared: a 4,096-rank replay's state (~30 MiB) does not fit in them, a
    512-rank one's (~8 MiB) mostly does, so another tenant's load slows the larger more (in the run
    that read 1.55x, 8,192 against 4,096 ranks read 1.03x: the large ones alike). The ratio of 4,096
    to 512 ranks read 1.36x-1.93x in earlier stops' runs (one size after the other) and 0.96x, 1.09x
    and 1.55x in three runs of one day (going round, issue 16).

    What grows from 512 to 4,096 ranks is the step tap's work per rank and chunk: a 1 MiB chunk
    holds ~8 Megatron lines of each of 512 ranks (the tap reads each rank's last 4,
    ``rules.steptail``) but one of each of 4,096, so that work runs once per line (the tap's CPU
    per rank, the least of 3: ~90 us at 512 ranks, ~220 us at 4,096; the rest of the replay ~100
    and ~80 us). A slotted ``Rank``, one time reader per chunk instead of an object per rank, and
    fewer dicts per chunk took 12 % of the tap's Python opcodes at 4,096 ranks (counted with
    ``sys.settrace``, which the machine's load does not move); one ``bench_decide`` run then read
    1.35x. A replay now reads chunks long enough for the tap to find ~4 lines of each rank
    (``Engine.chunk_bytes``, 4 MiB at most: at 4,096 ranks 4 MiB), so that work is shared by a
    rank's few lines again: the instructions of the 4,096-rank replay (cachegrind) 14 % fewer, the
    CPU per rank in one run 1.06x that at 512 (tracebacks 1.22x), at ~13 MiB more memory (the longer
    chunk's step lines in flight; issue 16)."""
    paths = {size: make(size) for size in sizes}
    runs: dict[int, list[dict]] = {size: [] for size in sizes}
    for round_no in range(RUNS):
        for size in sizes:
            say(f"{label.format(size=f'{size:,}')} ({round_no + 1} of {RUNS})")
            result = run_child(paths[size])
            if result is not None:
                runs[size].append(result)
    per: dict[int, float] = {}
    for size in sizes:
        if not runs[size]:
            continue
        name = label.format(size=f"{size:,}")
        r = {**runs[size][0], "cpu": statistics.median(x["cpu"] for x in runs[size]),
             "tap": statistics.median(x["tap"] for x in runs[size])}
        per[size] = r["cpu"] / size
        if taps is not None:
            taps[size] = r["tap"] / size
        note = (f"{r['action']}, {r['findings']} findings" + (f", {lines(size)}" if lines else "")
                + f"; the step tap {r['tap'] * 1000.0:.0f} ms of it")
        figures.append(info(f"decision, {name}", r["cpu"] * 1000.0, "ms", note))
        figures.append(info(f"memory, {name}", r["added_mib"], "MiB"))
    return per


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    figures: list = []
    taps: dict[int, float] = {}
    per_rank = series(figures, RANKS, lambda n: failure_log(n, workdir() / f"fail-{n}.log"), "{size} ranks",
                      lambda n: f"{(STEPS + 1) * n:,} lines", taps)
    if 512 in per_rank and 4_096 in per_rank:
        figures.append(at_most("CPU per rank, 4,096 vs 512 ranks", per_rank[4_096] / per_rank[512], "x", 1.5))
        figures.append(info("of it, the step tap's CPU per rank, 4,096 vs 512 ranks", taps[4_096] / taps[512], "x",
                            f"{taps[512] * 1e6:.0f} and {taps[4_096] * 1e6:.0f} us a rank: at 4,096 ~4 step lines a "
                            "rank and 4 MiB chunk, at 512 ~8 a rank and 1 MiB (series)"))
        rest = {n: per_rank[n] - taps[n] for n in (512, 4_096)}
        figures.append(info("the rest's CPU per rank, 4,096 vs 512 ranks", rest[4_096] / rest[512], "x",
                            f"{rest[512] * 1e6:.0f} and {rest[4_096] * 1e6:.0f} us a rank"))
    if 4_096 in per_rank and 8_192 in per_rank:
        figures.append(info("CPU per rank, 8,192 vs 4,096 ranks", per_rank[8_192] / per_rank[4_096], "x",
                            "~1x: past a chunk's step lines per rank too"))
    per_rank = series(figures, (512, 4_096), lambda n: failure_log(n, workdir() / f"untimed-{n}.log", untimed=True),
                      "{size} ranks, untimed step lines")
    if len(per_rank) == 2:
        figures.append(at_most("CPU per rank, 4,096 vs 512 ranks, untimed step lines",
                               per_rank[4_096] / per_rank[512], "x", 1.5))
    per_rank = series(figures, (512, 4_096), lambda n: traceback_log(n, workdir() / f"tracebacks-{n}.log"),
                      "{size} ranks, every rank's traceback")
    if len(per_rank) == 2:
        figures.append(at_most("CPU per rank, 4,096 vs 512 ranks, every rank's traceback",
                               per_rank[4_096] / per_rank[512], "x", 1.5))
    per_unit = series(figures, REPEATS, lambda n: repeated_log(n, workdir() / f"repeated-{n}.log"),
                      "{size} repeated failures")
    if len(per_unit) == len(REPEATS):
        few, most = REPEATS[0], REPEATS[-1]
        figures.append(info(f"CPU per repeat, {most} vs {few} repeats", per_unit[most] / per_unit[few], "x",
                            "~1x: linear in the findings"))
    report("decide (failure logs by rank count, step tap on)", figures)


if __name__ == "__main__":
    main()
