#!/usr/bin/env python3
"""``ftwatch run`` under load: error line -> decision latency, monitor CPU and RSS (issue 16 items 3, 4).

Starts ``ftwatch run`` with N workers (this script, as ``--worker``) that print background output
at a total rate (10 k and 50 k lines/s by default; a share of it step lines, the straggler tap's
input) and, at a known moment, a fatal line; then measures, per trial:

* latency: the fatal line's write time (the worker notes it, after its ``write`` returned) to
  the decision's time (``Decision.time`` from ``--decisions-file``: taken at the verdict, before
  alerts and storage);
* monitor CPU: user + system CPU seconds of the ``ftwatch`` process (all its threads, from
  ``/proc/<pid>/stat``) over the steady window (``--window`` s, from 1.5 s after the workers
  started: the monitor's start-up is not in it) before the fatal line, per wall second (1.0 = one
  core);
* RSS: the largest ``VmRSS`` of that process sampled during the window;
* the rate the workers achieved (a monitor that is slower than its workers slows their pipes:
  backpressure; the old monitor instead queued without bound).

Scenarios (``--scenario``):

* ``one``: rank 0 prints the fatal line and exits 1, the others train on: the settle window runs to
  its bound (``--settle-max``, default 1 s), so the goal is 100 ms + the bound;
* ``all``: rank 0 prints the fatal line and exits 1; every other rank notices it (within a
  millisecond), prints its own error (an NCCL error) and hangs: an event-driven settle ends when
  all have reported.

Goals (issue 16): p99 latency <= 100 ms + the settle bound at 50 k lines/s; monitor CPU <= 5 % of
a core at 10 k lines/s. Each is printed as ``met`` / ``NOT met``.

Usage::

    python bench/bench_run.py [--rates 10000,50000] [--trials 5] [--workers 3] [--window 4]
                              [--ftwatch PATH] [--quiet] [--settle-max S] [--json OUT]

Older ``ftwatch`` builds without ``--settle-max`` / ``--quiet`` are run without those flags (the
settle bound then is their fixed 1 s). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

FATAL = "RuntimeError: CUDA error: an illegal memory access was encountered"
PEER = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
        "remote process exited or there was a network error, NCCL version 2.19.3")
STEP_SHARE = 0.3          # of the background lines, step lines (Megatron's, with their step time)
TICK = 0.001              # a worker writes the lines due every TICK seconds, one write(2) per line
TRIAL_TIMEOUT = 60.0      # seconds after the fatal line before a trial is given up


# --------------------------------------------------------------------------- the worker

def worker(rate: float, fatal_at: float, scenario: str, notes: Path) -> None:
    """One training worker: ``rate`` lines/s of background output. Rank 0 fails ``fatal_at``
    seconds after its start (prints FATAL, exits 1); the others train on (``one``), or, once they
    notice it (``all``: within a millisecond, as NCCL notices a dead peer), print PEER and hang."""
    rank = int(os.environ.get("RANK", "0"))
    fd = sys.stdout.fileno()
    other = [f"[data] rank {rank} batch {i} tokens 524288 seq 4096 mem 61.2GiB util 97% ok\n".encode()
             for i in range(1024)]
    every = int(round(1 / STEP_SHARE))
    fatal = notes / "fatal"
    start = time.monotonic()
    (notes / f"start-{rank}").write_text(f"{time.time()}\n")
    sent = step = 0
    noted = False
    while True:
        now = time.monotonic() - start
        if now >= fatal_at and not noted:
            (notes / f"rate-{rank}").write_text(f"{sent / now}\n")
            noted = True
            if rank == 0:
                break
        if rank and scenario == "all" and fatal.exists():
            if not noted:
                (notes / f"rate-{rank}").write_text(f"{sent / max(now, 1e-3)}\n")
            break
        due = int(now * rate) + 1 - sent
        for n in range(sent, sent + due):    # as print() with PYTHONUNBUFFERED: a write per line
            if n % every:
                os.write(fd, other[n % len(other)])
                continue
            step += 1           # every rank steps at the same pace: no straggler
            os.write(fd, f" iteration {step:8d}/  100000 | consumed samples: {step * 512:10d} | elapsed time "
                         f"per iteration (ms): 245.0 | lr: 3.0E-04 | loss: 2.4410 |\n".encode())
        sent += max(0, due)
        time.sleep(TICK)
    if rank == 0:
        said = time.time()
        os.write(fd, (FATAL + "\n").encode())
        fatal.write_text(f"{said}\n")
        sys.exit(1)
    os.write(fd, (PEER + "\n").encode())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:                 # hang (a real peer blocks in the collective) until stopped
        time.sleep(3600)


# --------------------------------------------------------------------------- measuring

def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _decision(path: Path) -> dict | None:
    """The decision on the fatal line in the decisions file (not a straggler's notify), or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue                    # a line still being written
        if (d.get("root_cause") or {}).get("line", "").strip() in (FATAL, PEER):
            return d
    return None


def _epoch(value) -> float:
    """A decision's ``time``: ISO 8601 (the decisions file, millisecond precision) or epoch seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.fromisoformat(value).timestamp()


def _supports(ftwatch: list[str], flag: str) -> bool:
    out = subprocess.run([*ftwatch, "run", "--help"], capture_output=True, text=True)
    return flag in out.stdout


def trial(ftwatch: list[str], rate: float, workers: int, window: float, scenario: str, flags: list[str],
          warmup: float = 1.5, step_tap: bool = True) -> dict:
    """One run: returns latency (s or None), cpu (cores), rss (MiB), achieved rate (lines/s)."""
    tmp = Path(tempfile.mkdtemp(prefix="ftwatch-bench-run-"))
    notes = tmp / "notes"
    notes.mkdir()
    decisions = tmp / "decisions.jsonl"
    config = tmp / "config.yaml"
    config.write_text("policy:\n  fault_tolerant_policy: OnFailure\n  enable_job_restart: false\n"
                      "health:\n  bootcheck: false\n  troubleshooting: false\n"
                      + ("" if step_tap else "  straggler:\n    enabled: false\n"))
    fatal_at = warmup + window + 0.5      # seconds after the workers' start (the monitor's own start-up before)
    cmd = [*ftwatch, "run", "--config", str(config), "--nproc-per-node", str(workers), "--state-dir",
           str(tmp / "state"), "--decisions-file", str(decisions), "--job-id", "bench", *flags, "--",
           sys.executable, os.path.abspath(__file__), "--worker", str(rate / workers), str(fatal_at),
           scenario, str(notes)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cpu0 = t0 = None
        rss = 0.0
        began = time.monotonic() + TRIAL_TIMEOUT
        while not (notes / "start-0").exists():       # imports, rules compiled, workers started
            if proc.poll() is not None or time.monotonic() > began:
                raise RuntimeError(f"ftwatch run did not start its workers: {' '.join(cmd)}")
            time.sleep(0.02)
        begin = time.monotonic()
        while True:
            rss = max(rss, _rss_mib(proc.pid) or 0.0)
            now = time.monotonic() - begin
            if cpu0 is None and now >= warmup:
                cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
            if cpu0 is not None and now >= warmup + window:
                break
            time.sleep(0.1)
        cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        cpu = (cpu1 - cpu0) / (t1 - t0) if cpu0 is not None and cpu1 is not None else None
        deadline = time.monotonic() + fatal_at + TRIAL_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if _decision(decisions) is not None:
                break
            rss = max(rss, _rss_mib(proc.pid) or 0.0)
            time.sleep(0.05)
        latency = None
        decided = _decision(decisions)
        if decided is not None and (notes / "fatal").exists():
            latency = _epoch(decided["time"]) - float((notes / "fatal").read_text())
        achieved = sum(float(p.read_text()) for p in notes.glob("rate-*")) if list(notes.glob("rate-*")) else None
        return {"latency": latency, "cpu": cpu, "rss": rss, "achieved": achieved}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation (p99 of a few trials is near their max)."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="10000,50000", help="total background lines/s, comma-separated")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--window", type=float, default=4.0, help="seconds of steady output measured per trial")
    p.add_argument("--scenario", default="one,all", help="one, all, or both (comma-separated)")
    p.add_argument("--ftwatch", default=None,
                   help="the ftwatch executable (default: this checkout's, as python -m ftwatch)")
    p.add_argument("--quiet", action="store_true", help="pass --quiet (no echo of the workers' output)")
    p.add_argument("--settle-max", type=float, default=None, help="pass --settle-max S")
    p.add_argument("--no-step-tap", action="store_true",
                   help="turn the straggler step tap off (health.straggler.enabled: false): the loop's own "
                        "cost without the engine's per-step-line work")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    # default: this checkout's ftwatch, run by this Python (not whatever the venv's script imports);
    # -P: ``-m`` would put the working directory first on sys.path, so a bench started from another
    # checkout would measure that one's ftwatch (PYTHONPATH below names this one)
    ftwatch = [args.ftwatch] if args.ftwatch else [sys.executable, "-P", "-m", "ftwatch"]
    if not args.ftwatch:
        root = str(Path(__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    flags = []
    if args.quiet:
        if _supports(ftwatch, "--quiet"):
            flags.append("--quiet")
        else:
            print("bench_run: this ftwatch has no --quiet; echoing", file=sys.stderr)
    settle = 1.0
    if args.settle_max is not None:
        if _supports(ftwatch, "--settle-max"):
            flags += ["--settle-max", str(args.settle_max)]
            settle = args.settle_max
        else:
            print("bench_run: this ftwatch has no --settle-max; its settle is a fixed 1 s", file=sys.stderr)
    results = []
    print(f"ftwatch run bench: {args.workers} workers, {args.trials} trials, {args.window:g} s windows, "
          f"{int(STEP_SHARE * 100)} % step lines, step tap {'off' if args.no_step_tap else 'on'}, "
          f"settle bound {settle:g} s, flags {' '.join(flags) or '-'}")
    for scenario in args.scenario.split(","):
        for rate in (float(r) for r in args.rates.split(",")):
            runs = [trial(ftwatch, rate, args.workers, args.window, scenario, flags, step_tap=not args.no_step_tap)
                    for _ in range(args.trials)]
            lat = [r["latency"] for r in runs if r["latency"] is not None]
            cpu = [r["cpu"] for r in runs if r["cpu"] is not None]
            rss = [r["rss"] for r in runs]
            ach = [r["achieved"] for r in runs if r["achieved"] is not None]
            row = {"scenario": scenario, "rate": rate, "trials": len(runs), "decided": len(lat),
                   "p50_ms": pct(lat, 0.5) * 1000 if lat else None, "p99_ms": pct(lat, 0.99) * 1000 if lat else None,
                   "cpu_pct": statistics.median(cpu) * 100 if cpu else None, "rss_mib": max(rss) if rss else None,
                   "achieved": statistics.median(ach) if ach else None, "settle": settle}
            results.append(row)
            _print_row(row)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    _report(results)
    return 0


def _report(results: list[dict]) -> None:
    """The figures for ``make bench`` (``bench/run.py``: ``FIGURE`` lines through ``benchlib``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib import at_most, info, report
    figures = []
    for r in results:
        k = f"{int(r['rate']) // 1000}k lines/s"
        what = {"one": "one rank fails, others train on", "all": "every rank reports"}.get(r["scenario"], r["scenario"])
        if r["p99_ms"] is not None:
            bound = 100 + r["settle"] * 1000
            p99 = r["p99_ms"] if r["decided"] == r["trials"] else float("inf")
            figures.append(at_most(f"run error->decision p99, {k} ({r['scenario']})", p99, "ms", bound,
                                   f"{what}; 100 ms + the {r['settle']:g} s settle bound; p50 {r['p50_ms']:.0f} ms"))
        if r["cpu_pct"] is not None:
            name = f"run monitor CPU, {k} ({r['scenario']})"
            figures.append(at_most(name, r["cpu_pct"], "%", 5.0, "of one core, step lines included")
                           if int(r["rate"]) <= 10000 else info(name, r["cpu_pct"], "%", "of one core"))
        if r["rss_mib"] is not None:
            figures.append(info(f"run monitor RSS, {k} ({r['scenario']})", r["rss_mib"], "MiB"))
    report("run", figures)


def _print_row(r: dict) -> None:
    rate = int(r["rate"])
    head = f"  [{r['scenario']}] {rate // 1000} k lines/s"
    if r["p50_ms"] is None:
        print(f"{head}: no decision within {TRIAL_TIMEOUT:g} s in {r['trials']} trials: latency goal NOT met")
    else:
        bound = 100 + r["settle"] * 1000
        ok = "met" if r["p99_ms"] <= bound and r["decided"] == r["trials"] else "NOT met"
        print(f"{head}: error line -> decision p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms "
              f"({r['decided']}/{r['trials']} decided; goal p99 <= {bound:.0f} ms: {ok})")
    if r["cpu_pct"] is not None:
        goal = f"; goal <= 5 %: {'met' if r['cpu_pct'] <= 5 else 'NOT met'}" if rate <= 10000 else ""
        print(f"{head}: monitor CPU {r['cpu_pct']:.1f} % of a core{goal}; RSS max {r['rss_mib']:.0f} MiB")
    if r["achieved"] is not None:
        slowed = " (the workers were slowed: backpressure)" if r["achieved"] < 0.9 * r["rate"] else ""
        print(f"{head}: workers wrote {r['achieved']:.0f} lines/s of {rate}{slowed}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
    else:
        sys.exit(main())
