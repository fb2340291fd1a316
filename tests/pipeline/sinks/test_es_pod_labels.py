"""Pod labels of shipped Kubernetes records reach Elasticsearch: a real `ftwatch watch` (HTTP
source) gets a fluent-bit record with dotted and plain labels; the documents of its finding and
its output carry them (de-dotted in `labels`, verbatim in `ftwatch.labels`) and the pod's node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from ftwatch.events import Origin
from ftwatch.pipeline.sources.identity import Identity
from ftwatch.pipeline.sinks.elasticsearch import ecs

LABELS = {"app.kubernetes.io/name": "trainer", "app": "demo", "training.kubeflow.org/job-name": "mnist",
          "training.kubeflow.org/replica-index": "0"}


def kube_record(log: str) -> dict:
    return {"log": log, "stream": "stderr", "date": time.time(),
            "kubernetes": {"pod_name": "mnist-worker-0", "namespace_name": "team-a", "host": "node-7",
                           "container_name": "pytorch", "labels": LABELS}}


def test_identity_gives_the_origin_the_pods_labels_and_equality_ignores_them():
    origin = Identity().origin(kube_record("x"))
    assert dict(origin.labels) == LABELS and origin.node == "node-7" and origin.rank == 1
    assert origin == Origin(origin.instance, origin.rank, origin.job, origin.node, origin.stream, origin.source)
    assert origin.with_rank(5).labels == origin.labels


@pytest.mark.slow
def test_watch_sends_pod_labels_with_findings_and_output(fake_es, tmp_path):
    config = tmp_path / "ftwatch.yaml"
    config.write_text(json.dumps({
        "watch": {"sources": [{"type": "http", "name": "in", "host": "127.0.0.1", "port": 0}]},
        "storage": {"elasticsearch": {"url": fake_es.url, "flush_interval": 3600,
                                      "labels": {"cluster": "gpu-a"}}}}))
    proc = subprocess.Popen([sys.executable, "-m", "ftwatch", "watch", "--config", str(config), "--state-dir",
                             str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            port = next((int(x.rsplit(" ", 1)[1]) for x in list(lines) if "source in started on port" in x), None)
            time.sleep(0.05)
        assert port, "".join(lines)
        records = [kube_record("step 1 loss 0.5"), kube_record("RuntimeError: NCCL error: unhandled system error")]
        assert httpx.post(f"http://127.0.0.1:{port}/", json=records, timeout=10).status_code == 200
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert fake_es.problems == [], "".join(lines)
    by_kind: dict[str, list[dict]] = {}
    for (index, _), doc in fake_es.docs.items():
        by_kind.setdefault(index, []).append(doc)
    assert by_kind.get("ftwatch-findings") and by_kind.get("ftwatch-output"), "".join(lines)
    for doc in by_kind["ftwatch-findings"] + by_kind["ftwatch-output"]:
        assert doc["labels"] == {**ecs.dedot(LABELS), "cluster": "gpu-a", "job": "team-a/mnist"}
        assert doc["labels"]["app_kubernetes_io/name"] == "trainer" and doc["labels"]["app"] == "demo"
        assert doc["ftwatch"]["labels"] == {"cluster": "gpu-a", **LABELS}
        assert doc["host"]["name"] == "node-7"
