"""Soak part 3: ``kill -9`` of ``ftwatch run`` mid-job, repeated; orphans and budgets.

The job is a small Python worker, 3 ranks, each ignoring SIGTERM (a worker that does not die
with its peers) and holding a ``sleep`` child in its process group. On attempt 0 rank 1 SIGKILLs
itself, so ``run`` decides ``restart_job`` and the job goes on at attempt 1. Each cycle starts
``ftwatch run`` on the same state directory, waits for all three ranks to report, and SIGKILLs
``run``. Then:

- workers alive 10 s after the kill: the parent-death signal must have ended every worker;
- processes left in the killed run's worker groups once the next ``run`` has started its workers:
  the next start must reap the children (the worker record in the state directory);
- budget resets: a cycle whose workers start at a lower attempt than the killed one's
  (``TORCHELASTIC_RESTART_COUNT``); the attempt counter must continue across the kills.

A last ``run`` with a clean worker ends the job. Scale 1: 3 kills, about 40 s.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from bench.soak.common import Figure, env, say, scale, wait_for, zero

JOB = "soak-run"
WORKER = r'''
import os, signal, subprocess, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] == "clean":
    print(f"soak worker rank={rank} done", flush=True)
    sys.exit(0)
child = subprocess.Popen(["sleep", "600"])            # stays in the worker's process group
print(f"soak worker rank={rank} attempt={attempt} pid={os.getpid()} child={child.pid}", flush=True)
if rank == 1 and attempt == 0:
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    time.sleep(0.2)
'''
LINE = re.compile(r"soak worker rank=(\d+) attempt=(\d+) pid=(\d+) child=(\d+)")


class Run:
    """A running ``ftwatch run`` of the soak worker, its output collected by a thread."""

    def __init__(self, tmp: Path, mode: str):
        argv = [sys.executable, "-m", "ftwatch", "run", "--job-id", JOB, "--nproc-per-node", "3",
                "--state-dir", str(tmp / "state"), "--grace-period", "1", "--enable-job-restart=True",
                "--max-num-of-job-restart=20", "--", sys.executable, str(tmp / "worker.py"), mode]
        self.proc = subprocess.Popen(argv, cwd=tmp, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def workers(self) -> dict[int, tuple[int, int, int]]:
        """rank -> (attempt, pid, child pid) of the latest start of each rank seen."""
        out = {}
        for line in list(self.lines):
            m = LINE.search(line)
            if m:
                out[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        return out


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()       # state, ppid, pgrp, ...
    return None if fields[0] == "Z" else fields


def alive(pids: set[int]) -> set[int]:
    """The pids of ``pids`` that are live processes (not zombies)."""
    return {p for p in pids if _stat(p) is not None}


def group_members(pgids: set[int]) -> set[int]:
    """Live processes whose process group is one of ``pgids``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and int(fields[2]) in pgids:
                found.add(int(entry.name))
    return found


def run(tmp: Path, kills: int | None = None) -> list[Figure]:
    """Runs part 3 in ``tmp`` (``kills`` cycles, default 3 x SOAK_SCALE); returns its figures."""
    kills = kills or max(1, round(3 * scale()))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "worker.py").write_text(WORKER)
    groups: set[int] = set()
    orphans_after_kill = left_after_next = resets = 0
    attempts: list[int] = []
    notes: list[str] = []
    previous: dict[int, tuple[int, int, int]] = {}
    runs: list[Run] = []
    try:
        for cycle in range(kills + 1):
            mode = "hold" if cycle < kills else "clean"
            r = Run(tmp, mode)
            runs.append(r)
            if mode == "hold":
                want = 1 if cycle == 0 else (attempts[-1] if attempts else 1)
                ok = wait_for(lambda: len(r.workers()) == 3 and min(a for a, _, _ in r.workers().values()) >= want
                              or r.proc.poll() is not None, 120)
                if not ok or r.proc.poll() is not None:
                    return [zero("run kill -9: cycles that failed", 1, "".join(r.lines)[-500:])]
            else:
                r.proc.wait(120)
                r.reader.join(10)
            if previous:                       # the next start has begun its workers: the reap is done
                gone = wait_for(lambda: not group_members({p for _, p, _ in previous.values()}), 10, 0.1)
                if not gone:
                    left = group_members({p for _, p, _ in previous.values()})
                    left_after_next += len(left)
                    notes.append(f"cycle {cycle}: {sorted(left)} left")
            if mode == "clean":
                if r.proc.returncode != 0:
                    notes.append(f"the clean run ended {r.proc.returncode}")
                break
            workers = r.workers()
            attempt = min(a for a, _, _ in workers.values())
            if attempts and attempt < attempts[-1]:
                resets += 1
            attempts.append(attempt)
            groups |= {p for _, p, _ in workers.values()}
            r.proc.send_signal(signal.SIGKILL)
            r.proc.wait(30)
            pids = {p for _, p, _ in workers.values()}
            wait_for(lambda: not alive(pids), 10, 0.1)
            orphans_after_kill += len(alive(pids))
            previous = workers
            say(f"run kill -9: cycle {cycle + 1}/{kills} at attempt {attempt}, "
                f"{len(alive(pids))} workers alive after the kill")
        clean_ok = runs[-1].proc.returncode == 0
    finally:
        for r in runs:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait(30)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
    return [zero("run kill -9: workers alive after the kill", orphans_after_kill, f"{kills} kills, 3 workers each"),
            zero("run kill -9: orphans left after the next start", left_after_next, "; ".join(notes)),
            zero("run kill -9: budget resets", resets + (0 if clean_ok else 1),
                 f"attempts at each kill {attempts}" + ("" if clean_ok else "; the final clean run failed"))]
