"""A job id used again (the same command run again) keeps each run's rows apart in the SQLite
store (schema 7, ``ftwatch.pipeline.sinks.runs``): a decision is explained by its own run's
findings, not by those of the run before, which share its job and attempt."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ftwatch.alerting.explain import explain
from ftwatch.events import Action, FailureClass, Target
from ftwatch.pipeline.sinks.base import FindingBatch, RunEnd, RunStart
from ftwatch.pipeline.sinks.sqlite import SCHEMA_VERSION, SqliteStore
from ftwatch.testing import T0, decision, finding

JOB = "local-afe8a352"
CUDA = "RuntimeError: CUDA error: an illegal memory access was encountered"
SLOW = "UserWarning: the dataloader is slow"


def first_run(store: SqliteStore, t: float = T0):
    """Attempt 0 fails on a CUDA error."""
    error = finding("cuda.illegal_memory_access", line=CUDA, time=t + 1, job=JOB, action=Action.FAIL_JOB,
                    failure_class=FailureClass.USER_CODE)
    failed = decision(Action.FAIL_JOB, error, time=t + 2)
    store.write([RunStart(JOB, 0, t, ["python", "w.py"]), FindingBatch([error]), failed, RunEnd(JOB, 0, t + 2, "failed")])
    return failed


def second_run(store: SqliteStore, t: float = T0 + 60):
    """The same command again: attempt 0 again, a warning, and the job succeeds."""
    warning = finding("python.warning", line=SLOW, time=t + 1, job=JOB, action=Action.NOTIFY)
    done = decision(Action.NONE, None, time=t + 2, target=Target(JOB), restarts_used=0, restarts_left=3)
    store.write([RunStart(JOB, 0, t, ["python", "w.py"]), FindingBatch([warning]), done,
                 RunEnd(JOB, 0, t + 2, "succeeded")])
    return done


def test_a_job_id_used_again_explains_each_decision_by_its_own_runs_findings(tmp_path: Path):
    with SqliteStore(tmp_path / "ftwatch.db") as store:
        failed, done = first_run(store), second_run(store)
        assert [(r["attempt"], r["started"], r["status"]) for r in store.runs(JOB)] == [
            (0, T0, "failed"), (0, T0 + 60, "succeeded")]
        first, second = explain(store, failed.decision_id), explain(store, done.decision_id)
        assert CUDA in first and SLOW not in first
        assert SLOW in second and CUDA not in second
        assert [f["line"] for f in store.findings_for(JOB)] == [CUDA, SLOW]     # the job's: every run's


def test_a_start_while_its_run_still_runs_continues_that_run(tmp_path: Path):
    """ftwatch itself restarted (killed) and goes on with the job: the same run, one row."""
    with SqliteStore(tmp_path / "ftwatch.db") as store:
        store.write([RunStart(JOB, 0, T0, ["python", "w.py"]), FindingBatch([finding(line=SLOW, time=T0 + 1, job=JOB)])])
        error = finding(line=CUDA, time=T0 + 11, job=JOB)
        later = decision(Action.RESTART_JOB, error, time=T0 + 12)
        store.write([RunStart(JOB, 0, T0 + 10, ["python", "w.py"]), FindingBatch([error]), later])
        assert [(r["started"], r["status"]) for r in store.runs(JOB)] == [(T0, "running")]   # its first start
        text = explain(store, later.decision_id)
        assert CUDA in text and SLOW in text


def test_a_version_6_file_keeps_its_runs_and_explains_its_old_decisions_as_before(tmp_path: Path):
    from ftwatch.pipeline.sinks import downsample, marks, retention, sqlite as mod
    path = tmp_path / "ftwatch.db"
    conn = sqlite3.connect(path)
    conn.executescript(mod._SCHEMA_V1 + mod._SCHEMA_V2 + marks.SCHEMA_V3 + marks.SCHEMA_V4 + downsample.SCHEMA_V5
                       + retention.SCHEMA_V6 + "PRAGMA user_version = 6;")
    conn.execute("INSERT INTO runs (job, attempt, started, ended, status) VALUES (?, 0, ?, ?, 'failed')",
                 (JOB, T0, T0 + 2))
    conn.execute("INSERT INTO findings (job, attempt, rule_id, line, time) VALUES (?, 0, 'cuda.x', ?, ?)",
                 (JOB, CUDA, T0 + 1))
    conn.execute("INSERT INTO decisions (decision_id, time, job, action, target, attempt) "
                 "VALUES ('d6', ?, ?, 'fail_job', '{}', 0)", (T0 + 2, JOB))
    conn.commit()
    conn.close()
    with SqliteStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 8
        done = second_run(store)
        assert [(r["started"], r["status"]) for r in store.runs(JOB)] == [(T0, "failed"), (T0 + 60, "succeeded")]
        old, new = explain(store, "d6"), explain(store, done.decision_id)
        assert CUDA in old and SLOW not in old                 # its findings: of no known run, as it was
        assert SLOW in new and CUDA not in new
