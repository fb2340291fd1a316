"""End to end: the same command run again is the same job (``local-`` and a hash of the
directory and command), from attempt 0 again; ``ftwatch explain`` still explains each run's
decision by that run's findings (``ftwatch.pipeline.sinks.runs``), and the store lists both runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ftwatch.pipeline.sinks.sqlite import SqliteStore

WORKER = """import os, sys
print("step 1/10 loss 0.5", flush=True)
if os.environ.get("BOOM"):
    print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
    sys.exit(1)
print("done", flush=True)
"""


def ftwatch(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


def decision_of(run: subprocess.CompletedProcess) -> str:
    return re.findall(r"ftwatch explain --state-dir \S+ ([0-9a-f]+)", run.stdout)[-1]


def test_a_command_run_again_explains_each_runs_decision_by_its_own_findings(tmp_path: Path):
    (tmp_path / "w.py").write_text(WORKER)
    (tmp_path / "c.yaml").write_text("health:\n  bootcheck: false\n  troubleshooting: false\n")
    argv = ("run", "--config", "c.yaml", "--state-dir", "st", "--", sys.executable, "w.py")
    failed = ftwatch(*argv, cwd=tmp_path, BOOM="1")
    assert failed.returncode != 0, failed.stdout + failed.stderr
    passed = ftwatch(*argv, cwd=tmp_path)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    first = ftwatch("explain", "--state-dir", "st", decision_of(failed), cwd=tmp_path).stdout
    second = ftwatch("explain", "--state-dir", "st", decision_of(passed), cwd=tmp_path).stdout
    assert "illegal memory access" in first and "fail_job" in first
    assert "illegal memory access" not in second and "job succeeded" in second, second
    with SqliteStore(tmp_path / "st" / "ftwatch.db") as store:
        (job,) = store.jobs()
        assert job.startswith("local-")
        assert [(r["attempt"], r["status"]) for r in store.runs(job)] == [(0, "failed"), (0, "succeeded")]
