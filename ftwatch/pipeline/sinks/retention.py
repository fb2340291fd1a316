"""Jobs the SQLite store has not written for ``storage.sqlite_retention`` are deleted, so a
``watch`` that runs for months keeps the recent jobs, not every job it ever saw (issue 16: the
monitor stays small; the Elasticsearch sink's ILM policy does the same there, 90 days by default).

Schema 6 adds ``written(job PK, time)``: when the store last wrote anything of the job, by the
wall clock, not by the records' own times, so a replay of a year-old log is as fresh as a live
job. A job older than the retention loses its runs, events, findings, decisions (and their alert
deliveries) and output counts. The pass runs in a write's transaction at most once an hour and
deletes at most :data:`MAX_ROWS` rows; a larger backlog goes on at the next write. Deleted pages
are reused by later writes (the file stops growing; it does not shrink).

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

MAX_ROWS = 100_000
"""Rows deleted at most in one pass (one write's transaction)."""

EVERY = 3600.0
"""Seconds between two passes (sooner while a pass left rows behind)."""

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


class JobRetention:
    """Deletes every row of a job the store has not written for ``keep`` seconds.

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
        """Mark ``batch``'s jobs as written now and, when a pass is due, delete the rows of the
        jobs written last before ``now - keep``; run inside the transaction that wrote ``batch``.
        Returns the rows deleted."""
        now = self.clock()
        jobs = {job for job in jobs_of(batch) if job is not None}
        if jobs:
            conn.executemany("INSERT INTO written (job, time) VALUES (?, ?) "
                             "ON CONFLICT (job) DO UPDATE SET time = excluded.time", [(j, now) for j in jobs])
        if now < self._next:
            return 0
        deleted, left = self.prune(conn, now - self.keep)
        self._next = now if left else now + EVERY
        return deleted

    def prune(self, conn: sqlite3.Connection, before: float) -> tuple[int, bool]:
        """Delete up to :data:`MAX_ROWS` rows of the jobs last written before ``before`` (epoch
        s), the oldest job first. Returns (rows deleted, whether any are left to delete)."""
        budget = MAX_ROWS
        stale = [r[0] for r in conn.execute("SELECT job FROM written WHERE time < ? ORDER BY time", (before,))]
        for job in stale:
            for table, where in _TABLES:
                budget -= conn.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                                       f"WHERE {where} LIMIT :n)", {"job": job, "n": budget}).rowcount
                if budget <= 0:                         # (some of this table's may be left)
                    return MAX_ROWS, True
            conn.execute("DELETE FROM written WHERE job = ?", (job,))
        return MAX_ROWS - budget, False
