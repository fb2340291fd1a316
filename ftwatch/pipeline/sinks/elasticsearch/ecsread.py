"""The way back: ECS documents written by ``ecs`` -> the rows the SQLite store's readers return.

Pure functions, no I/O (``ftwatch.report.esreader`` searches; this maps). The row shapes are
``ftwatch.report.reader``'s (the SQLite store's). Each takes a document ``_source`` and ``seq``,
the ``event.sequence`` the sink gave it (the order it was written), which breaks ties between
equal times as the SQLite row ids do.

What does not come back: a decision's ``findings`` list (the document has only
``findings_count``; the list is ``[]``) and its ``root_cause`` has the fields ``ecs`` keeps
(rule_id, failure_class, instance, rank, node, line); a finding's ``evidence`` is
``error.stack_trace`` split at newlines. Documents from before ``ftwatch.epoch`` existed take
their time from ``@timestamp`` (milliseconds).
"""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import Any, Iterable

from ftwatch.events import iso

Row = dict[str, Any]


def epoch(source: Row) -> float:
    """The document's time in epoch seconds: ``ftwatch.epoch``, else ``@timestamp``."""
    value = (source.get("ftwatch") or {}).get("epoch")
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.fromisoformat(str(source["@timestamp"]).replace("Z", "+00:00")).timestamp()


def sequence(source: Row) -> int:
    """``event.sequence`` (0 when absent)."""
    value = (source.get("event") or {}).get("sequence")
    return int(value) if isinstance(value, int) else 0


def is_run_end(source: Row) -> bool:
    """True for ``ecs.run_end_doc``'s ``job_end`` documents (they feed ``runs``, not ``events``)."""
    ftw = source.get("ftwatch") or {}
    return ftw.get("kind") == "job_end" and "detail" not in ftw and "status" in ftw


def event_row(source: Row) -> Row:
    """An ``events`` document -> time, job, instance, rank, kind, detail."""
    ftw = source["ftwatch"]
    return {"time": epoch(source), "job": ftw.get("job"), "instance": ftw.get("instance"),
            "rank": ftw.get("rank"), "kind": ftw.get("kind"), "detail": dict(ftw.get("detail") or {})}


def finding_row(source: Row) -> Row:
    """A ``findings`` document -> ``Finding.to_dict()`` keys plus ``epoch`` and ``attempt``."""
    ftw = source["ftwatch"]
    t = epoch(source)
    trace = (source.get("error") or {}).get("stack_trace")
    row = {k: ftw.get(k) for k in ("job", "attempt", "instance", "rank", "node", "stream", "rule_id",
                                   "kind", "failure_class", "action", "severity", "line", "seq",
                                   "fields", "source")}
    row.update(time=iso(t), epoch=t, evidence=trace.split("\n") if trace else [],
               fields=dict(row["fields"] or {}), attempt=int(row["attempt"] or 0))
    return row


def decision_row(source: Row) -> Row:
    """A ``decisions`` document -> decision_id, time (ISO), epoch, job, action, target,
    root_cause (or None), policy_clause, restarts_used, restarts_left, attempt, findings ([])."""
    ftw = source["ftwatch"]
    t = epoch(source)
    return {"decision_id": ftw["decision_id"], "time": iso(t), "epoch": t, "job": ftw.get("job"),
            "action": ftw.get("action"), "target": dict(ftw.get("target") or {}),
            "root_cause": ftw.get("root_cause"), "policy_clause": ftw.get("policy_clause"),
            "restarts_used": ftw.get("restarts_used"), "restarts_left": ftw.get("restarts_left"),
            "attempt": ftw.get("attempt", 0), "findings": []}


def _command(value: Any) -> str:
    if isinstance(value, list):
        return shlex.join(str(c) for c in value)
    return "" if value is None else str(value)


def _new_run(job: Any, attempt: int) -> Row:
    return {"job": job, "attempt": attempt, "started": None, "ended": None, "status": "running",
            "command": ""}


def run_rows(sources: Iterable[Row]) -> list[Row]:
    """``job_start`` events and ``job_end`` documents of one job, in written order -> its runs
    (job, attempt, started, ended, status, command) in the order they started, as the SQLite
    store keeps them (``sinks.runs``): a start sets command on its attempt's newest run where
    that still runs (ftwatch restarted: the run keeps its first start), else begins a new run
    with started, command and status ``running`` (a job id used again); an end sets ended and
    status on its attempt's newest run."""
    runs: list[Row] = []
    newest: dict[int, Row] = {}                      # attempt -> its newest run
    for s in sources:
        ftw = s["ftwatch"]
        if is_run_end(s):
            attempt = ftw.get("attempt")
            if not isinstance(attempt, int):
                continue
            run = newest.get(attempt)
            if run is None:
                run = newest[attempt] = _new_run(ftw.get("job"), attempt)
                runs.append(run)
            run.update(ended=epoch(s), status=ftw.get("status"))
        elif ftw.get("kind") == "job_start":
            detail = ftw.get("detail") or {}
            attempt = detail.get("attempt")
            if not isinstance(attempt, int):
                continue
            run = newest.get(attempt)
            if run is None or run["status"] != "running":
                run = newest[attempt] = _new_run(ftw.get("job"), attempt)
                run["started"] = epoch(s)
                runs.append(run)
            run["command"] = _command(detail.get("command"))
    return runs
