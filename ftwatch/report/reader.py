"""Where ``ftwatch report`` reads from: the :class:`ReportReader` interface and its SQLite reader.

The report needs six queries per job. Any store that answers them in the shapes below can
feed it: :class:`SqliteReader` reads the embedded store (SPEC E1); an Elasticsearch reader
(SPEC E2's indices) would implement the same methods with searches on the job's documents,
sorted by time, and map the ECS fields back to these keys.

Shapes (times are epoch seconds unless named ``*_iso``; see ``ftwatch.pipeline.sinks.sqlite``):

=============  ===========================================================================
``jobs``       job ids, sorted
``runs``       job, attempt, started, ended (or None), status, command
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

from pathlib import Path
from typing import Any, Protocol

from ftwatch.pipeline.sinks.sqlite import SqliteStore

Row = dict[str, Any]


class ReportReader(Protocol):
    """What the report reads; each method returns rows in time order (``jobs``: sorted)."""

    source: str        # shown in the page, e.g. the database path

    def jobs(self) -> list[str]: ...
    def runs(self, job: str) -> list[Row]: ...
    def events(self, job: str) -> list[Row]: ...
    def findings(self, job: str) -> list[Row]: ...
    def decisions(self, job: str) -> list[Row]: ...
    def output(self, job: str) -> list[Row]: ...
    def close(self) -> None: ...


class SqliteReader:
    """Reads the embedded SQLite store.

    Args:
        path: the database file (``<state-dir>/ftwatch.db``).

    Raises:
        FileNotFoundError: there is no such file (opening would create an empty store).
        ftwatch.errors.SinkError: the file is not an ftwatch store, or is from a newer ftwatch.
    """

    def __init__(self, path: Path | str):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no store at {path}")
        self.source = str(path)
        self._store = SqliteStore(path)

    def jobs(self) -> list[str]:
        return self._store.jobs()

    def runs(self, job: str) -> list[Row]:
        return self._store.runs(job)

    def events(self, job: str) -> list[Row]:
        return self._store.events(job)

    def findings(self, job: str) -> list[Row]:
        return self._store.findings_for(job)

    def decisions(self, job: str) -> list[Row]:
        return self._store.decisions(job)

    def output(self, job: str) -> list[Row]:
        return self._store.output(job)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> "SqliteReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
