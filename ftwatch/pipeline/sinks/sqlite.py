"""The embedded store: every run, event, finding, decision and alert in one SQLite file (SPEC E1).

``ftwatch report`` and ``ftwatch explain`` read it. Tables (times are epoch seconds, REAL;
JSON columns hold text)::

    runs(id, job, attempt, started, ended, status, command)       one row per start of an attempt
    events(time, job, instance, rank, kind, detail JSON)          process starts/exits, restarts, stops
    findings(job, attempt, instance, rank, node, stream, rule_id, kind, failure_class, action,
             severity, line, time, seq, evidence JSON, fields JSON, source, run)
    decisions(decision_id PK, time, job, action, target JSON, root_cause JSON, policy_clause,
              restarts_used, restarts_left, attempt, findings JSON, run)
    alerts(notification_id, decision_id, receiver, status, attempts, error, text, time)
    output(job, instance, rank, bucket, seconds, lines, bytes, merged) primary key (job, instance, bucket)
    positions(key, seq, document BLOB, time)                       primary key (key)
    chunks(id, source, chunk, time)                                unique (source, chunk)
    open_blocks(origin JSON PK, labels JSON, data BLOB, base, skip JSON, time)
    written(job PK, time)

``output`` (schema 2) is the output volume per instance over time: ``lines`` and ``bytes`` read
from ``instance`` in the ``seconds`` long bucket starting at ``bucket`` (epoch s); writing the
same bucket again adds to it. Rows older than a job's newest ``output_full_window`` are merged
into coarser ones (``merged``, schema 5: ``ftwatch.pipeline.sinks.downsample``).

``runs`` has a row per start (schema 7), and ``run`` marks the row a finding or decision belongs
to, so a job id used again (the same command run again) keeps its runs apart
(``ftwatch.pipeline.sinks.runs``).

``written(job PK, time)`` (schema 6) is when the store last wrote each job (wall clock), and
``runs.written`` (schema 8) each run; a job, or a run that is not its job's newest, not written
for ``storage.sqlite_retention`` is deleted (``ftwatch.pipeline.sinks.retention``).

``positions`` (schema 3), ``chunks`` and ``open_blocks`` (schema 4) are the exactly-once marks
that a batch leaves for ``watch``'s next start, written in that batch's transaction (issue 17):
their schemas, encoders and readers are ``ftwatch.pipeline.sinks.marks``.

The file is in WAL mode (readers such as ``ftwatch report`` do not block the writer) and its
schema version is ``PRAGMA user_version``. It is a sink (``ftwatch.pipeline.sinks.base.Sink``):
each :meth:`SqliteStore.write` of a batch of records is one transaction.

Threads: a store may be used from any thread; calls are serialised by an internal lock, so a
concurrent call (``ftwatch report`` reading in a thread while the pipeline writes) waits
instead of corrupting state.

Readers return plain dicts. Findings come back shaped like ``Finding.to_dict()`` (``time`` as
ISO-8601) with ``epoch`` (epoch seconds) and ``attempt`` added; decisions likewise carry
``time`` (ISO) and ``epoch``.

About 470 lines, one job (the embedded store): the readers, paged ones included, share the
writer's connection and lock; split off, they would reach into both.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time as _time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ftwatch.errors import SinkError
from ftwatch.events import Decision, DeliveryResult, Finding, Origin, iso
from ftwatch.pipeline.sinks import marks, runs
from ftwatch.pipeline.sinks.downsample import SCHEMA_V5, OutputDownsampler
from ftwatch.pipeline.sinks.retention import SCHEMA_V6, SCHEMA_V8, JobRetention
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, Record, encode

SCHEMA_VERSION = 8

_SCHEMA_V1 = """
CREATE TABLE runs (
    job TEXT NOT NULL, attempt INTEGER NOT NULL, started REAL, ended REAL,
    status TEXT NOT NULL DEFAULT 'running', command TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (job, attempt));
CREATE TABLE events (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, job TEXT NOT NULL, instance TEXT,
    rank INTEGER, kind TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '{}');
CREATE INDEX events_job_time ON events (job, time);
CREATE TABLE findings (
    id INTEGER PRIMARY KEY, job TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,
    instance TEXT, rank INTEGER, node TEXT, stream TEXT, rule_id TEXT NOT NULL, kind TEXT,
    failure_class TEXT, action TEXT, severity TEXT, line TEXT, time REAL NOT NULL,
    seq INTEGER NOT NULL DEFAULT 0, evidence TEXT NOT NULL DEFAULT '[]',
    fields TEXT NOT NULL DEFAULT '{}', source TEXT NOT NULL DEFAULT '');
CREATE INDEX findings_job_attempt ON findings (job, attempt, time);
CREATE TABLE decisions (
    decision_id TEXT PRIMARY KEY, time REAL NOT NULL, job TEXT NOT NULL, action TEXT NOT NULL,
    target TEXT NOT NULL, root_cause TEXT, policy_clause TEXT NOT NULL DEFAULT '',
    restarts_used INTEGER NOT NULL DEFAULT 0, restarts_left INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 0, findings TEXT NOT NULL DEFAULT '[]');
CREATE INDEX decisions_job_time ON decisions (job, time);
CREATE TABLE alerts (
    id INTEGER PRIMARY KEY, notification_id TEXT NOT NULL, decision_id TEXT,
    receiver TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '', text TEXT NOT NULL DEFAULT '', time REAL NOT NULL);
CREATE INDEX alerts_decision ON alerts (decision_id);
"""

_SCHEMA_V2 = """
CREATE TABLE output (
    job TEXT NOT NULL, instance TEXT NOT NULL, rank INTEGER, bucket REAL NOT NULL,
    seconds REAL NOT NULL, lines INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, instance, bucket));
"""

# version reached -> the script that gets there from the one before
_MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1, 2: _SCHEMA_V2, 3: marks.SCHEMA_V3, 4: marks.SCHEMA_V4, 5: SCHEMA_V5,
                                6: SCHEMA_V6, 7: runs.SCHEMA_V7, 8: SCHEMA_V8}

_FINDING_COLUMNS = ("job", "attempt", "instance", "rank", "node", "stream", "rule_id", "kind",
                    "failure_class", "action", "severity", "line", "time", "seq", "evidence",
                    "fields", "source")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def finding_record(f: Finding) -> dict[str, Any]:
    """``Finding.to_dict()`` plus ``epoch`` (the finding's time in epoch seconds)."""
    return {**f.to_dict(), "epoch": f.time}


# -- the encoder: record -> [(SQL, rows)] ------------------------------------------------------

def _event_rows(e: LifecycleEvent) -> list[tuple[str, list[tuple]]]:
    return [("INSERT INTO events (time, job, instance, rank, kind, detail) VALUES (?, ?, ?, ?, ?, ?)",
             [(e.time, e.job, e.instance, e.rank, e.kind, _dumps(dict(e.detail or {})))])]


def _findings_rows(b: FindingBatch) -> list[tuple[str, list[tuple]]]:
    rows = []
    for f in b.findings:
        d = f.to_dict()
        d.update(attempt=b.attempt, time=f.time, evidence=_dumps(d["evidence"]), fields=_dumps(d["fields"]))
        rows.append((*(d[c] for c in _FINDING_COLUMNS), d["job"], b.attempt))
    marks = ", ".join("?" * len(_FINDING_COLUMNS))
    return [(f"INSERT INTO findings ({', '.join(_FINDING_COLUMNS)}, run) VALUES ({marks}, {runs.RUN_OF})",
             rows)] if rows else []


def _decision_rows(d: Decision) -> list[tuple[str, list[tuple]]]:
    t, rc = d.target, d.root_cause
    return [("INSERT OR REPLACE INTO decisions (decision_id, time, job, action, target, root_cause, "
             "policy_clause, restarts_used, restarts_left, attempt, findings, run) "
             f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {runs.RUN_OF})",
             [(d.decision_id, d.time, t.job, d.action.label,
               _dumps({"job": t.job, "instance": t.instance, "rank": t.rank, "node": t.node}),
               None if rc is None else _dumps(finding_record(rc)), d.policy_clause,
               d.restarts_used, d.restarts_left, d.attempt,
               _dumps([finding_record(f) for f in d.findings]), t.job, d.attempt)])]


def _delivery_rows(r: DeliveryResult) -> list[tuple[str, list[tuple]]]:
    decision_id = r.decision_id or r.notification_id.split("-")[0]
    return [("INSERT INTO alerts (notification_id, decision_id, receiver, status, attempts, error, "
             "text, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
             [(r.notification_id, decision_id, r.receiver, r.status, int(r.attempts), r.error or "",
               r.text or "", r.time or _time.time())])]


def _output_rows(b: OutputBatch) -> list[tuple[str, list[tuple]]]:
    if not b.rows:
        return []
    return [("INSERT INTO output (job, instance, rank, bucket, seconds, lines, bytes) "
             "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job, instance, bucket) DO UPDATE SET "
             "lines = lines + excluded.lines, bytes = bytes + excluded.bytes", list(b.rows))]


_ENCODERS = {**runs.ENCODERS, LifecycleEvent: _event_rows,
             FindingBatch: _findings_rows, Decision: _decision_rows, DeliveryResult: _delivery_rows,
             OutputBatch: _output_rows, **marks.ENCODERS}
"""Every sink record -> the statements and rows that store it."""


class SqliteStore:
    """The SQLite file behind ``report`` and ``explain``: a ``Sink`` (:meth:`write`), and apart
    from it the reading side (the methods below ``readers``): ``explain`` reads it as its
    ``ftwatch.alerting.explain.DecisionStore``, ``report`` through ``SqliteReader`` (its
    ``ReportReader``).

    Args:
        path: the database file; its parent directory is created if missing.
        downsample: merges old output counts into coarser buckets in the transaction of the
            write that made them old (``storage.metrics.output_full_window``); None: never.
        retention: deletes the jobs not written for ``storage.sqlite_retention``, in a write's
            transaction; None: keeps every job.

    Raises:
        SinkError: (not retryable) when the file cannot be opened, is not a database, or
            was written by a newer ftwatch (its ``user_version`` is above ours).
    """

    def __init__(self, path: Path, downsample: OutputDownsampler | None = None,
                 retention: JobRetention | None = None):
        self.path = Path(path)
        self.downsample = downsample
        self.retention = retention
        self._lock = threading.RLock()
        self._depth = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path), isolation_level=None,
                                         check_same_thread=False, timeout=10.0)
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except (sqlite3.Error, OSError) as exc:
            raise SinkError(f"cannot open the SQLite store {self.path}: {exc}",
                            retryable=False) from exc

    def _migrate(self) -> None:
        with self.batch():  # BEGIN IMMEDIATE: two processes opening a new file do not race
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SinkError(f"{self.path} has schema version {version}, newer than this "
                                f"ftwatch's {SCHEMA_VERSION}", retryable=False)
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version = {int(target)}")

    @property
    def schema_version(self) -> int:
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        """Close the file (further calls fail)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "SqliteStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction around everything written inside (nests; the outermost commits).

        Raises:
            SinkError: retryable when the database is locked or busy, else not; the
                transaction is rolled back.
        """
        with self._lock:
            outer = self._depth == 0
            try:
                if outer:
                    self._conn.execute("BEGIN IMMEDIATE")
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                if outer:
                    self._conn.execute("COMMIT")
            except BaseException as exc:
                if outer and self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    busy = isinstance(exc, sqlite3.OperationalError) and (
                        "locked" in str(exc) or "busy" in str(exc))
                    raise SinkError(f"SQLite write to {self.path} failed: {exc}",
                                    retryable=busy) from exc
                raise

    # -- the sink face ------------------------------------------------------------------------

    def write(self, batch: Sequence[Record]) -> None:
        """Store every record of ``batch`` (``ftwatch.pipeline.sinks.base``) in one transaction.
        A decision again replaces it (a replay is idempotent); an output bucket already stored
        is added to; a delivery without a time is stamped now.

        Raises:
            SinkError: as :meth:`batch`; nothing of the batch is stored then.
            TypeError: a record that is not a sink record.
        """
        statements = [st for record in batch for st in (encode(_ENCODERS, record) or ())]
        if not statements:
            return
        with self.batch():
            for sql, rows in statements:
                self._conn.executemany(sql, rows)
            if self.downsample is not None:
                self.downsample.after_write(self._conn, batch)
            if self.retention is not None:
                self.retention.after_write(self._conn, batch)

    # -- readers ----------------------------------------------------------------------------

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, tuple(args)).fetchall()

    def runs(self, job: str | None = None) -> list[dict[str, Any]]:
        """Runs by job, then in the order they started (a job id used again has a run per start,
        each from attempt 0): job, attempt, started, ended (epoch s or None), status, command."""
        where, args = ("WHERE job = ?", (job,)) if job is not None else ("", ())
        return [dict(r) for r in self._rows(
            f"SELECT job, attempt, started, ended, status, command FROM runs {where} "
            "ORDER BY job, id", args)]

    def events(self, job: str | None = None) -> list[dict[str, Any]]:
        """Events in time order: time (epoch s), job, instance, rank, kind, detail (dict)."""
        where, args = ("WHERE job = ?", (job,)) if job is not None else ("", ())
        out = []
        for r in self._rows(f"SELECT time, job, instance, rank, kind, detail FROM events "
                            f"{where} ORDER BY time, id", args):
            d = dict(r)
            d["detail"] = json.loads(d["detail"])
            out.append(d)
        return out

    def jobs(self, since: float | None = None, until: float | None = None) -> list[str]:
        """Every job with a run, an event, a finding, a decision or output, sorted.

        With ``since`` / ``until`` (epoch s): only jobs with an event, finding, decision or output
        bucket timed in ``[since, until)``.
        """
        if since is None and until is None:
            return [r[0] for r in self._rows(
                "SELECT job FROM runs UNION SELECT job FROM events UNION SELECT job FROM findings "
                "UNION SELECT job FROM decisions UNION SELECT job FROM output ORDER BY 1")]
        lo = -float("inf") if since is None else since
        hi = float("inf") if until is None else until
        parts = [f"SELECT job FROM {table} WHERE {col} >= ? AND {col} < ?" for table, col in
                 (("events", "time"), ("findings", "time"), ("decisions", "time"), ("output", "bucket"))]
        return [r[0] for r in self._rows(" UNION ".join(parts) + " ORDER BY 1", (lo, hi) * 4)]

    def output(self, job: str | None = None) -> list[dict[str, Any]]:
        """Output counts by job, instance, then bucket: job, instance, rank, bucket (epoch s,
        the bucket's start), seconds (its length), lines, bytes (:meth:`iter_output`)."""
        return list(self.iter_output(job))

    def iter_output(self, job: str | None = None, page: int = 1000) -> Iterator[dict[str, Any]]:
        """:meth:`output`'s rows read ``page`` at a time: ``watch`` stores one per instance and
        bucket (1,000 pods printing all day: 17 M rows), which ``ftwatch report`` folds as they
        come (with :meth:`output_bounds`)."""
        where, args = ("WHERE job = ?", (job,)) if job is not None else ("", ())
        for r in self._iter_rows(f"SELECT job, instance, rank, bucket, seconds, lines, bytes FROM output {where} "
                                 "ORDER BY job, instance, bucket", args, page):
            yield dict(r)

    def output_bounds(self, job: str, since: float | None = None,
                      until: float | None = None) -> tuple[float, float, float] | None:
        """The first and the last bucket start (epoch s) of ``job``'s output counts starting in
        ``[since, until)`` (either open) and their shortest bucket (s; older rows are merged into
        longer ones), or None when it has none there."""
        sql, args = "SELECT min(bucket), max(bucket), min(seconds) FROM output WHERE job = ?", [job]
        if since is not None:
            sql, args = sql + " AND bucket >= ?", args + [since]
        if until is not None:
            sql, args = sql + " AND bucket < ?", args + [until]
        lo, hi, step = self._rows(sql, args)[0]
        return None if lo is None else (lo, hi, step)

    def findings_for(self, job: str, attempt: int | None = None, **run: int | None) -> list[dict[str, Any]]:
        """The findings of ``job`` (of one attempt, or all), in time order (:meth:`iter_findings`)."""
        return list(self.iter_findings(job, attempt, **run))

    def iter_findings(self, job: str, attempt: int | None = None, page: int = 1000,
                      **run: int | None) -> Iterator[dict[str, Any]]:
        """The findings of ``job`` (of one attempt, or all), in time order, read ``page`` rows at
        a time: a long job's store holds hundreds of thousands (a warning per step), which
        ``ftwatch report`` folds as they come instead of holding them all (~2.5 KB each).
        ``run=R``: only those of run ``R`` (a decision's ``run``; None: those of no known run).

        Yields:
            ``Finding.to_dict()`` keys with ``time`` as ISO text, ``epoch`` (epoch s), ``attempt``.
        """
        sql = f"SELECT {', '.join(_FINDING_COLUMNS)} FROM findings WHERE job = ?"
        args: list[Any] = [job]
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        if "run" in run:
            sql += " AND run IS ?"
            args.append(run["run"])
        for r in self._iter_rows(sql + " ORDER BY time, seq, id", args, page):
            d = dict(r)
            d["epoch"] = d["time"]
            d["time"] = iso(d["time"])
            d["evidence"] = json.loads(d["evidence"])
            d["fields"] = json.loads(d["fields"])
            yield d

    def _iter_rows(self, sql: str, args: Sequence[Any], page: int) -> Iterator[sqlite3.Row]:
        """The rows of one query, fetched ``page`` at a time, each fetch under the lock."""
        with self._lock:
            cursor = self._conn.execute(sql, tuple(args))
        while True:
            with self._lock:
                rows = cursor.fetchmany(page)
            if not rows:
                return
            yield from rows

    def decisions(self, job: str | None = None) -> list[dict[str, Any]]:
        """Decisions in time order (see :meth:`decision` for their shape)."""
        where, args = ("WHERE job = ?", (job,)) if job is not None else ("", ())
        return [self._decision(r) for r in self._rows(
            f"SELECT * FROM decisions {where} ORDER BY time, rowid", args)]

    def decision(self, decision_id_or_prefix: str) -> dict[str, Any] | None:
        """One decision by its id or a unique prefix of it; None when none matches.

        Returns:
            dict: decision_id, time (ISO), epoch, job, action, target (dict), root_cause
            (finding dict or None), policy_clause, restarts_used, restarts_left, attempt,
            findings (list of finding dicts), run (the ``runs`` row's id, or None: not known).

        Raises:
            ValueError: the prefix matches several decisions, or is empty.
        """
        key = decision_id_or_prefix.strip()
        if not key:
            raise ValueError("an empty decision id")
        rows = self._rows("SELECT * FROM decisions WHERE substr(decision_id, 1, ?) = ? "
                          "ORDER BY time LIMIT 11", (len(key), key))
        exact = [r for r in rows if r["decision_id"] == key]
        if exact:
            return self._decision(exact[0])
        if len(rows) > 1:
            ids = ", ".join(r["decision_id"] for r in rows[:10])
            raise ValueError(f"decision id prefix {key!r} is ambiguous: {ids}")
        return self._decision(rows[0]) if rows else None

    def last_decision(self) -> dict[str, Any] | None:
        """The latest decision, or None when there is none."""
        rows = self._rows("SELECT * FROM decisions ORDER BY time DESC, rowid DESC LIMIT 1")
        return self._decision(rows[0]) if rows else None

    def deliveries(self, decision_id: str | None = None) -> list[dict[str, Any]]:
        """Alert deliveries in time order: notification_id, decision_id, receiver, status,
        attempts, error, text, time (epoch s)."""
        where, args = ("WHERE decision_id = ?", (decision_id,)) if decision_id else ("", ())
        return [dict(r) for r in self._rows(
            "SELECT notification_id, decision_id, receiver, status, attempts, error, text, "
            f"time FROM alerts {where} ORDER BY time, id", args)]

    def positions(self) -> dict[str, tuple[int, bytes]]:
        """Each shipped source's position stored with its last batch: key -> (seq, document)."""
        return marks.positions(self._rows)

    def chunk_seen(self, source: str, chunk: str) -> bool:
        """Whether a batch that handled Forward ``chunk`` of ``source`` was committed (and its id
        not pruned since)."""
        return marks.chunk_seen(self._rows, source, chunk)

    def open_blocks(self) -> list[tuple[Origin, bytes, float, frozenset[int]]]:
        """The open blocks stored with the last batches: ``(origin, data, base, skip)`` each
        (``Engine.restore_block``)."""
        return marks.open_blocks(self._rows)

    @staticmethod
    def _decision(row: sqlite3.Row) -> dict[str, Any]:
        d = dict(row)
        d["epoch"] = d["time"]
        d["time"] = iso(d["time"])
        d["target"] = json.loads(d["target"])
        d["root_cause"] = None if d["root_cause"] is None else json.loads(d["root_cause"])
        d["findings"] = json.loads(d["findings"])
        return d
