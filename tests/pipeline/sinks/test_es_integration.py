"""Against a real Elasticsearch 8.x or 9.x cluster: set ``FTWATCH_ES_URL`` (and, if it needs them,
``FTWATCH_ES_API_KEY`` or ``FTWATCH_ES_USERNAME``/``FTWATCH_ES_PASSWORD``); skipped otherwise.

Uses its own data stream prefix and removes what it made.
"""

from __future__ import annotations

import os
import uuid

import pytest

from ftwatch.config.storage import ElasticsearchConfig
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.sinks.elasticsearch import setup as essetup
from ftwatch.pipeline.sinks.elasticsearch.sink import ElasticsearchSink, build_client
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, RunEnd, RunStart

URL = os.environ.get("FTWATCH_ES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="FTWATCH_ES_URL is not set: no Elasticsearch cluster to test against")


@pytest.fixture
def cluster(tmp_path):
    prefix = f"ftwtest{uuid.uuid4().hex[:8]}"
    auth = {}
    if os.environ.get("FTWATCH_ES_API_KEY"):
        auth["api_key"] = os.environ["FTWATCH_ES_API_KEY"]
    elif os.environ.get("FTWATCH_ES_USERNAME"):
        auth = {"username": os.environ["FTWATCH_ES_USERNAME"], "password": os.environ.get("FTWATCH_ES_PASSWORD", "")}
    cfg = ElasticsearchConfig(url=URL, data_stream_prefix=prefix, verify_certs=os.environ.get("FTWATCH_ES_VERIFY", "1") != "0",
                              labels={"app.kubernetes.io/name": "trainer", "app": "demo"}, **auth)
    client = build_client(cfg)
    essetup.install(client, prefix)
    yield cfg, client, tmp_path
    client.options(ignore_status=404).indices.delete_data_stream(name=f"{prefix}-*")
    client.options(ignore_status=404).indices.delete_index_template(name=prefix)
    for name in (f"{prefix}-settings", f"{prefix}-mappings"):
        client.options(ignore_status=404).cluster.delete_component_template(name=name)
    client.options(ignore_status=404).ilm.delete_lifecycle(name=prefix)
    client.close()


def test_documents_arrive_once_in_data_streams_with_no_mapping_conflict(cluster):
    cfg, client, tmp = cluster
    sink = ElasticsearchSink.from_config(cfg, tmp)
    origin = Origin("pod-1", 1, "job-i", "node-i", "stdout", "forward")
    f = Finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, Severity.CRITICAL,
                origin, "NVRM: Xid 79", 1_795_219_200.0, fields={"kubernetes": {"labels": {"app": "x"}}})
    d = Decision(1_795_219_201.0, Action.ISOLATE_NODE, Target("job-i", "pod-1", 1, "node-i"), f, "hardware", 0, 3, (f,))
    sink.write([FindingBatch([f])])
    sink.write([d])
    sink.write([LifecycleEvent(1_795_219_199.0, "job-i", "job_start", detail={"attempt": 0})])
    assert sink.flush() == 0, sink.stats
    assert sink.stats.dead_lettered == 0 and sink.stats.sent == 3
    sink.write([d])                    # the same decision again: 409, counted as done
    assert sink.flush() == 0 and sink.stats.duplicates == 1
    sink.close()
    prefix = cfg.data_stream_prefix
    client.indices.refresh(index=f"{prefix}-*")
    assert client.count(index=f"{prefix}-decisions")["count"] == 1
    hit = client.search(index=f"{prefix}-decisions", query={"term": {"ftwatch.target.node": "node-i"}})["hits"]["hits"]
    assert hit and hit[0]["_id"] == d.decision_id
    found = client.search(index=f"{prefix}-findings", query={"term": {"labels.app_kubernetes_io/name": "trainer"}})
    assert found["hits"]["total"]["value"] == 1
    streams = client.indices.get_data_stream(name=f"{prefix}-*")["data_streams"]
    assert {s["name"] for s in streams} == {f"{prefix}-findings", f"{prefix}-decisions", f"{prefix}-events"}


def test_the_report_reads_back_from_the_cluster_what_the_sqlite_store_holds(cluster):
    """The sink and the SQLite store fed the same calls (FanOut); ``EsReader`` pages through a real
    point in time and the report model is the same."""
    from ftwatch.pipeline.sinks.fanout import FanOut
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    from ftwatch.report import model
    from ftwatch.report.esreader import EsReader
    from ftwatch.report.reader import SqliteReader

    cfg, client, tmp = cluster
    t0 = 1_795_219_200.123456
    store = FanOut(SqliteStore(tmp / "ftwatch.db"), [ElasticsearchSink.from_config(cfg, tmp)])
    cmd = ["python", "train.py"]
    store.write([RunStart("job-r", 0, t0, cmd)])
    store.write([LifecycleEvent(t0, "job-r", "job_start", detail={"attempt": 0, "command": cmd})])
    for rank in range(3):
        store.write([LifecycleEvent(t0 + 1, "job-r", "instance_start", f"w-{rank}", rank, {"pid": rank})])
    origin = Origin("w-1", 1, "job-r", "node-r", "stderr", "process")
    f = Finding("nccl.x", "error", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB, Severity.ERROR, origin,
                "NCCL error", t0 + 2.5, seq=1)
    store.write([FindingBatch([f], attempt=0)])
    store.write([Decision(t0 + 3, Action.RESTART_JOB, Target("job-r"), f, "retryable", 1, 2, (f,), 0)])
    store.write([LifecycleEvent(t0 + 3, "job-r", "instance_exit", "w-1", 1, {"returncode": 1, "signal": None})])
    store.write([RunEnd("job-r", 0, t0 + 3.5, "restarted")])
    store.write([OutputBatch([("job-r", f"w-{rank}", rank, 1_795_219_200.0 + k, 1.0, 3 + rank, 30)
                      for rank in range(3) for k in range(40)])])
    store.close()
    client.indices.refresh(index=f"{cfg.data_stream_prefix}-*")
    with SqliteReader(tmp / "ftwatch.db") as sq, EsReader.from_config(cfg, page_size=25) as es:
        assert es.jobs() == ["job-r"] and es.output("job-r") == sq.output("job-r")
        assert es.events("job-r") == sq.events("job-r") and es.runs("job-r") == sq.runs("job-r")
        assert {**model.build(es), "source": None} == {**model.build(sq), "source": None}
        assert es.searches > 5                                  # 120 output documents in pages of 25
