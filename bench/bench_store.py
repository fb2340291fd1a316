"""`make bench` (store): ``ftwatch report`` and ``ftwatch explain`` over a long attempt's store.

A job that prints a retryable warning on every step stores a finding per step: hundreds of
thousands in one attempt, and its output counts a row per instance and 5 s bucket. This part
writes two SQLite stores of one job and one attempt, of ``SIZES`` findings each (an NCCL retry
warning with a three-line evidence, spread over 8 instances, one decision at the end whose root
cause is the last of them) and as many output count rows, and runs each command over each store in
a child process, which reports its CPU seconds and peak RSS.

Goals: both stay bounded in memory whatever the store holds: the peak RSS over the larger store
at most 1.5x that over the smaller (report: it folds the findings and the output counts as the
store pages them; explain: it keeps the first ten findings of each instance and the newest
``limits.max_findings_per_job``).
Beside them (no goal): the CPU per finding at the larger size against the smaller (at most ~1x:
linear; the fixed start-up, shared over more findings, makes it less).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import ROOT, at_most, info, report, say, workdir  # noqa: E402

SIZES = (20_000, 160_000)
INSTANCES = 8
T0 = 1_795_219_200.0
WARNING = ("node{r}:1234:1290 [{r}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
           "10.0.0.{peer} with status=12 opcode=0 len=0 vendor err 129 (Recv)")


def build_store(size: int, path: Path) -> Path:
    """A store of one job's attempt 0: ``size`` findings, then one decision (kept when it exists)."""
    if path.exists():
        return path
    from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
    from ftwatch.pipeline.sinks.base import FindingBatch, OutputBatch, RunStart
    from ftwatch.pipeline.sinks.outputcounts import OutputCounts
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    store = SqliteStore(path)
    store.write([RunStart("bench", 0, T0, ["python", "train.py"])])
    last = None
    for start in range(0, size, 10_000):
        batch = []
        for k in range(start, min(size, start + 10_000)):
            r = k % INSTANCES
            line = WARNING.format(r=r, peer=k % 250)
            last = Finding("rdma.ib_retry_exceeded", "keyword", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB,
                           Severity.WARNING, Origin(f"worker-{r}", r, "bench", f"node{r}", "stderr"), line,
                           T0 + k * 0.5, k, (f"[rank{r}] step {k}", line, "NCCL INFO retrying"))
            batch.append(last)
        store.write([FindingBatch(batch, attempt=0)])
    counts = OutputCounts(5.0)                          # as many output count rows: 5 s buckets
    for b in range(size // INSTANCES):
        for r in range(INSTANCES):
            counts.add("bench", f"worker-{r}", r, T0 + b * 5.0, 40, 4000)
        if b % 1000 == 999:
            store.write([OutputBatch(counts.closed())])
    store.write([OutputBatch(counts.drain())])
    store.write([Decision(T0 + size * 0.5 + 1, Action.RESTART_JOB, Target("bench"), last,
                          "D2 ExitCodeAndErrorMsg: retryable_infra root cause -> restart_job", 1, 2, (last,), 0)])
    store.close()
    return path


def child(command: str, db: str) -> None:
    """Run ``ftwatch <command>`` over the store ``db`` in this process; print CPU s and peak RSS."""
    from ftwatch.cli import main as cli
    argv = {"report": ["report", "--state-dir", str(Path(db).parent), "-o", str(Path(db).parent / "report.html")],
            "explain": ["explain", "--state-dir", str(Path(db).parent)]}[command]
    sys.stdout = open(os.devnull, "w")
    cpu = time.process_time()
    status = cli(argv)
    cpu = time.process_time() - cpu
    sys.stdout = sys.__stdout__
    print(json.dumps({"cpu": cpu, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "status": status}))


def run_child(command: str, db: Path) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--child", command, str(db)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    if proc.returncode:
        say(f"{command} failed: {proc.stderr.strip()[-400:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    figures = []
    stores = {}
    for size in SIZES:
        say(f"a store of {size:,} findings")
        folder = workdir() / f"store-{size}"
        folder.mkdir(exist_ok=True)
        stores[size] = build_store(size, folder / "ftwatch.db")
    small, large = SIZES
    for command in ("report", "explain"):
        got = {}
        for size in SIZES:
            say(f"{command}, {size:,} findings")
            r = run_child(command, stores[size])
            if r is None or r["status"] not in (0, None):
                continue
            got[size] = r
            figures.append(info(f"{command}, {size:,} findings: CPU", r["cpu"], "s"))
            figures.append(info(f"{command}, {size:,} findings: peak RSS", r["rss_mib"], "MiB"))
        if len(got) == 2:
            figures.append(at_most(f"{command} peak RSS, {large:,} vs {small:,} findings",
                                   got[large]["rss_mib"] / got[small]["rss_mib"], "x", 1.5))
            figures.append(info(f"{command} CPU per finding, {large:,} vs {small:,} findings",
                                (got[large]["cpu"] / large) / (got[small]["cpu"] / small), "x", "at most ~1x: linear; the start-up shared over more findings makes it less"))
    report("store (report and explain over a long attempt)", figures)


if __name__ == "__main__":
    main()
