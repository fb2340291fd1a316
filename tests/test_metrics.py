"""ftwatch.telemetry: counted on the recorder's real paths, served over real HTTP, spool sizes read at scrape."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ftwatch.clock import FakeClock
from ftwatch.config.model import Config
from ftwatch.config.metrics import MetricsConfig, parse_listen
from ftwatch.errors import ConfigError
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
from ftwatch.telemetry import Metrics, start_metrics
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.watch import Watcher
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_700_000_000.0


def samples(metrics: Metrics) -> dict[tuple, float]:
    """name + sorted labels -> value, read back through the exposition format."""
    from prometheus_client import generate_latest
    out = {}
    for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in fam.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def finding(sev=Severity.ERROR, cls=FailureClass.OOM) -> Finding:
    return Finding(rule_id="r", kind="error", failure_class=cls, action=Action.RESTART_JOB, severity=sev,
                   origin=Origin("worker-0", 0, "j"), line="x", time=T0, seq=0)


def test_the_recorder_counts_lines_findings_decisions_and_restarts(tmp_path: Path):
    m = Metrics()
    store = SqliteStore(tmp_path / "db")
    rec = Recorder(store, out=io.StringIO(), metrics=m, output_bucket=1.0)
    origin = Origin("worker-0", 0, "j")
    rec.output(origin, 3, 30, T0)
    rec.output(origin, 2, 20, T0 + 0.5)
    assert store.output() == []                      # the bucket is still open
    rec.output(origin, 1, 10, T0 + 1.2)              # a later bucket closes the first
    assert [(r["bucket"], r["lines"]) for r in store.output()] == [(T0, 5)]
    rec.flush_output()
    assert [(r["bucket"], r["lines"], r["bytes"]) for r in store.output()] == [(T0, 5, 50), (T0 + 1, 1, 10)]
    rec.findings([finding(), finding(), finding(Severity.WARNING, FailureClass.INFO)])
    rec.decision(Decision(T0, Action.RESTART_JOB, Target("j"), finding(), "c", 1, 2, (), 0))
    rec.event(T0, "j", "job_restart", attempt=0)
    rec.event(T0, "j", "instance_restart", "worker-0", 0)
    rec.event(T0, "j", "actuator", action="restart_job", status="done")
    rec.event(T0, "j", "actuator", action="restart_job", status="skipped")   # observe-only: none
    rec.event(T0, "j", "instance_exit", "worker-0", 0)
    s = samples(m)
    assert s[("ftwatch_lines_total", ("job_id", "j"))] == 6
    assert s[("ftwatch_bytes_total", ("job_id", "j"))] == 60
    assert s[("ftwatch_findings_total", ("failure_class", "oom"), ("job_id", "j"), ("severity", "error"))] == 2
    assert s[("ftwatch_findings_total", ("failure_class", "info"), ("job_id", "j"), ("severity", "warning"))] == 1
    assert s[("ftwatch_decisions_total", ("action", "restart_job"), ("job_id", "j"))] == 1
    assert s[("ftwatch_restarts_total", ("job_id", "j"), ("kind", "job"))] == 1
    assert s[("ftwatch_restarts_total", ("job_id", "j"), ("kind", "instance"))] == 1
    assert s[("ftwatch_restarts_total", ("job_id", "j"), ("kind", "restart_job"))] == 1
    store.close()


def test_the_watcher_counts_shipped_lines_and_their_lag(tmp_path: Path):
    m = Metrics()
    clock = FakeClock(T0 + 100)
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}})
    rec = Recorder(None, out=io.StringIO(), metrics=m)

    def resolve(batch):
        return [(Origin("pod-a", 0, "j", source="http"), s.line, s.time) for s in batch]

    w = Watcher(config, Engine(load_rules([], builtin=False)), rec, resolve, clock=clock)
    w.ingest([Shipped(T0 + 90, b"step 1"), Shipped(T0 + 92.5, b"step 2")])
    s = samples(m)
    assert s[("ftwatch_lines_total", ("job_id", "j"))] == 2
    assert s[("ftwatch_ingest_lag_seconds_count",)] == 1
    assert s[("ftwatch_ingest_lag_last_seconds",)] == pytest.approx(7.5)   # the newest line's lag
    assert rec.output_counts.drain()[0][5] == 2


def test_the_listeners_connection_events_are_counted_per_source_and_event():
    """Issue 17: what a source's ConnectionGate reports is exposed as one counter."""
    from ftwatch.pipeline.sources.connlimit import ConnectionGate
    m = Metrics()
    gate = ConnectionGate("fluent-bit", max_connections=1, idle_timeout=1.0, count=m.count_connection)
    assert gate.admit() and not gate.admit()
    gate.idle_closed()
    gate.release()
    assert gate.admit()
    s = samples(m)
    key = "ftwatch_source_connections_total"
    assert s[(key, ("event", "accepted"), ("source", "fluent-bit"))] == 2
    assert s[(key, ("event", "refused"), ("source", "fluent-bit"))] == 1
    assert s[(key, ("event", "idle_closed"), ("source", "fluent-bit"))] == 1
    assert gate.stats == {"accepted": 2, "refused": 1, "idle_closed": 1, "open": 1}


def test_spool_sizes_are_read_at_each_scrape(tmp_path: Path):
    m = Metrics()
    spool = tmp_path / "spool"
    m.watch_spool("alerts", spool)
    es = tmp_path / "es-buffer"
    m.watch_spool("es", es, "jsonl")
    assert samples(m)[("ftwatch_spool_items", ("spool", "alerts"), ("state", "pending"))] == 0
    (spool / "dead").mkdir(parents=True)
    (spool / "a.json").write_text("{}")
    (spool / "b.json").write_text("{}")
    (spool / "dead" / "c.json").write_text("{1}")
    es.mkdir()
    (es / "current.jsonl").write_text('{"a": 1}\n')
    (es / "seg-000000001.jsonl").write_text('{"b": 1}\n{"c": 1}\n')
    (es / "dead-letter.jsonl").write_text('{"a": 1}\n{"b": 2}\n')
    s = samples(m)
    assert s[("ftwatch_spool_items", ("spool", "alerts"), ("state", "pending"))] == 2
    assert s[("ftwatch_spool_bytes", ("spool", "alerts"), ("state", "pending"))] == 4
    assert s[("ftwatch_spool_items", ("spool", "alerts"), ("state", "dead"))] == 1
    assert s[("ftwatch_spool_items", ("spool", "es"), ("state", "dead"))] == 2
    assert s[("ftwatch_spool_items", ("spool", "es"), ("state", "pending"))] == 3
    with pytest.raises(ValueError):
        m.watch_spool("x", tmp_path, "tar")


def test_served_over_http_and_closed(tmp_path: Path):
    said = []
    storage = Config.model_validate({"storage": {"metrics": {"listen": "127.0.0.1:0"},
                                                 "elasticsearch": {"url": "http://127.0.0.1:9"}}}).storage
    m = start_metrics(storage, None, tmp_path, said.append)
    try:
        url = said[0].split(" on ")[1]
        m.count_output("j", 4, 8)
        m.watch_queue(lambda: 3)
        body = httpx.get(url, timeout=5).text
        assert 'ftwatch_lines_total{job_id="j"} 4.0' in body
        assert "ftwatch_queue_batches 3.0" in body
        assert 'ftwatch_spool_items{spool="alerts",state="pending"} 0.0' in body
        assert 'ftwatch_spool_items{spool="elasticsearch",state="dead"} 0.0' in body
    finally:
        m.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=2)


def test_off_unless_asked_and_a_busy_port_is_a_config_error(tmp_path: Path):
    assert start_metrics(Config().storage, None, tmp_path) is None
    first = start_metrics(Config().storage, 0, tmp_path, lambda s: None)     # --metrics-port 0
    try:
        port = first._server.server_port
        with pytest.raises(ConfigError, match="cannot listen"):
            start_metrics(Config.model_validate({"storage": {"metrics": {"listen": f"127.0.0.1:{port}"}}}).storage,
                          None, tmp_path, lambda s: None)
    finally:
        first.close()


def test_listen_addresses_are_checked():
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9464", "host:", "host:70000", ":80"):
        with pytest.raises(ValueError):
            parse_listen(bad)
    with pytest.raises(Exception, match="host:port"):
        Config.model_validate({"storage": {"metrics": {"listen": "localhost"}}})
    assert json.loads(MetricsConfig().model_dump_json())["output_bucket"] == 5.0


@pytest.mark.slow
def test_ftwatch_run_serves_its_counts_while_the_job_runs(tmp_path: Path):
    """Without Prometheus: the real command line, scraped with a plain HTTP client."""
    import os
    import subprocess
    import sys
    import time
    (tmp_path / "gate").touch()
    (tmp_path / "w.py").write_text(
        "import os, sys, time\nfor i in range(4):\n    print(f'step {i}', flush=True)\n"
        "while os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n")
    proc = subprocess.Popen([sys.executable, "-m", "ftwatch", "run", "--job-id", "m", "--nproc-per-node", "2",
                             "--state-dir", "state", "--metrics-port", "0", "--", sys.executable, "w.py",
                             str(tmp_path / "gate")], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = next(line.split(" on ")[1].strip() for line in proc.stdout if "metrics on http" in line)
        deadline, body = time.monotonic() + 30, ""
        while 'ftwatch_lines_total{job_id="m"} 8.0' not in body and time.monotonic() < deadline:
            body = httpx.get(url, timeout=5).text
            time.sleep(0.1)
        assert 'ftwatch_lines_total{job_id="m"} 8.0' in body
        (tmp_path / "gate").unlink()
        assert proc.wait(30) == 0
        body = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "SUCCEEDED" in body
    with SqliteStore(tmp_path / "state" / "ftwatch.db") as store:   # the output counts reached the store
        assert sum(r["lines"] for r in store.output("m")) == 8


def test_the_watcher_observes_the_lag_once_per_batch_at_its_most_lagging_origin(tmp_path: Path):
    m = Metrics()
    clock = FakeClock(T0 + 100)
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}})
    rec = Recorder(None, out=io.StringIO(), metrics=m)

    def resolve(batch):
        return [(Origin(s.meta["pod"], 0, "j", source="http"), s.line, s.time) for s in batch]

    w = Watcher(config, Engine(load_rules([], builtin=False)), rec, resolve, clock=clock)
    w.ingest([Shipped(T0 + 80, b"a", {"pod": "pod-a"}), Shipped(T0 + 99, b"b", {"pod": "pod-b"}),
              Shipped(T0 + 95, b"c", {"pod": "pod-c"})])
    s = samples(m)
    assert s[("ftwatch_ingest_lag_seconds_count",)] == 1
    assert s[("ftwatch_ingest_lag_last_seconds",)] == pytest.approx(20.0)
    assert s[("ftwatch_lines_total", ("job_id", "j"))] == 3
