"""Each run of a job in the SQLite store, apart from the other runs of the same job id.

A job id comes back: ``ftwatch run`` without ``--job-id`` names the job by its directory and
command (``local-`` and a hash: ``cli.common.job_id_for``), so running the same command again
is the same job, and so is an explicit ``--job-id`` given again. A run that starts after the
job ended starts its budgets afresh (``policy.budgets``), at attempt 0 again. Keyed by (job,
attempt), as the store was up to schema 6, the second run replaced the first's row in ``runs``,
and its decisions were explained with the first run's findings, which share its job and
attempt: "the job succeeded" explained by the CUDA error of the run before.

Schema 7 gives every start its own row, ``runs(id, job, attempt, started, ended, status,
command)``, and marks each finding and decision with the run it belongs to (``run``: the id of
the newest ``runs`` row of its job and attempt when it was written; the store writes records in
their order, and a run's start is recorded before its workers start). A start whose job and
attempt have a row still ``running`` continues that row, which keeps its first start: ftwatch
itself was restarted and goes on with the job (the budgets say so), or ``watch`` met again a job
it had let go when it fell silent; a start after that row ended makes a new one.

``run`` records a start per attempt; ``watch`` one when it first meets a job (when it saw the
job's output first: the job began earlier) and one per attempt its decisions start, and an end
when it restarts or fails the job, so a job of the same name that a cluster runs again after
``watch`` failed it is a run of its own.

``ftwatch explain`` reads the findings of a decision's own run (``run IS`` the decision's:
rows written before schema 7, and those of jobs no ``RunStart`` names, have none, and are read
as before, by job and attempt).

``ftwatch.pipeline.sinks.sqlite`` owns the file, its migrations and transactions; this module
gives it the schema step, the two records' encoders (:data:`ENCODERS`) and :data:`RUN_OF`.
"""

from __future__ import annotations

import shlex

from ftwatch.pipeline.sinks.base import RunEnd, RunStart

SCHEMA_V7 = """
CREATE TABLE runs_v7 (
    id INTEGER PRIMARY KEY, job TEXT NOT NULL, attempt INTEGER NOT NULL, started REAL, ended REAL,
    status TEXT NOT NULL DEFAULT 'running', command TEXT NOT NULL DEFAULT '');
INSERT INTO runs_v7 (job, attempt, started, ended, status, command)
    SELECT job, attempt, started, ended, status, command FROM runs ORDER BY job, attempt;
DROP TABLE runs;
ALTER TABLE runs_v7 RENAME TO runs;
CREATE INDEX runs_job_attempt ON runs (job, attempt, id);
ALTER TABLE findings ADD COLUMN run INTEGER;
ALTER TABLE decisions ADD COLUMN run INTEGER;
"""

RUN_OF = "(SELECT max(id) FROM runs WHERE job = ? AND attempt = ?)"
"""The run a record of a job and attempt (the two parameters) belongs to: the newest row."""

_NEWEST = "id = (SELECT max(id) FROM runs WHERE job = :job AND attempt = :attempt)"


def _start_rows(r: RunStart) -> list[tuple[str, list]]:
    """A start: the newest row of its job and attempt goes on where it is still running (ftwatch
    restarted; the run keeps its first start), else a new row."""
    command = r.command if isinstance(r.command, str) else shlex.join(str(c) for c in r.command)
    row = {"job": r.job, "attempt": r.attempt, "time": r.time, "command": command}
    return [(f"UPDATE runs SET command = :command WHERE {_NEWEST} AND status = 'running'", [row]),
            ("INSERT INTO runs (job, attempt, started, status, command) "
             "SELECT :job, :attempt, :time, 'running', :command WHERE changes() = 0", [row])]


def _end_rows(r: RunEnd) -> list[tuple[str, list]]:
    """An end: of the newest row of its job and attempt (a row of its own where none started)."""
    row = {"job": r.job, "attempt": r.attempt, "time": r.time, "status": r.status}
    return [(f"UPDATE runs SET ended = :time, status = :status WHERE {_NEWEST}", [row]),
            ("INSERT INTO runs (job, attempt, ended, status) "
             "SELECT :job, :attempt, :time, :status WHERE changes() = 0", [row])]


ENCODERS = {RunStart: _start_rows, RunEnd: _end_rows}
"""The run records -> the statements and rows that store them (executed in order)."""
