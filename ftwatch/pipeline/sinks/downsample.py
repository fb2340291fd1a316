"""Old output counts merged into coarser buckets, so the SQLite store stops growing by a row per
instance and bucket for as long as ``watch`` runs (issue 16: the monitor stays small).

``ftwatch watch`` stores one ``output`` row per instance per ``storage.metrics.output_bucket``
(5 s) in which it printed: 1,000 pods that print all the time add 17 M rows, ~1.3 GB, a day.
The report plots at most a few hundred points per instance, so beyond a job's newest
``output_full_window`` seconds (a day) the rows of each instance are merged, ``coarse`` seconds
(300) at a time, into one row per instance per coarse bucket: the sums stay exact, the file's
growth falls 60 times over, and the report spreads a coarse row over the plotted buckets it
covers (``ftwatch.report.model``).

Schema 5 marks a merged row (``merged = 1``) and indexes the rows not merged yet by job and
bucket (a partial index: it holds the full-resolution window only), so a merge pass finds its
rows without reading the merged ones. A pass runs in the transaction of the write that moved a
job's newest bucket past the next coarse boundary, and merges at most :data:`MAX_ROWS` rows (a
store that grew before this existed catches up over several writes). The window is counted back
from the job's own newest bucket, not from the clock: a replay of an old log is merged as a live
job of the same length would be, never deleted.

``ftwatch.pipeline.sinks.sqlite`` owns the file and its transactions; it calls
:meth:`OutputDownsampler.after_write` inside a write's transaction.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Sequence

from ftwatch.pipeline.sinks.base import OutputBatch, Record

SCHEMA_V5 = """
ALTER TABLE output ADD COLUMN merged INTEGER NOT NULL DEFAULT 0;
CREATE INDEX output_unmerged ON output (job, bucket) WHERE merged = 0;
"""

MAX_JOBS = 10_000
"""Jobs whose merged boundary is remembered (the least recently merged forgotten first)."""

MAX_ROWS = 100_000
"""Rows merged at most in one pass (one write's transaction): ~0.3 s of SQLite work on 2 cores.
A steady watch merges one coarse bucket of rows per pass (1,000 instances: 60,000 rows)."""

_MERGE = """
INSERT INTO output (job, instance, rank, bucket, seconds, lines, bytes, merged)
SELECT job, instance, max(rank), CAST(bucket / :c AS INTEGER) * :c AS start, :c, sum(lines), sum(bytes), 1
FROM output WHERE job = :job AND merged = 0 AND bucket >= :lo AND bucket < :hi AND seconds < :c
GROUP BY instance, start
ON CONFLICT (job, instance, bucket) DO UPDATE SET
    lines = excluded.lines + CASE WHEN merged THEN lines ELSE 0 END,
    bytes = excluded.bytes + CASE WHEN merged THEN bytes ELSE 0 END,
    rank = coalesce(rank, excluded.rank), seconds = excluded.seconds, merged = 1
"""
# the coarse row's key may be a row of the pass itself (the fine bucket that starts the coarse
# one: its counts are in the sums, so replaced) or one merged before (a late write: added to)

_DROP = "DELETE FROM output WHERE job = :job AND merged = 0 AND bucket >= :lo AND bucket < :hi AND seconds < :c"
_KEEP = "UPDATE output SET merged = 1 WHERE job = :job AND merged = 0 AND bucket >= :lo AND bucket < :hi"
# rows as long as a coarse bucket or longer (written under another output_bucket) stay as they are


class OutputDownsampler:
    """Merges each job's output counts older than its newest ``full_window`` seconds into
    ``coarse`` seconds long buckets (starting at multiples of ``coarse``, epoch s).

    Args:
        full_window: seconds of each job's newest output kept at full resolution, > 0.
        coarse: seconds per merged bucket, > 0 (``storage.metrics`` checks that it is a whole
            multiple of the bucket the rows were written with).

    Raises:
        ValueError: a length that is not a positive finite number.
    """

    def __init__(self, full_window: float, coarse: float):
        if not all(v > 0 and math.isfinite(v) for v in (full_window, coarse)):
            raise ValueError(f"full window and coarse bucket must be positive seconds, got "
                             f"{full_window!r}, {coarse!r}")
        self.full_window = float(full_window)
        self.coarse = float(coarse)
        self._done: dict[str, float] = {}      # job -> the boundary below which it is merged

    def cutoff(self, newest: float) -> float:
        """The coarse boundary (epoch s) below which a job whose newest bucket starts at
        ``newest`` is merged."""
        return math.floor((newest - self.full_window) / self.coarse) * self.coarse

    def after_write(self, conn: sqlite3.Connection, batch: Sequence[Record]) -> int:
        """One pass for each job whose newest bucket in ``batch``'s output rows moved its cutoff
        on; run inside the transaction that wrote ``batch``. Returns the rows merged."""
        newest: dict[str, float] = {}
        for record in batch:
            if isinstance(record, OutputBatch):
                for row in record.rows:                 # (job, instance, rank, bucket, ...)
                    newest[row[0]] = max(row[3], newest.get(row[0], row[3]))
        merged = 0
        for job, bucket in newest.items():
            cut = self.cutoff(bucket)
            if cut > self._done.get(job, -math.inf):
                done, rows = self._pass(conn, job, cut)
                merged += rows
                if done:
                    self._done.pop(job, None)           # most recently merged last
                    self._done[job] = cut
                    if len(self._done) > MAX_JOBS:      # a forgotten job costs one indexed query
                        del self._done[next(iter(self._done))]
        return merged

    def _pass(self, conn: sqlite3.Connection, job: str, cut: float) -> tuple[bool, int]:
        """Merge ``job``'s rows below ``cut``, at most :data:`MAX_ROWS` of them (whole coarse
        buckets). Returns (all merged below ``cut``, rows merged)."""
        first = conn.execute("SELECT min(bucket) FROM output WHERE job = ? AND merged = 0",
                             (job,)).fetchone()[0]
        if first is None or first >= cut:
            return True, 0
        lo = math.floor(first / self.coarse) * self.coarse
        hi = cut
        far = conn.execute("SELECT bucket FROM output WHERE job = ? AND merged = 0 AND bucket >= ? "
                           "ORDER BY bucket LIMIT 1 OFFSET ?", (job, lo, MAX_ROWS)).fetchone()
        if far is not None:
            hi = min(cut, max(math.floor(far[0] / self.coarse) * self.coarse, lo + self.coarse))
        args = {"job": job, "lo": lo, "hi": hi, "c": self.coarse}
        conn.execute(_MERGE, args)
        rows = conn.execute(_DROP, args).rowcount
        conn.execute(_KEEP, args)
        return hi >= cut, rows
