"""Jobs, and runs of a job, the SQLite store has not written for ``storage.sqlite_retention`` are
deleted, so a ``watch`` that runs for months keeps the recent jobs and runs, not every one it ever
saw (issue 16: the monitor stays small; the Elasticsearch sink's ILM policy does the same there by
each document's age, 90 days by default).

Schema 6 adds ``written(job PK, time)``: when the store last wrote anything of the job, by the
wall clock, not by the records' own times, so a replay of a year-old log is as fresh as a live
job. A job older than the retention loses its runs, events, findings, decisions (and their alert
deliveries) and output counts. The pass runs in a write's transaction at most once an hour and
deletes at most :data:`MAX_ROWS` rows; a larger backlog goes on at the next write. Deleted pages
are reused by later writes (the file stops growing; it does not shrink).

Runs (schema 8, ``runs.written``): a job id that keeps coming back is never stale as a job: the
same command run every day (``ftwatch run`` names it by directory and command), or a cluster job
name ``watch`` meets again and again. So each run of a job (a ``runs`` row, ``ftwatch.pipeline.
sinks.runs``) has its own last write, and a run older than the retention that is not its job's
newest loses its findings, decisions (and their alert deliveries) and its row, in the same pass
and row budget, after the stale jobs. Findings and decisions with no run (written before schema
7, or of a job no run start names) go with their job only, and so do a job's events and output
counts, which belong to the job, not to a run (output counts are merged as they age:
``downsample``). A job's newest run is never deleted on its own: it is the one being written.

``ftwatch.pipeline.sinks.sqlite`` owns the file and its transactions; it calls
:meth:`JobRetention.after_write` inside a write's transaction.
"""

from __future__ import annotations

import math
import sqlite3
import time as _time
from typing import Callable, Iterator, Sequence

from ftwatch.events import Decision
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, Record, RunEnd, RunStart

SCHEMA_V6 = """
CREATE TABLE written (job TEXT PRIMARY KEY, time REAL NOT NULL);
CREATE INDEX written_time ON written (time);
INSERT OR IGNORE INTO written (job, time)
    SELECT job, CAST(strftime('%s', 'now') AS REAL) FROM (
        SELECT job FROM runs UNION SELECT job FROM events UNION SELECT job FROM findings
        UNION SELECT job FROM decisions UNION SELECT job FROM output);
"""
# a file written before schema 6: its jobs count as written when it is opened by this version

SCHEMA_V8 = """
ALTER TABLE runs ADD COLUMN written REAL;
UPDATE runs SET written = CAST(strftime('%s', 'now') AS REAL);
CREATE INDEX runs_written ON runs (written);
"""
# a file written before schema 8: its runs count as written when it is opened by this version

MAX_ROWS = 100_000
"""Rows deleted at most in one pass (one write's transaction)."""

EVERY = 3600.0
"""Seconds between two passes (sooner while a pass left rows behind)."""

# a run's rows (``run`` is the runs row's id; job and attempt use the tables' indexes), its alert
# deliveries first, its row last
_RUN_TABLES = (("alerts", "decision_id IN (SELECT decision_id FROM decisions WHERE job = :job AND run = :run)"),
               ("decisions", "job = :job AND run = :run"),
               ("findings", "job = :job AND attempt = :attempt AND run = :run"),
               ("runs", "id = :run"))
_STALE_RUNS = ("SELECT id, job, attempt FROM runs AS r WHERE written < ? "
               "AND id < (SELECT max(id) FROM runs WHERE job = r.job) ORDER BY written")
_WRITTEN_RUN = "UPDATE runs SET written = ? WHERE id = (SELECT max(id) FROM runs WHERE job = ? AND attempt = ?)"

# a job's rows, alert deliveries first (they name the job's decisions)
_TABLES = (("alerts", "decision_id IN (SELECT decision_id FROM decisions WHERE job = :job)"),
           ("decisions", "job = :job"), ("findings", "job = :job"), ("events", "job = :job"),
           ("output", "job = :job"), ("runs", "job = :job"))


def jobs_of(batch: Sequence[Record]) -> Iterator[str]:
    """The jobs ``batch``'s records belong to (with repeats; marks and deliveries name none)."""
    for record in batch:
        if isinstance(record, (RunStart, RunEnd, LifecycleEvent)):
            yield record.job
        elif isinstance(record, FindingBatch):
            yield from {f.origin.job for f in record.findings}
        elif isinstance(record, OutputBatch):
            yield from {row[0] for row in record.rows}
        elif isinstance(record, Decision):
            yield record.target.job


def runs_of(batch: Sequence[Record]) -> Iterator[tuple[str, int]]:
    """The (job, attempt) pairs whose run ``batch``'s records are written to (with repeats): those
    of run starts and ends, findings and decisions; the other records belong to no run."""
    for record in batch:
        if isinstance(record, (RunStart, RunEnd)):
            yield record.job, record.attempt
        elif isinstance(record, FindingBatch):
            yield from {(f.origin.job, record.attempt) for f in record.findings}
        elif isinstance(record, Decision):
            yield record.target.job, record.attempt


class JobRetention:
    """Deletes every row of a job the store has not written for ``keep`` seconds, and the rows of
    each run of a job (but its newest) not written for as long.

    Args:
        keep: seconds, > 0 (``storage.sqlite_retention``).
        clock: wall-clock time in epoch seconds (tests pass a fake one).

    Raises:
        ValueError: ``keep`` is not a positive finite number.
    """

    def __init__(self, keep: float, clock: Callable[[], float] = _time.time):
        if not (keep > 0 and math.isfinite(keep)):
            raise ValueError(f"retention must be positive seconds, got {keep!r}")
        self.keep = float(keep)
        self.clock = clock
        self._next = -math.inf          # the clock time of the next pass

    def after_write(self, conn: sqlite3.Connection, batch: Sequence[Record]) -> int:
        """Mark ``batch``'s jobs and runs as written now and, when a pass is due, delete the rows
        of the jobs and runs written last before ``now - keep``; run inside the transaction that
        wrote ``batch`` (its run starts' rows are in already). Returns the rows deleted."""
        now = self.clock()
        jobs = {job for job in jobs_of(batch) if job is not None}
        if jobs:
            conn.executemany("INSERT INTO written (job, time) VALUES (?, ?) "
                             "ON CONFLICT (job) DO UPDATE SET time = excluded.time", [(j, now) for j in jobs])
            conn.executemany(_WRITTEN_RUN, [(now, job, attempt) for job, attempt in set(runs_of(batch))
                                            if job is not None])
        if now < self._next:
            return 0
        deleted, left = self.prune(conn, now - self.keep)
        self._next = now if left else now + EVERY
        return deleted

    def prune(self, conn: sqlite3.Connection, before: float) -> tuple[int, bool]:
        """Delete up to :data:`MAX_ROWS` rows of the jobs last written before ``before`` (epoch
        s), the oldest job first, then of the runs (each but its job's newest) last written before
        it, the oldest first. Returns (rows deleted, whether any are left to delete)."""
        budget = MAX_ROWS
        stale = [r[0] for r in conn.execute("SELECT job FROM written WHERE time < ? ORDER BY time", (before,))]
        for job in stale:
            budget = _delete(conn, _TABLES, {"job": job}, budget)
            if budget <= 0:                             # (some of this job's rows may be left)
                return MAX_ROWS, True
            conn.execute("DELETE FROM written WHERE job = ?", (job,))
        for run, job, attempt in conn.execute(_STALE_RUNS, (before,)).fetchall():
            budget = _delete(conn, _RUN_TABLES, {"job": job, "attempt": attempt, "run": run}, budget)
            if budget <= 0:                             # (the run's row goes last: it is found again)
                return MAX_ROWS, True
        return MAX_ROWS - budget, False


def _delete(conn: sqlite3.Connection, tables: tuple[tuple[str, str], ...], names: dict, budget: int) -> int:
    """Delete the rows each of ``tables`` selects (its WHERE clause over ``names``), table by
    table in order, at most ``budget`` rows in all; returns the budget left (<= 0: it ran out,
    and rows of the table it ran out in may be left)."""
    for table, where in tables:
        budget -= conn.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                               f"WHERE {where} LIMIT :n)", {**names, "n": budget}).rowcount
        if budget <= 0:
            break
    return budget
