"""``ftwatch report`` from Elasticsearch: what the sink wrote, read back by ``EsReader`` (point in time +
search_after through the official client) from conftest's FakeElasticsearch, must give the report
the SQLite store of the same run gives (ecsread, ftwatch/report/esreader.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from elasticsearch import Elasticsearch

from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.sinks.elasticsearch.sink import ElasticsearchSink
from ftwatch.pipeline.sinks.fanout import FanOut
from ftwatch.pipeline.sinks.outputcounts import OutputCounts
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.report import model
from ftwatch.cli.report import cmd_report, parse_time
from ftwatch.report.esreader import EsReader, EsReadError
from ftwatch.report.reader import SqliteReader
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, RunEnd, RunStart
from ftwatch.testing import write_nccl_crash_worker

T0 = 1_795_219_200.123456          # sub-millisecond: @timestamp cannot carry it, ftwatch.epoch does


def reader(url: str, **kwargs) -> EsReader:
    return EsReader(Elasticsearch(url, max_retries=0, request_timeout=5), url=url, **kwargs)


def comparable(data: dict) -> dict:
    return {**data, "source": None}


def finding(instance: str, rank: int, t: float, kind: str = "error", seq: int = 0,
            cls: FailureClass = FailureClass.RETRYABLE_INFRA, fields: dict | None = None) -> Finding:
    return Finding("nccl.x" if kind == "error" else "hang.job", kind, cls, Action.RESTART_JOB, Severity.ERROR,
                   Origin(instance, rank, "j", "node-1", "stderr", "process"), f"boom {instance} <{seq}>", t,
                   seq=seq, evidence=("ctx 1", "ctx 2"), fields=fields or {})


def write_run(store) -> None:
    """Two attempts with ties in time, a bucket written twice, a run ended but never started, then
    that job's id used again (a second run from attempt 0, its start written twice: ftwatch restarted)."""
    cmd = ["python", "train.py", "--lr", "0.1 0.2"]          # as Recorder.run_started: the run and its event
    store.write([RunStart("j", 0, T0, cmd)])
    store.write([LifecycleEvent(T0, "j", "job_start", detail={"attempt": 0, "command": cmd})])
    for rank in (0, 1):                                   # the same time: written order decides
        store.write([LifecycleEvent(T0 + 1, "j", "instance_start", f"worker-{rank}", rank, {"pid": 10 + rank})])
    store.write([LifecycleEvent(T0 + 5, "j", "instance_exit", "worker-1", 1, {"returncode": None, "signal": 9})])
    store.write([LifecycleEvent(T0 + 5, "j", "instance_exit", "worker-0", 0, {"returncode": -15, "stopped_by_us": True})])
    rc = finding("worker-1", 1, T0 + 4.5, seq=2)
    store.write([FindingBatch([rc, finding("worker-0", 0, T0 + 4.5, seq=1),
                        finding("worker-0", 0, T0 + 9, kind="hang", cls=FailureClass.HANG,
                                fields={"silent_for": 3.0, "labels": {"app.kubernetes.io/name": "t"}})], attempt=0)])
    store.write([Decision(T0 + 6, Action.RESTART_JOB, Target("j"), rc, "D2 clause", 1, 2, (rc,), 0)])
    store.write([RunEnd("j", 0, T0 + 6, "restarted")])
    store.write([LifecycleEvent(T0 + 6.5, "j", "job_restart", detail={"attempt": 0, "action": "restart_job"})])
    store.write([RunStart("j", 1, T0 + 7, ["python", "train.py"])])
    store.write([LifecycleEvent(T0 + 7, "j", "job_start", detail={"attempt": 1, "command": ["python", "train.py"]})])
    store.write([LifecycleEvent(T0 + 7, "j", "instance_start", "worker-0", 0, {})])
    store.write([LifecycleEvent(T0 + 8, "j", "instance_restart", "worker-0", 0, {"action": "restart_instance"})])
    store.write([Decision(T0 + 11, Action.NONE, Target("j"), None, "finished", 1, 2, (), 1)])
    counts = OutputCounts(1.0)
    counts.add("j", "worker-0", 0, T0 + 1.2, 4, 40)
    counts.add("j", "worker-1", 1, T0 + 1.9, 1, 10)
    counts.add("j", "worker-0", 0, T0 + 3.5, 2, 20)
    store.write([OutputBatch(counts.closed())])
    counts.add("j", "worker-0", 0, T0 + 1.4, 3, 30)       # late: the first bucket again
    store.write([OutputBatch(counts.drain())])
    store.write([RunEnd("other", 0, T0 + 12, "failed")])           # never started: started None
    store.write([LifecycleEvent(T0 + 12, "other", "instance_exit", "o-0", 0, {"returncode": 1})])
    for t in (T0 + 13, T0 + 14):             # its id used again, from attempt 0; ftwatch restarted at T0 + 14
        store.write([RunStart("other", 0, t, ["python", "o.py"])])
        store.write([LifecycleEvent(t, "other", "job_start", detail={"attempt": 0, "command": ["python", "o.py"]})])
    store.write([RunEnd("other", 0, T0 + 15, "succeeded")])


@pytest.fixture
def both(fake_es, tmp_path):
    """The same calls into the SQLite store and the Elasticsearch sink (FanOut, as ftwatch run does)."""
    sqlite = SqliteStore(tmp_path / "ftwatch.db")
    sink = ElasticsearchSink(Elasticsearch(fake_es.url, max_retries=0, request_timeout=5), tmp_path / "buf",
                             host="node-1", sleep=lambda s: None, batch_size=7)
    store = FanOut(sqlite, [sink])
    write_run(store)
    store.close()
    assert fake_es.problems == [] and store.errors == 0
    return tmp_path / "ftwatch.db", fake_es


def test_elasticsearch_gives_the_rows_and_the_report_the_sqlite_store_gives(both):
    db, es = both
    with SqliteReader(db) as sq, reader(es.url, page_size=2) as rd:
        assert rd.jobs() == sq.jobs() == ["j", "other"]
        for job in ("j", "other"):
            assert rd.runs(job) == sq.runs(job)
        assert [(r["attempt"], r["started"], r["ended"], r["status"]) for r in sq.runs("other")] == [
            (0, None, T0 + 12, "failed"), (0, T0 + 13, T0 + 15, "succeeded")]
        for job in ("j", "other"):
            assert rd.events(job) == sq.events(job)
            assert list(rd.findings(job)) == list(sq.findings(job))    # (both: read as used)
            assert list(rd.output(job)) == list(sq.output(job))      # (both: read as used)
            assert rd.output_bounds(job) == sq.output_bounds(job)
            strip = [{**d, "findings": [], "root_cause": d["root_cause"] and {
                k: d["root_cause"][k] for k in ("rule_id", "failure_class", "instance", "rank", "node", "line")}}
                for d in sq.decisions(job)]
            assert rd.decisions(job) == strip
        assert comparable(model.build(rd)) == comparable(model.build(sq))
        assert rd.source == f"{es.url} (ftwatch-*)"
        assert [o["lines"] for o in rd.output("j") if o["instance"] == "worker-0"] == [7, 2]   # written twice: summed
        output = [s for s in es.searches if "aggs" in s and "rows" in s["aggs"]]
        assert output and all(s["size"] == 0 for s in output)  # summed by Elasticsearch, paged, no document read
    assert es.pits == {} and es.problems == []            # every point in time closed; the wire format right
    assert all(s["sort"][-1] == "_shard_doc" and s["_source"]["includes"] for s in es.searches if s.get("size"))


def test_large_jobs_are_read_page_by_page(both):
    db, es = both
    with SqliteReader(db) as sq:
        expected = sq.events("j")
    rd = reader(es.url, page_size=3)
    assert rd.events("j") == expected
    pages = -(-(len(expected) + 2) // 3)                   # + the two job_end documents in the stream
    assert rd.searches in (pages, pages + 1)
    after = [s["search_after"] for s in es.searches if "search_after" in s]
    assert len(after) == rd.searches - 1 and after == sorted(after)


def test_a_time_window_keeps_the_same_records_from_both_stores(both):
    db, es = both
    since, until = T0 + 4.5, T0 + 7.0005
    with SqliteReader(db, since, until) as sq, reader(es.url, since=since, until=until) as rd:
        assert rd.jobs() == sq.jobs() == ["j"]
        assert [e["kind"] for e in rd.events("j")] == [e["kind"] for e in sq.events("j")] == [
            "instance_exit", "instance_exit", "job_restart", "job_start", "instance_start"]
        assert list(rd.findings("j")) == list(sq.findings("j")) and len(list(sq.findings("j"))) == 2
        assert [r["attempt"] for r in rd.runs("j")] == [r["attempt"] for r in sq.runs("j")] == [0, 1]
        assert list(rd.output("j")) == list(sq.output("j")) and rd.output_bounds("j") == sq.output_bounds("j")
        assert comparable(model.build(rd)) == comparable(model.build(sq))
    assert es.problems == []


def test_a_data_stream_never_written_reads_as_empty(fake_es):
    with reader(fake_es.url) as rd:
        assert rd.jobs() == [] and rd.decisions("j") == [] and list(rd.output("j")) == []
        assert rd.output_bounds("j") is None
    assert fake_es.problems == []


def test_report_command_writes_the_page_from_elasticsearch(both, tmp_path, capsys):
    db, es = both
    out = tmp_path / "es.html"
    assert cmd_report(["--es-url", es.url, "-o", str(out), "--job", "j"]) == 0
    said = capsys.readouterr().out
    assert f"1 job(s) from {es.url} (ftwatch-*)" in said
    blob = re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                     out.read_text(encoding="utf-8"), re.S).group(1)
    from_es = json.loads(blob)
    with SqliteReader(db) as sq:
        expected = json.loads(json.dumps(model.build(sq, ["j"])))
    assert comparable(from_es) == comparable(expected)
    assert cmd_report(["--es-url", es.url, "-o", str(out), "--job", "nope"]) == 1
    assert "no such job" in capsys.readouterr().err


def page_data(path) -> dict:
    blob = re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                     path.read_text(encoding="utf-8"), re.S).group(1)
    return comparable(json.loads(blob))


def test_the_window_flags_give_the_same_page_from_either_store(both, tmp_path):
    db, es = both
    window = ["--since", str(T0 + 4.5), "--until", "2026-11-21T00:00:07.124"]
    assert cmd_report(["--db", str(db), "-o", str(tmp_path / "a.html"), *window]) == 0
    assert cmd_report(["--es-url", es.url, "-o", str(tmp_path / "b.html"), *window]) == 0
    a = page_data(tmp_path / "a.html")
    assert a == page_data(tmp_path / "b.html")
    assert [j["job"] for j in a["jobs"]] == ["j"] and a["jobs"][0]["totals"]["findings"] == 2
    assert cmd_report(["--db", str(db), "-o", str(tmp_path / "c.html"), "--since", "last week"]) == 2


def test_report_reads_storage_elasticsearch_from_the_config(both, tmp_path, capsys):
    _, es = both
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"storage:\n  elasticsearch:\n    url: {es.url}\n    data_stream_prefix: ftwatch\n")
    out = tmp_path / "c.html"
    assert cmd_report(["--config", str(cfg), "--source", "elasticsearch", "-o", str(out)]) == 0
    assert "2 job(s)" in capsys.readouterr().out and out.stat().st_size > 10_000
    assert cmd_report(["--source", "elasticsearch", "-o", str(out)]) == 2
    assert "no Elasticsearch to read" in capsys.readouterr().err


def test_an_unreachable_cluster_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cmd_report(["--es-url", "http://127.0.0.1:9", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Elasticsearch at http://127.0.0.1:9 is unreachable" in err and not out.exists()
    with pytest.raises(EsReadError, match="unreachable"):
        reader("http://127.0.0.1:9").jobs()


def test_a_server_that_is_not_elasticsearch_is_refused(es_server, tmp_path, capsys):
    other = es_server(product_header=False)
    assert cmd_report(["--es-url", other.url, "-o", str(tmp_path / "r.html")]) == 1
    assert "is not Elasticsearch" in capsys.readouterr().err


def test_credentials_never_reach_the_page(both, tmp_path):
    _, es = both
    with reader(es.url.replace("http://", "http://elastic:s3cret@")) as rd:
        assert "s3cret" not in rd.source and rd.source.startswith("http://127.0.0.1:")


def test_since_and_until_forms():
    now = 1_795_219_200.0
    assert parse_time("6h", now) == now - 6 * 3600 and parse_time("90m", now) == now - 5400
    assert parse_time("1795219000", now) == 1_795_219_000.0
    assert parse_time("2026-11-21T00:00:00", now) == 1_795_219_200.0        # no zone: UTC
    assert parse_time("2026-11-21T01:00:00+01:00", now) == 1_795_219_200.0
    with pytest.raises(ValueError, match="duration like 6h"):
        parse_time("yesterday", now)


@pytest.mark.slow
def test_a_real_run_gives_the_same_report_from_elasticsearch_as_from_sqlite(fake_es, tmp_path):
    """``ftwatch run`` with storage.elasticsearch pointing at the fake: NCCL error, restart, success."""
    write_nccl_crash_worker(tmp_path / "worker.py", steps=5)
    (tmp_path / "ftwatch.yaml").write_text(
        "storage:\n  metrics:\n    output_bucket: 0.5\n"
        f"  elasticsearch:\n    url: {fake_es.url}\n    flush_interval: 0.2\n")
    run = subprocess.run([sys.executable, "-m", "ftwatch", "run", "--config", "ftwatch.yaml", "--job-id", "es-e2e",
                          "--nproc-per-node", "2", "--state-dir", "state", "--grace-period", "1",
                          "--enable-job-restart=True", "--max-num-of-job-restart=2", "--", sys.executable,
                          "worker.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert fake_es.problems == []
    with SqliteReader(tmp_path / "state" / "ftwatch.db") as sq, reader(fake_es.url, page_size=50) as rd:
        from_sqlite, from_es = model.build(sq), model.build(rd)
        assert [r["status"] for r in rd.runs("es-e2e")] == ["restarted", "succeeded"]
        assert list(rd.output("es-e2e")) == list(sq.output("es-e2e"))
    (job,) = from_es["jobs"]
    assert job["decisions_by_action"] == {"restart_job": 1, "none": 1}
    assert {s["instance"] for s in job["output"]["series"]} == {"worker-0", "worker-1"}
    assert job["totals"]["lines"] >= 20 and job["root_causes"]
    assert comparable(from_es) == comparable(from_sqlite)
