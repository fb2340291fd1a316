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

import heapq
import math
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


class _Findings:
    """What the report reads of a job's findings, folded in one pass as they come (a long job's
    store holds hundreds of thousands; holding them all took ~2.5 KB each, issue 16): their
    count, first and last time, each instance's first rank and first and last time, the hangs,
    the failure classes counted, and the :data:`MAX_FINDINGS` plotted: all of them when no more,
    else the most severe, then the latest (a heap keyed by severity, time and arrival, so the
    pick is the one a stable sort of them all would make)."""

    def __init__(self, findings: Iterable[Row], ranks: dict[str, int | None]):
        self.count = 0
        self.first = self.last = None
        self.spans: dict[str, list[float]] = {}            # instance -> [first, last] epoch
        self.hangs: list[Row] = []
        self.classes: Counter[str] = Counter()
        heap: list[tuple[int, float, int, Row]] = []
        for n, f in enumerate(findings):
            epoch = f["epoch"]
            self.count += 1
            self.first = epoch if self.first is None else min(self.first, epoch)
            self.last = epoch if self.last is None else max(self.last, epoch)
            inst = f.get("instance")
            if inst:
                if ranks.get(inst) is None:
                    ranks[inst] = f.get("rank")
                span = self.spans.get(inst)
                if span is None:
                    self.spans[inst] = [epoch, epoch]
                else:
                    span[0], span[1] = min(span[0], epoch), max(span[1], epoch)
            if f.get("kind") in _HANG_KINDS:
                self.hangs.append(f)
            self.classes[f.get("failure_class") or "unknown"] += 1
            point = dict(epoch=epoch, instance=inst or JOB_ROW, severity=f.get("severity") or "info",
                         failure_class=f.get("failure_class") or "", rule_id=f.get("rule_id") or "",
                         line=(f.get("line") or "")[:300])
            item = (_SEVERITY_RANK.get(f.get("severity") or "", 0), epoch, n, point)
            if len(heap) < MAX_FINDINGS:
                heapq.heappush(heap, item)
            elif item[:3] > heap[0][:3]:
                heapq.heapreplace(heap, item)
        if self.count <= MAX_FINDINGS:                      # every one, in the store's order
            self.plotted = [item[3] for item in sorted(heap, key=lambda item: item[2])]
        else:                                               # by time, then severity, then arrival
            self.plotted = [item[3] for item in sorted(heap, key=lambda item: (item[1], item[0], item[2]))]


class _Output:
    """A job's output counts folded in one pass as they come (``watch`` stores a row per instance
    and bucket: 1,000 pods printing all day, 17 M rows): each instance's first rank, first bucket
    and last bucket's end, the lines in all, and each instance's lines per plotted bucket.

    Rows may differ in length: the store merges a job's old rows into coarser buckets
    (``ftwatch.pipeline.sinks.downsample``). The plot steps by the finest length (merged into
    longer plotted buckets beyond ``max_points``); a row longer than a plotted bucket spreads its
    lines over those it covers, in proportion (so the plot shows its mean rate there).

    Args:
        output: the rows by instance, then bucket (``ReportReader.output``).
        ranks: instance -> rank, filled in where still None (the caller's, shared).
        bounds: the first and the last bucket start (epoch s) of ``output`` and its shortest
            bucket (s), when the reader knows them beforehand (``output_bounds``: then ``output``
            may be a generator); None: ``output`` is read into a list to find them.
        max_points: points per instance: buckets merge into longer ones beyond.
    """

    def __init__(self, output: Iterable[Row], ranks: dict[str, int | None],
                 bounds: tuple[float, float, float] | None = None, max_points: int = MAX_POINTS):
        if bounds is None:
            output = list(output)
            bounds = ((min(o["bucket"] for o in output), max(o["bucket"] for o in output),
                       min(o["seconds"] for o in output)) if output else (0.0, 0.0, 1.0))
        self.first, last, self.step = bounds                # the shortest bucket plotted as is
        self.merge = max(1, -(-(int(round((last - self.first) / self.step)) + 1) // max_points))
        self.lines = 0
        self.spans: dict[str, list[float]] = {}            # instance -> [first bucket, last bucket's end]
        self.per: dict[str, dict[int, float]] = {}         # instance -> plotted bucket -> lines
        for o in output:
            inst, bucket, seconds = o["instance"], o["bucket"], o["seconds"]
            if inst and ranks.get(inst) is None:
                ranks[inst] = o.get("rank")
            span = self.spans.get(inst)
            if span is None:
                self.spans[inst] = [bucket, bucket + seconds]
            else:
                span[0], span[1] = min(span[0], bucket), max(span[1], bucket + seconds)
            self.lines += o["lines"]
            lines = self.per.setdefault(inst, {})
            if seconds <= self.step:
                slot = int(round((bucket - self.first) / self.step)) // self.merge
                lines[slot] = lines.get(slot, 0) + o["lines"]
            else:
                self._spread(lines, bucket, seconds, o["lines"])

    def _spread(self, lines: dict[int, float], bucket: float, seconds: float, count: int) -> None:
        """Add ``count`` lines of the row ``[bucket, bucket + seconds)`` to the plotted buckets
        it overlaps, each its share of the row's length."""
        width = self.step * self.merge
        a, z = (bucket - self.first) / width, (bucket + seconds - self.first) / width
        k = math.floor(a + 1e-9)
        while k < z - 1e-9:
            share = (min(z, k + 1) - max(a, k)) / (z - a)
            lines[k] = lines.get(k, 0) + (count if share > 1 - 1e-9 else count * share)
            k += 1

    def series(self, t0: float, t_end: float) -> tuple[float, dict[str, list[list[float]]]]:
        """:func:`output_series`'s answer for what was folded."""
        if not self.per:
            return 0.0, {}
        step_out = self.step * self.merge
        span = t_end - t0

        def x(t: float) -> float:
            return round(min(max(t - t0, 0.0), span), 3)

        series = {}
        for inst, lines in self.per.items():
            lo, hi = min(lines), max(lines)
            pts = [[x(self.first + k * step_out), _count(lines.get(k, 0))] for k in range(lo, hi + 1)]
            pts.append([x(self.first + (hi + 1) * step_out), pts[-1][1]])
            series[inst] = pts
        return step_out, series


def _count(lines: float) -> float:
    """A plotted bucket's lines: whole when no merged row was spread into it, else to 0.01."""
    return lines if isinstance(lines, int) else round(lines, 2)


def output_series(output: list[Row], t0: float, t_end: float,
                  max_points: int = MAX_POINTS) -> tuple[float, dict[str, list[list[float]]]]:
    """Each instance's output as ``[[x, lines], ...]`` steps (x: seconds since ``t0``, clamped
    to ``[0, t_end - t0]``), buckets without output filled with 0 and a closing point at the
    last bucket's end; merged into longer buckets when an instance would have more than
    ``max_points``.

    Returns:
        (the bucket length plotted in seconds, instance -> points).
    """
    return _Output(output, {}, max_points=max_points).series(t0, t_end)


def job_view(job: str, runs: list[Row], events: list[Row], findings: Iterable[Row],
             decisions: list[Row], output: Iterable[Row], output_bounds: tuple[float, float, float] | None = None) -> Row:
    """One job's section of the report.

    Returns:
        a JSON-able dict: job, t0 (epoch s) and t0_iso, span (s), rows (timeline rows, ``job``
        first), lifetimes, hangs, findings, restarts, decision_marks, output (bucket seconds
        and one series per instance: ``[[x, lines], ...]``), decisions_by_action,
        failure_classes, root_causes, runs, totals. Every ``x`` / ``start`` / ``end`` is
        seconds since t0.
    """
    ranks: dict[str, int | None] = {}
    for r in events:
        if r.get("instance") and ranks.get(r["instance"]) is None:
            ranks[r["instance"]] = r.get("rank")
    folded = _Findings(findings, ranks)                    # (read once: it may be a generator)
    counts = _Output(output, ranks, output_bounds)         # (so may the output counts)
    spans = counts.spans
    instances = sorted(ranks, key=lambda i: _rank_key(i, ranks))

    times = [r["started"] for r in runs if r.get("started")] + [r["ended"] for r in runs if r.get("ended")]
    times += [e["time"] for e in events] + [d["epoch"] for d in decisions]
    times += [t for t in (folded.first, folded.last) if t is not None]
    times += [t for span in spans.values() for t in span]  # output counts too
    t0 = min(times) if times else 0.0
    t_end = max(times) if times else 0.0

    def x(t: float) -> float:
        return round(t - t0, 3)

    lives = lifetimes(events, t_end)
    seen = {lv["instance"] for lv in lives}
    for inst in instances:         # shipped logs (watch) have no starts: the span of its output
        if inst in seen:           # (each bucket to its end) and findings, within the job's span
            continue
        own = [span for span in (spans.get(inst), folded.spans.get(inst)) if span is not None]
        if own:
            lives.append(dict(instance=inst, start=max(min(s[0] for s in own), t0),
                              end=min(max(s[1] for s in own), t_end), status="seen", returncode=None, signal=None))

    hangs = []
    for f in folded.hangs:
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

    finding_points = [dict(x=x(p.pop("epoch")), **p) for p in folded.plotted]

    bucket, series = counts.series(t0, t_end)

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
        "hangs": hangs, "findings": finding_points, "findings_total": folded.count,
        "restarts": restarts,
        "decision_marks": [dict(x=x(d["epoch"]), action=d["action"], decision_id=d["decision_id"])
                           for d in decisions],
        "output": {"bucket": bucket, "series": [{"instance": i, "points": series[i]}
                                                for i in sorted(series, key=lambda i: _rank_key(i, ranks))]},
        "decisions_by_action": dict(Counter(d["action"] for d in decisions).most_common()),
        "failure_classes": dict(folded.classes.most_common()),
        "root_causes": root_causes,
        "runs": [dict(r, started_iso=iso(r["started"]) if r.get("started") else "",
                      ended_iso=iso(r["ended"]) if r.get("ended") else "") for r in runs],
        "totals": {"lines": counts.lines, "findings": folded.count,
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
            "jobs": [_job_view(reader, j) for j in wanted]}


def _job_view(reader: Any, job: str) -> Row:
    """:func:`job_view` of one job from ``reader``; its output counts as a generator where the
    reader knows their bounds beforehand (``output_bounds``)."""
    bounds = getattr(reader, "output_bounds", None)
    known = bounds(job) if bounds is not None else None
    output = reader.output(job) if bounds is not None else list(reader.output(job))
    if bounds is not None and known is None:
        output = []                                 # no rows in the window
    return job_view(job, reader.runs(job), reader.events(job), reader.findings(job), reader.decisions(job),
                    output, known)


def signature_rows(signatures: Iterable[Any], limit: int = 20) -> list[Row]:
    """The report's "Failure signatures" rows (SPEC T5): the first ``limit`` of ``signatures``
    (``ftwatch.mining.miner.Signature``, ranked by jobs hit), times as ISO strings."""
    return [{"id": s.id, "template": s.template, "jobs": len(s.jobs), "job_names": list(s.jobs)[:10],
             "nodes": len(s.nodes), "count": s.count, "first_seen": iso(s.first_seen),
             "last_seen": iso(s.last_seen), "rule": s.top("rules"), "action": s.top("actions")}
            for s in list(signatures)[:limit]]
