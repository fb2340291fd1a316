"""Issue 16 (bounds): the SQLite store deletes a job, and a run of a job that is not its newest, it
has not written for ``storage.sqlite_retention``, by the clock, so a watch that runs for months
keeps the recent jobs, and a job id that keeps coming back keeps its recent runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ftwatch.events import DeliveryResult
from ftwatch.testing import T0, decision, finding
from ftwatch.pipeline.sinks import retention
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, RunEnd, RunStart
from ftwatch.pipeline.sinks.retention import EVERY, JobRetention
from ftwatch.pipeline.sinks.sqlite import SqliteStore

DAY = 86400.0


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_job(store: SqliteStore, job: str, t: float = T0, findings: int = 3) -> None:
    """Every kind of row a job has: a run, events, findings, a decision and its delivery, output."""
    d = decision(root_cause=finding(time=t, job=job))
    store.write([RunStart(job, 0, t, ["python", "train.py"]), LifecycleEvent(t, job, "instance_start", "worker-0", 0),
                 FindingBatch([finding(time=t + k, job=job, seq=k) for k in range(findings)]),
                 OutputBatch([(job, "worker-0", 0, t, 5.0, 10, 100)]), d,
                 DeliveryResult("ops", f"{d.decision_id}-ops", "delivered", 1),
                 RunEnd(job, 0, t + 9, "failed")])


def counts(store: SqliteStore, job: str) -> dict[str, int]:
    rows = {t: store._rows(f"SELECT count(*) FROM {t} WHERE job = ?", (job,))[0][0]
            for t in ("runs", "events", "findings", "decisions", "output")}
    rows["alerts"] = store._rows("SELECT count(*) FROM alerts a JOIN decisions d USING (decision_id) "
                                 "WHERE d.job = ?", (job,))[0][0]
    return rows


def test_a_job_not_written_for_the_retention_is_deleted_whole_and_the_others_kept(tmp_path: Path):
    clock = Clock(T0)
    store = SqliteStore(tmp_path / "ftwatch.db", retention=JobRetention(90 * DAY, clock))
    write_job(store, "old")
    clock.now += 60 * DAY
    write_job(store, "recent")
    clock.now += 31 * DAY                                  # "old" last written 91 days ago
    write_job(store, "new")
    assert set(counts(store, "old").values()) == {0}
    assert store._rows("SELECT count(*) FROM alerts")[0][0] == 2
    for job in ("recent", "new"):
        assert counts(store, job) == {"runs": 1, "events": 1, "findings": 3, "decisions": 1, "output": 1, "alerts": 1}
    assert store.jobs() == ["new", "recent"]
    assert [r[0] for r in store._rows("SELECT job FROM written ORDER BY job")] == ["new", "recent"]


def test_the_clock_not_the_records_times_dates_a_job(tmp_path: Path):
    clock = Clock(T0)
    store = SqliteStore(tmp_path / "ftwatch.db", retention=JobRetention(90 * DAY, clock))
    write_job(store, "replayed", t=T0 - 3 * 365 * DAY)   # a replay of a three-year-old log
    clock.now += EVERY + 1
    write_job(store, "live")
    assert counts(store, "replayed")["findings"] == 3


def test_a_pass_runs_once_an_hour_and_deletes_a_bounded_number_of_rows(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(retention, "MAX_ROWS", 50)
    clock = Clock(T0)
    store = SqliteStore(tmp_path / "ftwatch.db", retention=JobRetention(DAY, clock))
    write_job(store, "big", findings=120)
    clock.now += DAY - 600
    write_job(store, "live")                               # a pass 10 min before "big" is stale
    clock.now += 1200
    write_job(store, "live")                               # stale now, but the next pass is due in 40 min
    assert counts(store, "big")["findings"] == 120
    total = sum(counts(store, "big").values())              # 125: the findings, and a row of each other table
    clock.now += EVERY
    left = []
    for _ in range(5):
        write_job(store, "live")
        left.append(sum(counts(store, "big").values()))
    assert left == [total - 50, total - 100, 0, 0, 0]        # 50 rows a pass, then the rest


def write_run(store: SqliteStore, job: str, t: float, attempts: int = 1) -> list[str]:
    """A run of ``job`` from attempt 0: per attempt its start, two findings and a decision with a
    delivery, and an end; returns the decisions' ids."""
    ids = []
    for attempt in range(attempts):
        d = decision(root_cause=finding(time=t, job=job), time=t + 5, attempt=attempt)
        store.write([RunStart(job, attempt, t, ["python", "train.py"]),
                     FindingBatch([finding(time=t + k, job=job, seq=k) for k in range(2)], attempt=attempt), d,
                     DeliveryResult("ops", f"{d.decision_id}-ops", "delivered", 1),
                     RunEnd(job, attempt, t + 9, "restarted" if attempt + 1 < attempts else "failed")])
        ids.append(d.decision_id)
        t += 10
    return ids


def run_rows(store: SqliteStore, job: str) -> list[tuple]:
    """(run id, findings, decisions, alerts) per run of ``job``, oldest first."""
    return [tuple(r) for r in store._rows(
        "SELECT r.id, (SELECT count(*) FROM findings WHERE run = r.id), (SELECT count(*) FROM decisions WHERE run = r.id), "
        "(SELECT count(*) FROM alerts a JOIN decisions d USING (decision_id) WHERE d.run = r.id) "
        "FROM runs AS r WHERE job = ? ORDER BY r.id", (job,))]


def test_a_job_id_that_keeps_coming_back_loses_its_runs_older_than_the_retention(tmp_path: Path):
    """The same command run every 30 days: the job is never stale, each run older than 90 days is
    deleted with its findings, decisions and deliveries, the recent runs are kept whole."""
    clock = Clock(T0)
    store = SqliteStore(tmp_path / "ftwatch.db", retention=JobRetention(90 * DAY, clock))
    first = write_run(store, "local-daily", T0, attempts=2)       # two rows: attempts 0 and 1
    for k in range(1, 4):
        clock.now += 30 * DAY + EVERY
        write_run(store, "local-daily", T0 + k * 30 * DAY)
    rows = run_rows(store, "local-daily")                          # day 90 + 4 h: the first run is stale
    assert [r[1:] for r in rows] == [(2, 1, 1)] * 3 and len(rows) == 3
    assert store._rows("SELECT count(*) FROM decisions WHERE decision_id IN (?, ?)", first)[0][0] == 0
    assert store._rows("SELECT count(*) FROM alerts WHERE decision_id IN (?, ?)", first)[0][0] == 0
    assert store._rows("SELECT count(*) FROM findings WHERE job = 'local-daily'")[0][0] == 6
    assert counts(store, "local-daily")["events"] == 0 and store.jobs() == ["local-daily"]


def test_a_jobs_newest_run_is_kept_however_old_while_the_job_is_written(tmp_path: Path):
    """A run written long ago is not deleted while it is its job's newest (the one being written to):
    output and lifecycle events keep the job fresh, and the run stays."""
    clock = Clock(T0)
    store = SqliteStore(tmp_path / "ftwatch.db", retention=JobRetention(90 * DAY, clock))
    write_run(store, "quiet", T0)
    for _ in range(4):
        clock.now += 30 * DAY
        store.write([OutputBatch([("quiet", "worker-0", 0, clock.now, 5.0, 10, 100)]),
                     LifecycleEvent(clock.now, "quiet", "instance_start", "worker-0", 0)])
    assert [r[1:] for r in run_rows(store, "quiet")] == [(2, 1, 1)]


def test_a_runs_rows_are_deleted_within_the_row_budget_its_row_last(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(retention, "MAX_ROWS", 3)
    clock = Clock(T0)
    store = SqliteStore(tmp_path / "ftwatch.db", retention=JobRetention(DAY, clock))
    write_run(store, "again", T0)
    clock.now += DAY + EVERY
    write_run(store, "again", T0 + DAY)                # the first run is stale: 1 + 1 + 2 + 1 rows
    left = [run_rows(store, "again")[0][1:]]
    for _ in range(2):
        clock.now += 1
        store.write([LifecycleEvent(clock.now, "again", "instance_start", "worker-0", 0)])
        left.append(run_rows(store, "again")[0][1:] if len(run_rows(store, "again")) == 2 else None)
    assert left == [(1, 0, 0), None, None]             # alert, decision, a finding; then the rest and the row
    assert [r[1:] for r in run_rows(store, "again")] == [(2, 1, 1)]


def test_a_version_7_files_runs_count_as_written_when_it_is_opened(tmp_path: Path):
    from ftwatch.pipeline.sinks import downsample, marks, runs, sqlite as mod
    path = tmp_path / "ftwatch.db"
    conn = sqlite3.connect(path)
    conn.executescript(mod._SCHEMA_V1 + mod._SCHEMA_V2 + marks.SCHEMA_V3 + marks.SCHEMA_V4 + downsample.SCHEMA_V5
                       + retention.SCHEMA_V6 + runs.SCHEMA_V7 + "PRAGMA user_version = 7;")
    conn.executemany("INSERT INTO runs (job, attempt, started, status) VALUES ('j', 0, ?, 'failed')", [(T0,), (T0 + 9,)])
    conn.commit()
    conn.close()
    with SqliteStore(path, retention=JobRetention(DAY)) as s:   # the real clock: written just now
        write_run(s, "j", T0 + 20)
        assert len(run_rows(s, "j")) == 3
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM runs WHERE written > strftime('%s', 'now') - 60").fetchone()[0] == 3
    conn.close()


def version_5_file(path: Path, job: str) -> None:
    """A store file as schema 5 left it, holding a run and three findings of ``job``."""
    from ftwatch.pipeline.sinks import downsample, marks, sqlite as mod
    conn = sqlite3.connect(path)
    conn.executescript(mod._SCHEMA_V1 + mod._SCHEMA_V2 + marks.SCHEMA_V3 + marks.SCHEMA_V4 + downsample.SCHEMA_V5
                       + "PRAGMA user_version = 5;")
    conn.execute("INSERT INTO runs (job, attempt, started, status) VALUES (?, 0, ?, 'failed')", (job, T0))
    conn.executemany("INSERT INTO findings (job, attempt, rule_id, time, seq) VALUES (?, 0, 'x.y', ?, ?)",
                     [(job, T0 + k, k) for k in range(3)])
    conn.commit()
    conn.close()


def test_a_version_5_files_jobs_count_as_written_when_it_is_opened(tmp_path: Path):
    from ftwatch.pipeline.sinks.sqlite import SCHEMA_VERSION
    path = tmp_path / "ftwatch.db"
    version_5_file(path, "before")
    with SqliteStore(path, retention=JobRetention(DAY)) as s:  # the real clock: written just now
        assert s.schema_version == SCHEMA_VERSION
        write_job(s, "after")
        assert counts(s, "before")["findings"] == 3
        assert {r[0] for r in s._rows("SELECT job FROM written")} == {"before", "after"}
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM written WHERE time > strftime('%s', 'now') - 60").fetchone()[0] == 2
    conn.close()


def test_the_config_sets_the_retention_and_null_keeps_every_job(tmp_path: Path):
    from ftwatch.config.model import Config
    from ftwatch.pipeline.build import build_store
    store = build_store(Config(), tmp_path)
    assert store.retention.keep == 90 * DAY
    store.close()
    store = build_store(Config.model_validate({"storage": {"sqlite_retention": "7d"}}), tmp_path)
    assert store.retention.keep == 7 * DAY
    store.close()
    store = build_store(Config.model_validate({"storage": {"sqlite_retention": None}}), tmp_path)
    assert store.retention is None
    store.close()
