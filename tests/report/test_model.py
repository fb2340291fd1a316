"""The report's data (ftwatch.report.model) and its HTML (render), from a real SQLite store."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.sinks.outputcounts import OutputCounts
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.report import model
from ftwatch.report.reader import SqliteReader
from ftwatch.report.render import render_html, write_report
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, RunEnd, RunStart

T0 = 1_700_000_000.0


def finding(instance, rank, t, kind="error", cls=FailureClass.RETRYABLE_INFRA, fields=None, rule="nccl.x"):
    return Finding(rule_id=rule, kind=kind, failure_class=cls, action=Action.RESTART_JOB,
                   severity=Severity.ERROR, origin=Origin(instance, rank, "j"), line=f"boom <{rule}>",
                   time=t, seq=0, fields=fields or {})


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteStore(tmp_path / "ftwatch.db")
    s.write([RunStart("j", 0, T0, ["python", "train.py"])])
    for rank in (0, 1):
        s.write([LifecycleEvent(T0 + 1, "j", "instance_start", f"worker-{rank}", rank, {"pid": 10 + rank})])
    s.write([LifecycleEvent(T0 + 5, "j", "instance_exit", "worker-1", 1, {"returncode": None, "signal": 9})])
    s.write([LifecycleEvent(T0 + 6, "j", "instance_exit", "worker-0", 0, {"returncode": -15, "stopped_by_us": True})])
    rc = finding("worker-1", 1, T0 + 5)
    hang = finding("worker-0", 0, T0 + 9, kind="hang", cls=FailureClass.HANG, fields={"silent_for": 3.0},
                   rule="hang.job")
    s.write([FindingBatch([rc, hang])])
    s.write([Decision(T0 + 6, Action.RESTART_JOB, Target("j"), rc, "D2 clause", 1, 2, (rc,), 0)])
    s.write([RunEnd("j", 0, T0 + 6, "restarted")])
    s.write([LifecycleEvent(T0 + 6.5, "j", "job_restart", detail={"attempt": 0, "action": "restart_job"})])
    s.write([RunStart("j", 1, T0 + 7, ["python", "train.py"])])
    s.write([LifecycleEvent(T0 + 7, "j", "instance_start", "worker-0", 0, {})])
    s.write([LifecycleEvent(T0 + 8, "j", "instance_restart", "worker-0", 0, {"action": "restart_instance"})])
    counts = OutputCounts(1.0)
    counts.add("j", "worker-0", 0, T0 + 1.2, 4, 40)
    counts.add("j", "worker-0", 0, T0 + 3.5, 2, 20)     # T0+2 silent: a zero bucket
    counts.add("j", "worker-1", 1, T0 + 1.9, 1, 10)
    s.write([OutputBatch(counts.drain())])
    yield s
    s.close()


def test_job_view_lines_up_lifetimes_hangs_restarts_and_output(store):
    with SqliteReader(store.path) as reader:
        data = model.build(reader)
    (job,) = data["jobs"]
    assert job["t0"] == T0 and job["rows"] == ["job", "worker-0", "worker-1"]
    lives = {(lv["instance"], lv["start"], lv["end"], lv["status"]) for lv in job["lifetimes"]}
    assert lives == {("worker-0", 1.0, 6.0, "stopped"), ("worker-1", 1.0, 5.0, "failed"),
                     ("worker-0", 7.0, 9.0, "running")}          # no exit: open until the last record
    assert job["hangs"] == [{"instance": "worker-0", "start": 6.0, "end": 9.0, "kind": "hang",
                             "line": "boom <hang.job>"}]
    assert [(r["x"], r["instance"]) for r in job["restarts"]] == [(6.5, "job"), (8.0, "worker-0")]
    assert job["output"]["bucket"] == 1.0
    series = {s["instance"]: s["points"] for s in job["output"]["series"]}
    assert series["worker-0"] == [[1.0, 4], [2.0, 0], [3.0, 2], [4.0, 2]]
    assert series["worker-1"] == [[1.0, 1], [2.0, 1]]
    assert job["decisions_by_action"] == {"restart_job": 1}
    assert job["failure_classes"] == {"retryable_infra": 1, "hang": 1}
    (rc,) = job["root_causes"]
    assert (rc["rule_id"], rc["instance"], rc["rank"], rc["action"]) == ("nccl.x", "worker-1", 1, "restart_job")
    assert job["totals"]["lines"] == 7 and job["totals"]["restarts"] == 2


def test_long_output_is_merged_into_fewer_points():
    rows = [dict(instance="w", rank=0, bucket=T0 + k, seconds=1.0, lines=1, bytes=1) for k in range(100)]
    step, series = model.output_series(rows, T0, T0 + 100, max_points=10)
    assert step == 10.0
    assert [p[1] for p in series["w"]] == [10] * 10 + [10]
    assert series["w"][-1][0] == 100.0


def test_merged_old_output_spreads_over_the_plotted_buckets_it_covers():
    """The store merges old rows into longer buckets (``sinks.downsample``): the plot keeps the
    shortest bucket, and a longer row's lines spread evenly over the plotted buckets it covers."""
    rows = ([dict(instance="w", rank=0, bucket=T0 + 30 * k, seconds=30.0, lines=60, bytes=1) for k in range(2)]
            + [dict(instance="w", rank=0, bucket=T0 + 60 + k, seconds=1.0, lines=k, bytes=1) for k in range(40)])
    step, series = model.output_series(rows, T0, T0 + 100, max_points=20)
    assert step == 5.0                                    # 100 one-second buckets, at most 20 points
    assert [p[1] for p in series["w"][:12]] == [10] * 12  # 60 lines over 30 s: 10 per 5 s
    assert [p[1] for p in series["w"][12:-1]] == [sum(range(k, k + 5)) for k in range(0, 40, 5)]
    uneven = [dict(rows[0], seconds=7.0, lines=7), dict(rows[0], bucket=T0 + 8, seconds=2.0, lines=3)]
    step, series = model.output_series(uneven, T0, T0 + 10, max_points=20)
    assert step == 2.0 and [p[1] for p in series["w"]] == [2, 2, 2, 1, 3, 3]   # shares 2/7, 2/7, 2/7, 1/7
    view = model.job_view("j", [], [], [], [], rows)
    assert view["totals"]["lines"] == 120 + sum(range(40))


def test_an_unknown_job_is_an_error_naming_the_known_ones(store):
    with SqliteReader(store.path) as reader, pytest.raises(LookupError, match="nope.*known: j"):
        model.build(reader, ["nope"])


def test_a_missing_store_is_not_created(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        SqliteReader(tmp_path / "none.db")
    assert not (tmp_path / "none.db").exists()


def test_the_page_is_self_contained_and_escapes_log_text(store, tmp_path: Path):
    out = tmp_path / "sub" / "report.html"
    with SqliteReader(store.path) as reader:
        write_report(reader, out)
    html = out.read_text(encoding="utf-8")
    assert "Chart.js v4.6.1" in html                           # inlined, not linked
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "sourceMappingURL" not in html                      # no request for a .map file
    assert "<td class=\"line\">boom &lt;nccl.x&gt;</td>" in html  # autoescaped in the table
    blob = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S).group(1)
    assert "<hang.job>" not in blob                             # tojson escapes < in the script
    assert json.loads(blob)["jobs"][0]["job"] == "j"
    assert out.stat().st_mode & 0o044 == 0o044


def test_an_empty_store_renders_a_page_saying_so():
    html = render_html({"source": "x.db", "jobs": []})
    assert "holds no jobs yet" in html


def test_output_counts_close_buckets_when_a_later_one_starts():
    c = OutputCounts(5.0)
    assert c.add("j", "a", 0, T0 + 1, 1, 3) is False
    assert c.add("j", "b", 1, T0 + 2, 2, 4) is False
    assert c.closed() == []
    assert c.add("j", "a", 0, T0 + 6, 1, 1) is True
    assert sorted(c.closed()) == [("j", "a", 0, T0, 5.0, 1, 3), ("j", "b", 1, T0, 5.0, 2, 4)]
    assert c.drain() == [("j", "a", 0, T0 + 5, 5.0, 1, 1)]
    with pytest.raises(ValueError):
        OutputCounts(0)


def test_a_watched_job_without_starts_gets_an_activity_bar_per_instance_from_its_output():
    """Shipped logs: no instance_start/exit. Each bucket lasts its seconds; bars stay in the span."""
    output = [dict(instance="w0", rank=0, bucket=T0, seconds=5.0, lines=3, bytes=30),
              dict(instance="w1", rank=1, bucket=T0 + 5, seconds=5.0, lines=1, bytes=10)]
    late = dict(rule_id="nccl.x", kind="error", failure_class="retryable_infra", severity="error",
                instance="w0", rank=0, epoch=T0 + 7, line="boom", fields={})
    job = model.job_view("j", [], [], [late], [], output)
    assert job["t0"] == T0                          # the first output bucket, not the first finding
    lives = {lv["instance"]: (lv["start"], lv["end"], lv["status"]) for lv in job["lifetimes"]}
    assert lives == {"w0": (0.0, 7.0, "seen"), "w1": (5.0, 10.0, "seen")}
    assert all(lv["end"] > lv["start"] and lv["end"] <= job["span"] for lv in job["lifetimes"])


def test_past_the_plotted_cap_the_most_severe_then_the_latest_are_plotted_from_one_pass(monkeypatch):
    """More findings than ``MAX_FINDINGS``: the plotted ones are the most severe, then the latest
    (ties: the later in the store), in time order; the counts, classes and spans still cover every
    finding; the findings are read once, as a generator (a long job's store: issue 16)."""
    monkeypatch.setattr(model, "MAX_FINDINGS", 4)
    severities = ["info", "error", "warning", "error", "info", "critical", "warning", "error", "info"]
    rows = [dict(rule_id=f"r{i}", kind="error", failure_class="info" if s == "info" else "retryable_infra",
                 severity=s, instance=f"w{i % 2}", rank=i % 2, epoch=T0 + (i // 2), line=f"line {i}", fields={})
            for i, s in enumerate(severities)]
    read = []

    def once():
        for r in rows:
            read.append(r["rule_id"])
            yield r
    job = model.job_view("j", [], [], once(), [], [])
    assert read == [r["rule_id"] for r in rows]
    # critical r5; the errors r1, r3, r7 (same severity: all three fit)
    assert [f["rule_id"] for f in job["findings"]] == ["r1", "r3", "r5", "r7"]
    assert [f["x"] for f in job["findings"]] == [0.0, 1.0, 2.0, 3.0]
    assert job["findings_total"] == job["totals"]["findings"] == 9
    assert job["failure_classes"] == {"info": 3, "retryable_infra": 6}
    lives = {lv["instance"]: (lv["start"], lv["end"]) for lv in job["lifetimes"]}
    assert lives == {"w0": (0.0, 4.0), "w1": (0.0, 3.0)}


def test_a_store_of_many_findings_is_read_a_page_at_a_time(tmp_path: Path):
    """``SqliteStore.iter_findings`` pages through the rows in time order, the same rows
    ``findings_for`` returns; the report reader yields them as it goes."""
    s = SqliteStore(tmp_path / "ftwatch.db")
    s.write([FindingBatch([finding(f"worker-{k % 3}", k % 3, T0 + (k * 7919) % 2500) for k in range(2500)])])
    pages = list(s.iter_findings("j", page=1000))
    assert pages == s.findings_for("j") and len(pages) == 2500
    assert [f["epoch"] for f in pages] == sorted(f["epoch"] for f in pages)
    s.close()
    with SqliteReader(tmp_path / "ftwatch.db", since=T0 + 100, until=T0 + 200) as reader:
        got = reader.findings("j")
        assert not isinstance(got, list)
        assert [f["epoch"] for f in got] == [T0 + t for t in range(100, 200)]


def test_output_counts_are_folded_as_the_store_pages_them_with_their_bounds_asked_first(tmp_path: Path):
    """The SQLite reader hands the output counts over as a generator, their first and last bucket
    asked of the store beforehand (``output_bounds``, in the window too); the job's view is the one
    a list of the same rows gives, merged buckets included."""
    s = SqliteStore(tmp_path / "ftwatch.db")
    counts = OutputCounts(1.0)
    for k in range(9000):                                  # 3 instances, 3,000 buckets each: past MAX_POINTS
        counts.add("j", f"w{k % 3}", k % 3, T0 + k // 3 + (k % 3) * 0.1, 2, 20)
    s.write([OutputBatch(counts.drain())])
    s.close()
    for since, until in ((None, None), (T0 + 100, T0 + 1500)):
        with SqliteReader(tmp_path / "ftwatch.db", since=since, until=until) as reader:
            rows = reader.output("j")
            assert not isinstance(rows, list)
            listed = list(reader.output("j"))
            assert reader.output_bounds("j") == (listed[0]["bucket"] if since is None else since,
                                                 max(r["bucket"] for r in listed), 1.0)
            streamed = model.build(reader)["jobs"][0]
        assert streamed == model.job_view("j", [], [], [], [], listed)
        assert streamed["totals"]["lines"] == 2 * len(listed)
        assert streamed["output"]["bucket"] == (2.0 if since is None else 1.0)  # 1,400 buckets fit at 1 s
    with SqliteReader(tmp_path / "ftwatch.db", since=T0 + 9000) as reader:
        assert reader.output_bounds("j") is None
