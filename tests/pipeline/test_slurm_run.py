"""``ftwatch run --actuator slurm`` as in an sbatch script (SLURM_JOB_ID, SLURMD_NODENAME set),
against fake scontrol / scancel / sinfo on PATH (tests/slurmfake.py): whole-job decisions go to
Slurm once the workers are stopped, their outcome is stored with the decision (``explain``); a
dry run, a breaker's hold or a failure is said, alerted, and the workers restart here instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.slurmfake import FakeSlurm

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
# the first attempt prints an Xid 79 and fails; later attempts succeed (they count their starts)
WORKER = f"""
import pathlib, sys
starts = pathlib.Path("starts")
n = int(starts.read_text()) if starts.exists() else 0
starts.write_text(str(n + 1))
if n == 0:
    print({XID!r}, flush=True)
    sys.exit(1)
print("step 1 done", flush=True)
"""


def run(tmp_path: Path, fake: FakeSlurm, *flags: str, worker: str = WORKER, config: str = "",
        ) -> subprocess.CompletedProcess:
    (tmp_path / "worker.py").write_text(worker)
    (tmp_path / "kern.log").write_text("")
    (tmp_path / "ftwatch.yaml").write_text(config or "{}\n")
    env = {**os.environ, "PATH": f"{fake.dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "SLURMD_NODENAME": "gpu-1", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "ftwatch", "run", "--config", "ftwatch.yaml", "--actuator", "slurm",
            "--state-dir", "state", "--kernel-log", "kern.log", "--nproc-per-node", "1", "--grace-period", "2",
            "--enable-job-restart=True", "--max-num-of-job-restart=3", *flags, "--", sys.executable, "worker.py"]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def explain(tmp_path: Path, out: str) -> str:
    command = next(line.split("explain    ", 1)[1] for line in out.splitlines() if "explain    ftwatch" in line)
    args = command.split()[2:]
    return subprocess.run([sys.executable, "-m", "ftwatch", "explain", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60).stdout


def test_an_xid_drains_this_node_and_requeues_the_job(tmp_path):
    fake = FakeSlurm(tmp_path / "bin")
    proc = run(tmp_path, fake)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    writes = fake.writes()
    assert [w[:4] for w in writes] == [["scontrol", "update", "NodeName=gpu-1", "State=DRAIN"],
                                       ["scontrol", "requeue", "77"]]
    assert writes[0][4].startswith("Reason=ftwatch ") and writes[0][4].endswith(f": xid.79: {XID}")
    assert (tmp_path / "starts").read_text() == "1"        # no local restart: Slurm starts the job again
    assert "REQUEUED (exit 0)" in proc.stdout
    shown = explain(tmp_path, proc.stdout)
    assert "isolate_node: done" in shown and "scontrol requeue 77 (requeue the job): ok" in shown


def test_restart_local_keeps_restart_job_in_the_allocation(tmp_path):
    fake = FakeSlurm(tmp_path / "bin")
    worker = WORKER.replace(repr(XID), repr("RuntimeError: NCCL error: unhandled system error"))
    proc = run(tmp_path, fake, worker=worker, config="slurm:\n  restart: local\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "decision restart_job" in proc.stdout
    assert fake.calls() == [] and (tmp_path / "starts").read_text() == "2"


def test_a_dry_run_is_said_and_the_workers_restart_here(tmp_path):
    fake = FakeSlurm(tmp_path / "bin")
    proc = run(tmp_path, fake, config="slurm:\n  dry_run: true\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fake.writes() == []
    assert "ftwatch: actuator dry_run for isolate_node" in proc.stdout
    assert "dry run (not run)" in proc.stdout and "SUCCEEDED" in proc.stdout
    assert (tmp_path / "starts").read_text() == "2"


def test_a_failed_drain_is_retried_alerted_and_the_workers_restart_here(tmp_path):
    fake = FakeSlurm(tmp_path / "bin")
    for _ in range(2):
        fake.respond("scontrol update", 1, "slurm_update error: Unable to contact slurm controller (connect failure)")
    proc = run(tmp_path, fake, config="slurm:\n  retries: 1\n  backoff: 0.1\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [w[1] for w in fake.writes()] == ["update", "update"]       # no requeue after a failed drain
    assert ("ftwatch: actuator failed for isolate_node" in proc.stdout
            and "Unable to contact slurm controller" in proc.stdout)
    assert "| Root cause:     actuator failed for isolate_node" in proc.stdout      # the alert
    assert (tmp_path / "starts").read_text() == "2"


def test_fail_job_cancels_the_job_after_ftwatch_ended_it(tmp_path):
    fake = FakeSlurm(tmp_path / "bin")
    worker = "import sys\nprint('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', flush=True)\n" \
             "sys.exit(1)\n"
    proc = run(tmp_path, fake, worker=worker)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "decision fail_job" in proc.stdout
    assert fake.writes() == [["scancel", "77"]]


def test_outside_a_slurm_job_it_is_one_line(tmp_path):
    fake = FakeSlurm(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    env["PATH"] = f"{fake.dir}:{os.environ['PATH']}"
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "run", "--actuator", "slurm", "--state-dir", "state",
                           "--", sys.executable, "-c", "pass"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "SLURM_JOB_ID is not set" in errors[0], proc.stderr
