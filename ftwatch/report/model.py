"""The report's data: what a :class:`~ftwatch.report.reader.ReportReader` returns, shaped per job
into the series the page plots (times as seconds since the job's first record).

Pure functions of the rows; no I/O. The page (``templates/report.html.j2``) draws:

- the timeline: one row per instance (plus ``job`` for job-wide marks) with the instance's
  lifetimes (start to exit, coloured by how it ended), hang intervals, findings (by severity),
  restarts and decisions;
- output lines per bucket per instance;
- decisions by action, findings by failure class;
- a table of the root-cause lines.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from ftwatch.events import iso

JOB_ROW = "job"                 # the timeline row of job-wide marks
MAX_FINDINGS = 5000             # findings plotted per job (the most severe, then the latest)
MAX_POINTS = 2000               # output points per instance (longer buckets beyond)
_SEVERITY_RANK = {"critical": 4, "error": 3, "warning": 2, "info": 1}
_HANG_KINDS = ("hang", "exit_hang")

Row = dict[str, Any]


def _rank_key(instance: str, ranks: dict[str, int | None]) -> tuple:
    rank = ranks.get(instance)
    return (rank is None, rank if rank is not None else 0, instance)


def lifetimes(events: Iterable[Row], end: float) -> list[Row]:
    """Each instance's runs from ``instance_start`` to ``instance_exit``.

    Returns:
        dicts instance, start, end (epoch s), status: ``ok`` (exit 0), ``failed``, ``stopped``
        (stopped by ftwatch) or ``running`` (no exit seen; ends at ``end``), and the exit
        ``returncode`` / ``signal``.
    """
    open_: dict[str, float] = {}
    out: list[Row] = []
    for e in events:
        inst = e.get("instance")
        if not inst:
            continue
        if e["kind"] == "instance_start":
            if inst in open_:          # a start without an exit: close the old one there
                out.append(dict(instance=inst, start=open_[inst], end=e["time"], status="running",
                                returncode=None, signal=None))
            open_[inst] = e["time"]
        elif e["kind"] == "instance_exit" and inst in open_:
            d = e["detail"]
            status = ("ok" if d.get("returncode") == 0 else
                      "stopped" if d.get("stopped_by_us") else "failed")
            out.append(dict(instance=inst, start=open_.pop(inst), end=e["time"], status=status,
                            returncode=d.get("returncode"), signal=d.get("signal")))
    for inst, start in open_.items():
        out.append(dict(instance=inst, start=start, end=end, status="running", returncode=None,
                        signal=None))
    return sorted(out, key=lambda r: (r["start"], r["instance"]))


def _pick_findings(findings: list[Row]) -> list[Row]:
    if len(findings) <= MAX_FINDINGS:
        return findings
    ranked = sorted(findings, key=lambda f: (_SEVERITY_RANK.get(f.get("severity") or "", 0), f["epoch"]))
    return sorted(ranked[-MAX_FINDINGS:], key=lambda f: f["epoch"])


def output_series(output: list[Row], t0: float, t_end: float,
                  max_points: int = MAX_POINTS) -> tuple[float, dict[str, list[list[float]]]]:
    """Each instance's output as ``[[x, lines], ...]`` steps (x: seconds since ``t0``, clamped
    to ``[0, t_end - t0]``), buckets without output filled with 0 and a closing point at the
    last bucket's end; merged into longer buckets when an instance would have more than
    ``max_points``.

    Returns:
        (the bucket length plotted in seconds, instance -> points).
    """
    if not output:
        return 0.0, {}
    step = output[0]["seconds"]
    first = min(o["bucket"] for o in output)
    count = int(round((max(o["bucket"] for o in output) - first) / step)) + 1
    merge = max(1, -(-count // max_points))
    step_out = step * merge
    per: dict[str, dict[int, int]] = {}
    for o in output:
        slot = int(round((o["bucket"] - first) / step)) // merge
        lines = per.setdefault(o["instance"], {})
        lines[slot] = lines.get(slot, 0) + o["lines"]
    span = t_end - t0

    def x(t: float) -> float:
        return round(min(max(t - t0, 0.0), span), 3)

    series = {}
    for inst, lines in per.items():
        lo, hi = min(lines), max(lines)
        pts = [[x(first + k * step_out), lines.get(k, 0)] for k in range(lo, hi + 1)]
        pts.append([x(first + (hi + 1) * step_out), pts[-1][1]])
        series[inst] = pts
    return step_out, series


def job_view(job: str, runs: list[Row], events: list[Row], findings: list[Row],
             decisions: list[Row], output: list[Row]) -> Row:
    """One job's section of the report.

    Returns:
        a JSON-able dict: job, t0 (epoch s) and t0_iso, span (s), rows (timeline rows, ``job``
        first), lifetimes, hangs, findings, restarts, decision_marks, output (bucket seconds
        and one series per instance: ``[[x, lines], ...]``), decisions_by_action,
        failure_classes, root_causes, runs, totals. Every ``x`` / ``start`` / ``end`` is
        seconds since t0.
    """
    times = [r["started"] for r in runs if r.get("started")] + [r["ended"] for r in runs if r.get("ended")]
    times += [e["time"] for e in events] + [f["epoch"] for f in findings] + [d["epoch"] for d in decisions]
    times += [o["bucket"] for o in output] + [o["bucket"] + o["seconds"] for o in output]   # output counts too
    t0 = min(times) if times else 0.0
    t_end = max(times) if times else 0.0

    def x(t: float) -> float:
        return round(t - t0, 3)

    ranks: dict[str, int | None] = {}
    for src in (events, findings, output):
        for r in src:
            if r.get("instance") and ranks.get(r["instance"]) is None:
                ranks[r["instance"]] = r.get("rank")
    instances = sorted(ranks, key=lambda i: _rank_key(i, ranks))

    lives = lifetimes(events, t_end)
    seen = {lv["instance"] for lv in lives}
    for inst in instances:         # shipped logs (watch) have no starts: the span of its output
        if inst in seen:           # (each bucket to its end) and findings, within the job's span
            continue
        mine = [o for o in output if o["instance"] == inst]
        starts = [o["bucket"] for o in mine] + [f["epoch"] for f in findings if f["instance"] == inst]
        ends = [o["bucket"] + o["seconds"] for o in mine] + starts
        if starts:
            lives.append(dict(instance=inst, start=max(min(starts), t0), end=min(max(ends), t_end),
                              status="seen", returncode=None, signal=None))

    hangs = []
    for f in findings:
        if f.get("kind") in _HANG_KINDS:
            fields = f.get("fields") or {}
            silent = fields.get("silent_for", fields.get("culprit_silent_for", 0.0)) or 0.0
            hangs.append(dict(instance=f["instance"], start=x(f["epoch"] - float(silent)),
                              end=x(f["epoch"]), kind=f["kind"], line=f.get("line") or ""))

    restarts = []
    for e in events:
        kind = e["kind"]
        if kind == "job_restart" or (kind == "actuator" and e["detail"].get("status") == "done"
                                     and str(e["detail"].get("action", "")).startswith(("restart", "isolate"))):
            restarts.append(dict(x=x(e["time"]), instance=JOB_ROW if kind == "job_restart" else
                                 (e.get("instance") or JOB_ROW), kind=e["detail"].get("action", kind)))
        elif kind == "instance_restart":
            restarts.append(dict(x=x(e["time"]), instance=e.get("instance") or JOB_ROW,
                                 kind=e["detail"].get("action", "restart_instance")))

    plotted = _pick_findings(findings)
    finding_points = [dict(x=x(f["epoch"]), instance=f.get("instance") or JOB_ROW,
                           severity=f.get("severity") or "info", failure_class=f.get("failure_class") or "",
                           rule_id=f.get("rule_id") or "", line=(f.get("line") or "")[:300])
                      for f in plotted]

    bucket, series = output_series(output, t0, t_end)

    root_causes = []
    for d in decisions:
        rc = d.get("root_cause")
        if rc is None:
            continue
        root_causes.append(dict(time_iso=iso(d["epoch"]), x=x(d["epoch"]), action=d["action"],
                                decision_id=d["decision_id"], clause=d.get("policy_clause", ""),
                                rule_id=rc.get("rule_id", ""), failure_class=rc.get("failure_class", ""),
                                instance=rc.get("instance"), rank=rc.get("rank"), line=rc.get("line", "")))

    return {
        "job": job, "t0": t0, "t0_iso": iso(t0) if times else "", "span": round(t_end - t0, 3),
        "rows": [JOB_ROW] + instances,
        "lifetimes": [dict(lv, start=x(lv["start"]), end=x(lv["end"])) for lv in lives],
        "hangs": hangs, "findings": finding_points, "findings_total": len(findings),
        "restarts": restarts,
        "decision_marks": [dict(x=x(d["epoch"]), action=d["action"], decision_id=d["decision_id"])
                           for d in decisions],
        "output": {"bucket": bucket, "series": [{"instance": i, "points": series[i]}
                                                for i in sorted(series, key=lambda i: _rank_key(i, ranks))]},
        "decisions_by_action": dict(Counter(d["action"] for d in decisions).most_common()),
        "failure_classes": dict(Counter(f.get("failure_class") or "unknown" for f in findings).most_common()),
        "root_causes": root_causes,
        "runs": [dict(r, started_iso=iso(r["started"]) if r.get("started") else "",
                      ended_iso=iso(r["ended"]) if r.get("ended") else "") for r in runs],
        "totals": {"lines": sum(o["lines"] for o in output), "findings": len(findings),
                   "decisions": len(decisions), "restarts": len(restarts), "hangs": len(hangs),
                   "instances": len(instances)},
    }


def build(reader: Any, jobs: list[str] | None = None) -> Row:
    """The whole report's data from a reader (``ftwatch.report.reader.ReportReader``).

    Args:
        jobs: the jobs to show; all of the store's when None.

    Raises:
        LookupError: a job asked for is not in the store.
    """
    known = reader.jobs()
    wanted = known if not jobs else list(jobs)
    missing = [j for j in wanted if j not in known]
    if missing:
        raise LookupError(f"no such job in {reader.source}: {', '.join(missing)} "
                          f"(known: {', '.join(known) or 'none'})")
    return {"source": reader.source,
            "jobs": [job_view(j, reader.runs(j), reader.events(j), reader.findings(j),
                              reader.decisions(j), reader.output(j)) for j in wanted]}


def signature_rows(signatures: Iterable[Any], limit: int = 20) -> list[Row]:
    """The report's "Failure signatures" rows (SPEC T5): the first ``limit`` of ``signatures``
    (``ftwatch.mining.miner.Signature``, ranked by jobs hit), times as ISO strings."""
    return [{"id": s.id, "template": s.template, "jobs": len(s.jobs), "job_names": list(s.jobs)[:10],
             "nodes": len(s.nodes), "count": s.count, "first_seen": iso(s.first_seen),
             "last_seen": iso(s.last_seen), "rule": s.top("rules"), "action": s.top("actions")}
            for s in list(signatures)[:limit]]
