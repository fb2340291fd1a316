"""Where ``ftwatch report`` reads from: the :class:`ReportReader` interface and its SQLite reader.

The report needs six queries per job. Any store that answers them in the shapes below can
feed it: :class:`SqliteReader` reads the embedded store (SPEC E1);
``ftwatch.report.esreader.EsReader`` reads the Elasticsearch data streams (SPEC E2) and maps
the ECS documents back to these keys (``ftwatch.pipeline.sinks.elasticsearch.ecsread``).

A time window (``since`` / ``until``, epoch seconds, either open) keeps the records timed in
``[since, until)`` (output: the buckets starting there), the runs that overlap it (:func:`run_in_window`)
and the jobs with a record in it.

Shapes (times are epoch seconds unless named ``*_iso``; see ``ftwatch.pipeline.sinks.sqlite``):

=============  ===========================================================================
``jobs``       job ids, sorted
``runs``       job, attempt, started, ended (or None), status, command; in the order they
               started (a job id used again: a run per start, ``sinks.runs``)
``events``     time, job, instance, rank, kind, detail (dict); kinds the report uses:
               ``job_start``, ``instance_start``, ``instance_exit`` (detail: returncode,
               signal, stopped_by_us), ``job_restart``, ``instance_restart``, ``actuator``
               (detail: action, status)
``findings``   ``Finding.to_dict()`` keys (instance, rank, rule_id, kind, failure_class,
               action, severity, line, fields ...) with ``epoch`` and ``attempt``
``decisions``  decision_id, epoch, action, target (dict), root_cause (finding dict or None),
               policy_clause, restarts_used, restarts_left, attempt
``output``     instance, rank, bucket (start, epoch s), seconds, lines, bytes
=============  ===========================================================================
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol

from ftwatch.pipeline.sinks.sqlite import SqliteStore

Row = dict[str, Any]


class ReportReader(Protocol):
    """What the report reads; each method returns rows in time order (``jobs``: sorted);
    ``findings`` and ``output`` may be generators, read once."""

    source: str        # shown in the page, e.g. the database path

    def jobs(self) -> list[str]: ...
    def runs(self, job: str) -> list[Row]: ...
    def events(self, job: str) -> list[Row]: ...
    def findings(self, job: str) -> Iterable[Row]: ...   # iterated once (a generator at most)
    def decisions(self, job: str) -> list[Row]: ...
    def output(self, job: str) -> Iterable[Row]: ...    # iterated once, like findings
    def close(self) -> None: ...
    # optional: output_bounds(job) -> (first, last bucket start, shortest bucket) | None, so that ``output`` can be
    # a generator (SqliteReader); without it, ``output`` is read into a list to find them


def in_window(t: float, since: float | None, until: float | None) -> bool:
    """``since <= t < until`` (None: open)."""
    return (since is None or t >= since) and (until is None or t < until)


def run_in_window(run: Row, since: float | None, until: float | None) -> bool:
    """Whether a run (``started`` / ``ended`` epoch s, either None) overlaps ``[since, until)``;
    a run not ended is open to the future."""
    start = run["started"] if run.get("started") is not None else run.get("ended")
    end = run["ended"] if run.get("ended") is not None else math.inf
    if start is None:
        return True
    return (until is None or start < until) and (since is None or end >= since)


class SqliteReader:
    """Reads the embedded SQLite store.

    Args:
        path: the database file (``<state-dir>/ftwatch.db``).
        since, until: the time window (epoch s; None: open), see the module doc.

    Raises:
        FileNotFoundError: there is no such file (opening would create an empty store).
        ftwatch.errors.SinkError: the file is not an ftwatch store, or is from a newer ftwatch.
    """

    def __init__(self, path: Path | str, since: float | None = None, until: float | None = None):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no store at {path}")
        self.source = str(path)
        self.since, self.until = since, until
        self._store = SqliteStore(path)

    def _keep(self, rows: list[Row], key: str) -> list[Row]:
        if self.since is None and self.until is None:
            return rows
        return [r for r in rows if in_window(r[key], self.since, self.until)]

    def jobs(self) -> list[str]:
        return self._store.jobs(self.since, self.until)

    def runs(self, job: str) -> list[Row]:
        return [r for r in self._store.runs(job) if run_in_window(r, self.since, self.until)]

    def events(self, job: str) -> list[Row]:
        return self._keep(self._store.events(job), "time")

    def findings(self, job: str) -> Iterator[Row]:
        """The job's findings in time order, read as they are used (a store may hold hundreds
        of thousands: the report folds them one by one, ``ftwatch.report.model``)."""
        since, until = self.since, self.until
        for r in self._store.iter_findings(job):
            if in_window(r["epoch"], since, until):
                yield r

    def decisions(self, job: str) -> list[Row]:
        """The job's decisions in time order, without the store's own ``run`` (a row id that
        ``explain`` reads; no other store has it)."""
        return [{k: v for k, v in d.items() if k != "run"} for d in self._keep(self._store.decisions(job), "epoch")]

    def output(self, job: str) -> Iterator[Row]:
        """The job's output counts by instance, then bucket, read as they are used."""
        since, until = self.since, self.until
        for r in self._store.iter_output(job):
            if in_window(r["bucket"], since, until):
                yield r

    def output_bounds(self, job: str) -> tuple[float, float, float] | None:
        """The first and the last bucket start of :meth:`output`'s rows and their shortest
        bucket (None: it has none)."""
        return self._store.output_bounds(job, self.since, self.until)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> "SqliteReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
