"""End to end: `ftwatch run` supervising real PyTorch DDP jobs (gloo, CPU) as a user runs it.

Each test starts the real command line in a subprocess, with a fault injected into the
example trainer through its environment, and checks the decisions file, the exit status
and what the job itself printed.
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

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train_ddp.py"
ASYNC = ROOT / "examples" / "worker_async.py"
pytestmark = pytest.mark.slow


class Job:
    """A running `ftwatch run` whose output is read line by line with arrival times."""

    def __init__(self, tmp: Path, flags: list[str], command: list[str], env: dict[str, str | None], nproc: int = 2):
        """``env`` is laid over this process's environment; a None value removes the variable."""
        self.decisions_file = tmp / "decisions.jsonl"
        self.state = tmp / "state"
        argv = [sys.executable, "-m", "ftwatch", "run", "--nproc-per-node", str(nproc),
                "--state-dir", str(self.state), "--decisions-file", str(self.decisions_file),
                "--grace-period", "3", *flags, "--", *command]
        full_env = {k: v for k, v in {**os.environ, **env, "PYTHONUNBUFFERED": "1"}.items() if v is not None}
        self.proc = subprocess.Popen(argv, cwd=tmp, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace")
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout: float = 240) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(10)
        return code

    def first(self, text: str, deadline: float = 120) -> float:
        """Monotonic time at which a line containing ``text`` appeared (waits for it)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for at, line in list(self.lines):
                if text in line:
                    return at
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared:\n{self.output}")

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def decisions(self) -> list[dict]:
        if not self.decisions_file.exists():
            return []
        return [json.loads(line) for line in self.decisions_file.read_text().splitlines() if line.strip()]


def trainer(tmp: Path, steps: int = 16) -> list[str]:
    return [sys.executable, str(TRAIN), "--steps", str(steps), "--step-time", "0.05",
            "--checkpoint-every", "4", "--checkpoint-dir", str(tmp / "ckpt")]


RESTART = ["--enable-job-restart=True", "--max-num-of-job-restart=3"]


def test_sigkilled_rank_restarts_job_and_training_resumes(tmp_path):
    """One rank SIGKILLed in the first attempt -> restart_job; the job resumes and exits 0."""
    job = Job(tmp_path, RESTART, trainer(tmp_path), {"FTWATCH_INJECT_FAULT": "sigkill"}, nproc=3)
    assert job.wait() == 0, job.output
    actions = [d["action"] for d in job.decisions()]
    assert actions == ["restart_job", "none"], job.output
    restart = job.decisions()[0]
    assert restart["root_cause"]["rank"] == 1
    assert restart["root_cause"]["failure_class"] == "retryable_infra"
    assert "SIGKILL" in restart["root_cause"]["line"]
    assert restart["restarts_used"] == 1 and restart["restarts_left"] == 2
    assert "resumed from checkpoint" in job.output
    assert "training finished" in job.output
    # the survivors' gloo errors reached the store as fallout (evidence for explain), and the
    # peers' tracebacks were echoed even though they arrived with the failing exit
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    findings = SqliteStore(job.state / "ftwatch.db").findings_for(restart["target"]["job"], attempt=0)
    runs = SqliteStore(job.state / "ftwatch.db").runs(restart["target"]["job"])
    assert [(r["attempt"], r["status"]) for r in runs] == [(0, "restarted"), (1, "succeeded")], runs
    fallout = {f["rank"] for f in findings if f["failure_class"] == "fallout"}
    assert fallout == {0, 2}, findings
    assert "[rank0]! [rank0]: Traceback" in job.output


def test_keyerror_fails_job_naming_that_rank(tmp_path):
    """A KeyError in one rank -> fail_job naming it (not the peers' fallout); no restart."""
    job = Job(tmp_path, RESTART, trainer(tmp_path), {"FTWATCH_INJECT_FAULT": "keyerror"})
    assert job.wait() != 0
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["fail_job"], job.output
    rc = decisions[0]["root_cause"]
    assert rc["rank"] == 1 and rc["failure_class"] == "user_code"
    assert "KeyError" in rc["line"], rc
    assert "restarting all" not in job.output


def test_sigstopped_rank_is_a_job_hang_within_interval(tmp_path):
    """A SIGSTOPped rank with hang detection on -> hang decided within interval + 2 s, restart, finish."""
    interval = 5
    job = Job(tmp_path, RESTART + ["--enable-job-hang-detection=True", f"--job-hang-interval={interval}"],
              trainer(tmp_path), {"FTWATCH_INJECT_FAULT": "sigstop"})
    stopped = job.first("injecting fault sigstop")
    decided = job.first("decision restart_job")
    assert decided - stopped <= interval + 2, job.output
    assert job.wait() == 0, job.output
    first = job.decisions()[0]
    assert first["action"] == "restart_job"
    assert first["root_cause"]["failure_class"] == "hang"
    assert [d["action"] for d in job.decisions()][-1] == "none"
    assert "training finished" in job.output


def test_sigstopped_rank_without_hang_detection_is_no_decision(tmp_path):
    """Hang detection off -> no hang decision however long the silence; SIGTERM stops cleanly."""
    job = Job(tmp_path, RESTART, trainer(tmp_path), {"FTWATCH_INJECT_FAULT": "sigstop"})
    job.first("injecting fault sigstop")
    deadline = time.monotonic() + 8          # longer than the 5 s interval of the test above
    while time.monotonic() < deadline and job.proc.poll() is None:
        time.sleep(0.2)
    assert job.proc.poll() is None, "the job should still be hanging"
    assert job.decisions() == []
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(60) == 130
    assert job.decisions() == []
    assert "interrupted, stopping all workers" in job.output


def test_restart_budget_runs_out(tmp_path):
    """A fault on every attempt -> fail_job after exactly --max-num-of-job-restart restarts."""
    job = Job(tmp_path, ["--enable-job-restart=True", "--max-num-of-job-restart=2"], trainer(tmp_path),
              {"FTWATCH_INJECT_FAULT": "sigkill", "FTWATCH_INJECT_ATTEMPTS": "all"})
    assert job.wait() == 1, job.output
    actions = [d["action"] for d in job.decisions()]
    assert actions == ["restart_job", "restart_job", "fail_job"], job.output
    assert job.decisions()[-1]["restarts_left"] == 0
    assert "budget" in job.decisions()[-1]["policy_clause"]


def test_async_restarts_only_the_failed_instance(tmp_path):
    """Async mode -> restart_instance of the failed worker only; the others run once."""
    command = [sys.executable, str(ASYNC), "--steps", "10", "--step-time", "0.05"]
    job = Job(tmp_path, ["--job-execution-mode=Async", "--fault-tolerant-policy=OnFailure"], command,
              {"FTWATCH_INJECT_FAULT": "crash", "FTWATCH_INJECT_RANK": "1"}, nproc=3)
    assert job.wait() == 0, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["restart_instance", "none"], job.output
    assert decisions[0]["target"]["rank"] == 1
    starts = [line for _, line in job.lines if "MA_PROC_START_CNT=" in line]
    assert sum("[rank1]" in s for s in starts) == 2, starts
    assert sum("[rank0]" in s for s in starts) == 1 and sum("[rank2]" in s for s in starts) == 1


def test_exit_hang_restarts_after_interval(tmp_path):
    """One rank exits 0 while the others stay alive and silent -> restart after the exit-hang interval."""
    job = Job(tmp_path, RESTART + ["--enable-job-exit-hang-detection=True", "--job-exit-hang-interval=3"],
              trainer(tmp_path), {"FTWATCH_INJECT_FAULT": "exit0"})
    assert job.wait() == 0, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["restart_job", "none"], job.output
    assert decisions[0]["root_cause"]["failure_class"] == "hang"
    assert decisions[0]["root_cause"]["rule_id"] == "hang.exit"


def test_clean_run_decides_nothing(tmp_path):
    """A clean run -> no decision other than none; exit 0."""
    job = Job(tmp_path, RESTART + ["--enable-job-hang-detection=True", "--job-hang-interval=60"],
              trainer(tmp_path, steps=8), {})
    assert job.wait() == 0, job.output
    assert [d["action"] for d in job.decisions()] == ["none"]
    assert "training finished" in job.output
