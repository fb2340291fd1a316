"""The Elasticsearch sink with the official client against a real local HTTP server (conftest's
FakeElasticsearch): bulk wire format, partial failures, 429s, lost acknowledgements, a cluster
that goes away and comes back, a crash; nothing lost, nothing doubled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from elasticsearch import Elasticsearch

from ftwatch.alerting.notify import DeliveryResult
from ftwatch.errors import SinkError
from ftwatch.events import (Action, Decision, FailureClass, Finding, Origin, Severity, Target)
from ftwatch.pipeline.sinks.elasticsearch.sink import ElasticsearchSink
from ftwatch.pipeline.sinks.fanout import FanOut
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, RunEnd, RunStart
from ftwatch.testing import KEYERROR_JOB

COMPAT_JSON = "application/vnd.elasticsearch+json; compatible-with=8"
COMPAT_NDJSON = "application/vnd.elasticsearch+x-ndjson; compatible-with=8"

T0 = 1_795_219_200.0


def finding(rank: int, t: float = T0, rule: str = "nccl.unhandled_system_error") -> Finding:
    origin = Origin(f"worker-{rank}", rank, "job-a", "node-1", "stderr", "process")
    return Finding(rule, "keyword", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB, Severity.ERROR,
                   origin, f"NCCL error on rank {rank}", t, seq=rank, evidence=("a", "b"))


def decision(t: float = T0 + 5) -> Decision:
    rc = finding(1)
    return Decision(t, Action.RESTART_JOB, Target("job-a"), rc, "retryable error, restarts left", 1, 2,
                    (rc, finding(2)), attempt=0)


def make_sink(url: str, buffer: Path, sleeps: list[float] | None = None, **kwargs) -> ElasticsearchSink:
    client = Elasticsearch(url, max_retries=0, request_timeout=5)
    return ElasticsearchSink(client, buffer, sleep=(sleeps if sleeps is not None else []).append,
                             host="node-1", now=lambda: T0 + 9, **kwargs)


def write_some(sink: ElasticsearchSink, n: int, t: float = T0) -> None:
    for i in range(n):
        sink.write([LifecycleEvent(t + i, "job-a", "instance_exit", f"worker-{i}", i, {"returncode": 1, "signal": None})])


def test_every_kind_lands_in_its_data_stream_in_the_bulk_wire_format(fake_es, tmp_path):
    """NDJSON create pairs, compatibility headers on the request, ECS documents under stable ids."""
    sink = make_sink(fake_es.url, tmp_path / "buf")
    sink.write([LifecycleEvent(T0, "job-a", "job_start", detail={"attempt": 0, "command": ["python", "t.py"]})])
    sink.write([FindingBatch([finding(0), finding(1)], attempt=0)])
    d = decision()
    sink.write([d])                          # under its id: fake_es.docs[(..., d.decision_id)] below
    sink.write([DeliveryResult("ops", f"{d.decision_id}-ops", "delivered", 1, decision_id=d.decision_id,
                                     text="restart_job", time=T0 + 6)])
    sink.write([RunEnd("job-a", 0, T0 + 7, "restarted")])
    sink.write([RunStart("job-a", 1, T0 + 8, ["python", "t.py"])])      # nothing: job_start carries it
    assert sink.pending() == 6
    assert sink.flush() == 0
    assert fake_es.problems == []
    request = fake_es.bulk_requests()[0]
    assert request["headers"]["content-type"] == COMPAT_NDJSON
    assert request["headers"]["accept"] == COMPAT_JSON
    assert Counter(index for index, _ in fake_es.docs) == {
        "ftwatch-events": 2, "ftwatch-findings": 2, "ftwatch-decisions": 1, "ftwatch-alerts": 1}
    doc = fake_es.docs[("ftwatch-decisions", d.decision_id)]
    assert doc["event"]["action"] == "restart_job" and doc["ftwatch"]["root_cause"]["rule_id"] == d.root_cause.rule_id
    assert sink.stats.sent == 6 and sink.pending() == 0
    sink.close()


def test_partial_failure_is_checked_item_by_item(fake_es, tmp_path):
    """A 200 with errors: 429 items are resent, a 400 item goes to the dead-letter file, the rest stay."""
    sleeps: list[float] = []
    sink = make_sink(fake_es.url, tmp_path / "buf", sleeps)
    write_some(sink, 6)
    fake_es.fail_next = ["partial"]          # items 1 and 4: 429; item 2: 400
    assert sink.flush() == 0
    assert sleeps == [0.5]                   # one retry, with backoff, of the two 429 items only
    assert len(fake_es.bulk_requests()[1]["raw"].decode().splitlines()) == 4
    assert len(fake_es.docs) == 5
    dead = [json.loads(line) for line in (tmp_path / "buf" / "dead-letter.jsonl").read_text().splitlines()]
    assert len(dead) == 1 and dead[0]["status"] == 400
    assert dead[0]["reason"]["type"] == "document_parsing_exception"
    assert dead[0]["doc"]["ftwatch"]["rank"] == 2 and (dead[0]["index"], dead[0]["id"]) not in fake_es.docs
    assert sink.stats.dead_lettered == 1 and sink.pending() == 0
    sink.close()


def test_whole_request_429_and_503_are_retried_with_backoff(fake_es, tmp_path):
    sleeps: list[float] = []
    sink = make_sink(fake_es.url, tmp_path / "buf", sleeps)
    write_some(sink, 3)
    fake_es.fail_next = [429, 503]
    assert sink.flush() == 0
    assert sleeps == [0.5, 2.0] and sink.stats.retries == 2
    assert len(fake_es.docs) == 3 and len(fake_es.bulk_requests()) == 3
    sink.close()


def test_a_lost_acknowledgement_is_not_doubled(fake_es, tmp_path):
    """Stored but unanswered: the resend is refused with 409 per item, which counts as done."""
    sink = make_sink(fake_es.url, tmp_path / "buf")
    write_some(sink, 4)
    fake_es.fail_next = ["drop"]
    assert sink.flush() == 0
    assert len(fake_es.docs) == 4
    assert sink.stats.duplicates == 4 and sink.stats.sent == 0 and sink.stats.dead_lettered == 0
    sink.close()


def test_items_refused_with_429_flush_after_flush_stay_on_disk_and_are_never_dead_lettered(fake_es, tmp_path):
    """Back-pressure is transient however long it lasts: no dead letter, all sent once it ends."""
    sink = make_sink(fake_es.url, tmp_path / "buf", max_retries=0)
    write_some(sink, 3)
    fake_es.fail_next = ["items429"] * 30
    for _ in range(30):
        assert sink.flush() == 3
    assert not (tmp_path / "buf" / "dead-letter.jsonl").exists() and sink.stats.dead_lettered == 0
    assert sink.flush() == 0 and len(fake_es.docs) == 3
    sink.close()


def test_the_cluster_goes_away_and_comes_back(es_server, tmp_path):
    """While it is down everything waits on disk, across a restart of ftwatch; then all arrives once."""
    first = es_server()
    port = first.port
    sink = make_sink(first.url, tmp_path / "buf")
    write_some(sink, 3)
    assert sink.flush() == 0
    first.close()                            # the cluster goes away
    write_some(sink, 5, T0 + 100)
    assert sink.flush() == 5
    assert "no connection" in sink.stats.last_error
    sink.write([decision()])
    sink.close()                             # ftwatch ends: the six stay on disk
    assert any((tmp_path / "buf").glob("seg-*.jsonl"))
    second = es_server(port)                 # the cluster comes back (a fresh one: only what waited arrives)
    again = make_sink(second.url, tmp_path / "buf")
    assert again.pending() == 6
    assert again.flush() == 0
    assert len(second.docs) == 6 and again.stats.sent == 6 and again.pending() == 0
    assert not list((tmp_path / "buf").glob("seg-*.jsonl"))
    again.close()


def test_a_crashed_process_loses_nothing(fake_es, tmp_path):
    """Documents journaled by a process that dies without closing are sent by the next one."""
    script = textwrap.dedent(f"""
        import os, sys
        from elasticsearch import Elasticsearch
        from ftwatch.pipeline.sinks.base import LifecycleEvent
        from ftwatch.pipeline.sinks.elasticsearch.sink import ElasticsearchSink
        sink = ElasticsearchSink(Elasticsearch("http://127.0.0.1:9", max_retries=0), sys.argv[1])
        for i in range(4):
            sink.write([LifecycleEvent({T0} + i, "job-a", "instance_start", f"worker-{{i}}", i, {{"pid": 100 + i}})])
        os._exit(9)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "buf")], env=os.environ.copy(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    sink = make_sink(fake_es.url, tmp_path / "buf")
    assert sink.flush() == 0
    assert sorted(d["ftwatch"]["instance"] for d in fake_es.docs.values()) == [f"worker-{i}" for i in range(4)]
    sink.close()


def test_a_server_that_is_not_elasticsearch_gets_nothing_and_nothing_is_lost(es_server, tmp_path):
    """The client requires X-Elastic-Product on 2xx answers; without it the documents stay on disk."""
    server = es_server(product_header=False)
    sink = make_sink(server.url, tmp_path / "buf")
    write_some(sink, 2)
    assert sink.flush() == 2
    assert "200" in sink.stats.last_error
    sink.close()


def test_full_batches_are_separate_bulk_requests(fake_es, tmp_path):
    sink = make_sink(fake_es.url, tmp_path / "buf", batch_size=4)
    write_some(sink, 10)
    assert sink.flush() == 0
    sizes = [len(r["raw"].decode().splitlines()) // 2 for r in fake_es.bulk_requests()]
    assert sizes == [4, 4, 2] and len(fake_es.docs) == 10


def test_one_buffer_directory_has_one_owner(fake_es, tmp_path):
    sink = make_sink(fake_es.url, tmp_path / "buf")
    with pytest.raises(SinkError, match="in use"):
        make_sink(fake_es.url, tmp_path / "buf")
    sink.close()
    make_sink(fake_es.url, tmp_path / "buf").close()     # free again once closed


def test_fan_out_gives_both_stores_everything_and_a_broken_sink_breaks_nothing(fake_es, tmp_path):
    sqlite = SqliteStore(tmp_path / "ftwatch.db")
    es = make_sink(fake_es.url, tmp_path / "buf")

    class Broken:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise SinkError("disk full")
            return fail

    store = FanOut(sqlite, [es, Broken()])
    d = decision()
    store.write([d])
    store.write([FindingBatch([finding(3)], attempt=1)])
    store.write([LifecycleEvent(T0, "job-a", "job_restart", detail={"attempt": 0})])
    # the reading side is the primary's (no attribute is forwarded)
    assert store.primary is sqlite and sqlite.decision(d.decision_id)["action"] == "restart_job"
    assert store.errors == 3
    es.flush()
    assert len(fake_es.docs) == 3 and len(sqlite.findings_for("job-a")) == 1
    store.extra.pop()
    store.close()


@pytest.mark.slow
def test_ftwatch_run_writes_to_elasticsearch_and_flushes_on_exit(fake_es, tmp_path):
    """The real command: a failing one-line job, storage.elasticsearch pointing at the server."""
    config = tmp_path / "ftwatch.yaml"
    config.write_text(f"storage:\n  elasticsearch:\n    url: {fake_es.url}\n    flush_interval: 3600\n"
                      "    labels: {app.kubernetes.io/name: trainer, app: demo}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ftwatch", "run", "--config", str(config), "--state-dir", str(tmp_path / "state"),
         "--job-id", "es-job", "--", *KEYERROR_JOB],
        env=os.environ.copy(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert fake_es.problems == []
    kinds = Counter(index for index, _ in fake_es.docs)
    assert kinds["ftwatch-decisions"] >= 1 and kinds["ftwatch-findings"] >= 1 and kinds["ftwatch-events"] >= 3
    doc = next(d for (i, _), d in fake_es.docs.items() if i == "ftwatch-decisions")
    assert doc["ftwatch"]["job"] == "es-job"
    assert doc["labels"] == {"app_kubernetes_io/name": "trainer", "app": "demo", "job": "es-job"}
    assert not list((tmp_path / "state" / "es-buffer").glob("seg-*.jsonl"))


def test_the_background_thread_sends_a_full_batch_without_waiting_for_the_interval(fake_es, tmp_path):
    """A full batch wakes the flusher at once (the interval is an hour); waits on the server, with a deadline."""
    import time

    sink = make_sink(fake_es.url, tmp_path / "buf", batch_size=5)
    sink.start(3600)
    write_some(sink, 5)
    deadline = time.monotonic() + 20
    while len(fake_es.docs) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(fake_es.docs) == 5
    write_some(sink, 2, T0 + 50)             # not a full batch: sent by close
    sink.close()
    assert len(fake_es.docs) == 7 and sink.pending() == 0


def test_es_flush_sends_what_an_earlier_run_left_on_disk(fake_es, tmp_path, capsys):
    from ftwatch.cli import main

    sink = make_sink("http://127.0.0.1:9", tmp_path / "es-buffer")    # nobody listens there
    write_some(sink, 3)
    sink.close()
    assert main(["es", "flush", "--url", "http://127.0.0.1:9", "--state-dir", str(tmp_path), "--retries", "0"]) == 1
    assert "3 left" in capsys.readouterr().out
    assert main(["es", "flush", "--url", fake_es.url, "--state-dir", str(tmp_path)]) == 0
    assert "3 sent" in capsys.readouterr().out and len(fake_es.docs) == 3


def test_a_line_cut_short_in_the_journal_is_a_dead_letter_and_the_rest_is_sent(fake_es, tmp_path):
    sink = make_sink("http://127.0.0.1:9", tmp_path / "buf")          # nobody listens: stays on disk
    write_some(sink, 2)
    sink.close()
    seg = next((tmp_path / "buf").glob("seg-*.jsonl"))
    seg.write_text(seg.read_text() + '{"index": "ftwatch-events", "id": "x", "do')    # a crash mid-write
    again = make_sink(fake_es.url, tmp_path / "buf")
    assert again.flush() == 0
    assert len(fake_es.docs) == 2 and again.stats.dead_lettered == 1
    dead = json.loads((tmp_path / "buf" / "dead-letter.jsonl").read_text())
    assert dead["reason"] == "unreadable buffer line" and dead["raw"].startswith('{"index"')
    again.close()


def test_two_runs_on_one_buffer_directory_are_refused_clearly(fake_es, tmp_path):
    from ftwatch.pipeline.build import build_store
    from ftwatch.config.model import Config
    from ftwatch.errors import ConfigError

    config = Config.model_validate({"storage": {"elasticsearch": {"url": fake_es.url}}})
    store = build_store(config, tmp_path)
    assert isinstance(store, FanOut)
    with pytest.raises(ConfigError, match="in use by another ftwatch process"):
        build_store(config, tmp_path)
    store.close()
