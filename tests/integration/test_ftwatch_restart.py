"""Restarting or interrupting ftwatch itself: the budgets (D3) outlive the ftwatch process.

Each test drives the real command line (``python -m ftwatch run``) in a subprocess. The jobs are
a small plain-Python worker script (no torch), written to the test's tmp_path: rank 1 SIGKILLs
itself on every start, except that from attempt 1 on it holds (prints and sleeps) while a gate
file exists; that gate is what makes "ftwatch killed while attempt 1 runs" deterministic. Worker
pids come from the SQLite store's ``instance_start`` events; every worker process group the
tests see is SIGKILLed in a ``finally``. No orphans (issue 17): a SIGKILLed ftwatch takes its
workers' main processes with it (parent-death signal), and the next start on the same state
directory reaps what they left in their process groups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

JOB = "restart-test"

WORKER = r'''
import os, signal, sys, time

rank = int(os.environ["RANK"])
count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"worker rank={rank} TORCHELASTIC_RESTART_COUNT={count} pid={os.getpid()}", flush=True)
if sys.argv[1] == "clean":
    print(f"worker rank={rank} done", flush=True)
    sys.exit(0)
gate = sys.argv[2]
if rank == 1 and not (count >= 1 and os.path.exists(gate)):
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    print(f"worker rank={rank} waiting", flush=True)
    time.sleep(0.2)
'''


class Ftwatch:
    """A running ``ftwatch run`` whose combined output is read line by line; waits are on a condition."""

    def __init__(self, tmp: Path, mode: str, flags: list[str]):
        self.state = tmp / "state"
        self.decisions_file = tmp / "decisions.jsonl"
        command = [sys.executable, str(tmp / "worker.py"), mode, str(tmp / "hold")]
        argv = [sys.executable, "-m", "ftwatch", "run", "--job-id", JOB, "--nproc-per-node", "2",
                "--state-dir", str(self.state), "--decisions-file", str(self.decisions_file),
                "--grace-period", "3", *flags, "--", *command]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("FTWATCH_JOB_ID", None)
        self.lines: list[str] = []
        self.eof = False
        self.changed = threading.Condition()
        self.proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.eof = True
            self.changed.notify_all()

    def wait_for(self, *texts: str, deadline: float = 60) -> None:
        """Return once a line containing each of ``texts`` has appeared (fails at EOF or ``deadline`` s)."""
        def seen() -> bool:
            return self.eof or all(any(t in line for line in self.lines) for t in texts)
        with self.changed:
            self.changed.wait_for(seen, timeout=deadline)
            if not all(any(t in line for line in self.lines) for t in texts):
                raise AssertionError(f"{texts!r} did not all appear:\n{self.output}")

    def wait(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(10)
        return code

    @property
    def output(self) -> str:
        with self.changed:
            return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait(30)


def decisions(tmp: Path) -> list[dict]:
    path = tmp / "decisions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def budgets(tmp: Path) -> dict:
    return json.loads((tmp / "state" / "budgets" / f"{JOB}.json").read_text(encoding="utf-8"))


def worker_groups(tmp: Path) -> set[int]:
    """The process group ids (= pids: each worker leads its own session) of every worker started so far."""
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    db = tmp / "state" / "ftwatch.db"
    if not db.exists():
        return set()
    with SqliteStore(db) as store:
        return {e["detail"]["pid"] for e in store.events(JOB) if e["kind"] == "instance_start"}


def attempt_groups(tmp: Path, attempt: int) -> set[int]:
    """The pids of the workers started for ``attempt`` (the instance_starts after its last job_start)."""
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    pids: set[int] = set()
    current = None
    with SqliteStore(tmp / "state" / "ftwatch.db") as store:
        for e in store.events(JOB):
            if e["kind"] == "job_start":
                current = e["detail"]["attempt"]
                pids = set() if current == attempt else pids
            elif e["kind"] == "instance_start" and current == attempt:
                pids.add(e["detail"]["pid"])
    return pids


def live_members(pgids: set[int]) -> list[int]:
    """Pids of the processes (not zombies) whose process group is one of ``pgids``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()   # state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) in pgids:
            found.append(int(entry.name))
    return found


def kill_groups(pgids: set[int]) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pgids: set[int], deadline: float = 10) -> list[int]:
    """Live members left once the groups are empty or ``deadline`` s passed (SIGKILL is asynchronous)."""
    end = time.monotonic() + deadline
    left = live_members(pgids)
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = live_members(pgids)
    return left


RESTART = ["--enable-job-restart=True", "--max-num-of-job-restart=3"]


def setup(tmp: Path) -> None:
    (tmp / "worker.py").write_text(WORKER, encoding="utf-8")


def test_budget_continues_across_sigkill_of_ftwatch_and_runs_out_after_three_restarts_in_total(tmp_path):
    """ftwatch SIGKILLed in attempt 1 -> rerun continues at attempt 1; 3 restarts in total, then fail_job; next run is fresh."""
    setup(tmp_path)
    runs: list[Ftwatch] = []
    try:
        (tmp_path / "hold").touch()
        first = Ftwatch(tmp_path, "faulty", RESTART)
        runs.append(first)
        first.wait_for("decision restart_job", "starting 2 workers (attempt 1)",
                       "worker rank=0 TORCHELASTIC_RESTART_COUNT=1", "worker rank=1 TORCHELASTIC_RESTART_COUNT=1")
        assert [d["action"] for d in decisions(tmp_path)] == ["restart_job"], first.output
        held = attempt_groups(tmp_path, 1)
        assert len(held) == 2, first.output
        os.kill(first.proc.pid, signal.SIGKILL)          # ftwatch only; its workers have their own sessions
        assert first.wait(30) == -signal.SIGKILL
        state = budgets(tmp_path)
        assert (state["status"], state["attempt"], state["restarts_used"]) == ("running", 1, 1), state
        kill_groups(held)                                # the orphaned attempt-1 workers
        assert wait_gone(held) == [], "attempt-1 workers survived SIGKILL"
        (tmp_path / "hold").unlink()

        second = Ftwatch(tmp_path, "faulty", RESTART)
        runs.append(second)
        assert second.wait() == 1, second.output
        assert "starting 2 workers (attempt 0)" not in second.output
        assert "starting 2 workers (attempt 1)" in second.output, second.output
        counts = [line for line in second.lines if "TORCHELASTIC_RESTART_COUNT=" in line]
        assert counts and all("TORCHELASTIC_RESTART_COUNT=0" not in line for line in counts), counts
        assert "worker rank=1 TORCHELASTIC_RESTART_COUNT=1" in second.output
        assert "worker rank=1 TORCHELASTIC_RESTART_COUNT=3" in second.output
        assert "TORCHELASTIC_RESTART_COUNT=4" not in second.output
        all_decisions = decisions(tmp_path)
        assert [d["action"] for d in all_decisions] == ["restart_job"] * 3 + ["fail_job"], second.output
        assert [d["restarts_used"] for d in all_decisions] == [1, 2, 3, 3]
        assert all_decisions[-1]["restarts_left"] == 0
        assert "budget" in all_decisions[-1]["policy_clause"], all_decisions[-1]
        state = budgets(tmp_path)
        assert (state["status"], state["attempt"], state["restarts_used"]) == ("failed", 3, 3), state

        third = Ftwatch(tmp_path, "clean", RESTART)
        runs.append(third)
        assert third.wait() == 0, third.output
        assert "starting 2 workers (attempt 0)" in third.output, third.output
        assert "worker rank=0 TORCHELASTIC_RESTART_COUNT=0" in third.output
        assert "worker rank=1 TORCHELASTIC_RESTART_COUNT=0" in third.output
        last = decisions(tmp_path)[-1]
        assert (last["action"], last["restarts_used"], last["restarts_left"]) == ("none", 0, 3), last
        state = budgets(tmp_path)
        assert (state["status"], state["attempt"], state["restarts_used"]) == ("succeeded", 0, 0), state
        assert state["history"][-1] == {"job": JOB, "status": "failed", "attempt": 3, "restarts_used": 3}
    finally:
        for run in runs:
            run.kill()
        groups = worker_groups(tmp_path)
        kill_groups(groups)
        wait_gone(groups)


def test_sigint_stops_workers_cleanly_exits_130_and_keeps_budgets(tmp_path):
    """SIGINT to ftwatch in attempt 1 -> workers SIGTERMed, none left, exit 130; the next run continues at attempt 1."""
    setup(tmp_path)
    runs: list[Ftwatch] = []
    try:
        (tmp_path / "hold").touch()
        first = Ftwatch(tmp_path, "faulty", RESTART)
        runs.append(first)
        first.wait_for("decision restart_job", "worker rank=0 TORCHELASTIC_RESTART_COUNT=1",
                       "worker rank=1 TORCHELASTIC_RESTART_COUNT=1")
        groups = worker_groups(tmp_path)
        held = attempt_groups(tmp_path, 1)
        assert len(groups) == 4 and len(held) == 2, first.output
        os.kill(first.proc.pid, signal.SIGINT)           # what Ctrl-C sends (the workers are in their own sessions)
        assert first.wait(60) == 130, first.output
        assert "interrupted, stopping all workers" in first.output
        assert "INTERRUPTED (exit 130)" in first.output
        assert live_members(groups) == [], "workers outlived ftwatch"
        from ftwatch.pipeline.sinks.sqlite import SqliteStore
        with SqliteStore(tmp_path / "state" / "ftwatch.db") as store:
            events = store.events(JOB)
        kinds = [e["kind"] for e in events]
        stopped = [e for e in events if e["kind"] == "instance_exit"][-2:]
        assert sorted(e["rank"] for e in stopped) == [0, 1], events
        assert all(e["detail"]["stopped_by_us"] and e["detail"]["signal"] == signal.SIGTERM for e in stopped), stopped
        assert kinds[-1] == "interrupted", kinds
        assert [d["action"] for d in decisions(tmp_path)] == ["restart_job"]
        state = budgets(tmp_path)
        assert (state["status"], state["attempt"], state["restarts_used"]) == ("running", 1, 1), state
        (tmp_path / "hold").unlink()

        second = Ftwatch(tmp_path, "clean", RESTART)
        runs.append(second)
        assert second.wait() == 0, second.output
        assert "starting 2 workers (attempt 1)" in second.output, second.output
        assert "worker rank=0 TORCHELASTIC_RESTART_COUNT=1" in second.output
        assert "worker rank=1 TORCHELASTIC_RESTART_COUNT=1" in second.output
        last = decisions(tmp_path)[-1]
        assert (last["action"], last["restarts_used"], last["restarts_left"]) == ("none", 1, 2), last
    finally:
        for run in runs:
            run.kill()
        groups = worker_groups(tmp_path)
        kill_groups(groups)
        wait_gone(groups)


ORPHAN_WORKER = r'''
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)     # does not die with its peers; inherited by its child
if sys.argv[1] == "clean":
    print("worker done", flush=True)
    sys.exit(0)
child = subprocess.Popen(["sleep", "600"])          # stays in the worker's process group
print(f"orphan-test worker={os.getpid()} child={child.pid}", flush=True)
child.wait()
'''


def test_sigkill_of_ftwatch_kills_its_workers_and_the_next_start_reaps_their_children_and_says_so(tmp_path):
    """kill -9 of ``ftwatch run`` -> its workers (ignoring SIGTERM) die with it; their children, left in the
    workers' process groups, are stopped by the next ``ftwatch run`` on that state directory, with a line."""
    import re
    (tmp_path / "worker.py").write_text(ORPHAN_WORKER, encoding="utf-8")
    runs: list[Ftwatch] = []
    workers: set[int] = set()
    children: set[int] = set()
    try:
        first = Ftwatch(tmp_path, "orphan", [])
        runs.append(first)
        first.wait_for("orphan-test worker=")
        end = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < end:
            first.wait_for("orphan-test worker=")
            for m in re.finditer(r"orphan-test worker=(\d+) child=(\d+)", first.output):
                workers.add(int(m.group(1)))
                children.add(int(m.group(2)))
        assert len(workers) == 2 and len(children) == 2, first.output
        records = list((first.state / "workers").glob("*.json"))
        assert [r.name for r in records] == [f"{first.proc.pid}.json"], records
        os.kill(first.proc.pid, signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL
        end = time.monotonic() + 10
        while live_members(workers) != sorted(children) and time.monotonic() < end:
            time.sleep(0.05)              # real processes dying: poll /proc, bounded
        assert not [p for p in live_members(workers) if p in workers], "workers outlived a SIGKILLed ftwatch"
        assert sorted(live_members(workers)) == sorted(children), "their children left the groups early"

        second = Ftwatch(tmp_path, "clean", [])
        runs.append(second)
        assert second.wait() == 0, second.output
        assert f"ftwatch: stopping 2 worker process group(s) left running by ftwatch pid {first.proc.pid}" \
            in second.output, second.output
        assert all(str(pgid) in second.output for pgid in workers), second.output
        assert wait_gone(workers) == [], "the next start left the orphans running"
        assert list((second.state / "workers").glob("*")) == [], "a clean end leaves no record"
    finally:
        for run in runs:
            run.kill()
        kill_groups(workers)
        wait_gone(workers)
