"""`ftwatch watch` with the kubernetes actuator, end to end: the real fluent-logger client ships two
jobs' lines over Forward, `watch` decides isolate_node, and a local server playing the Kubernetes
API (tests/kubeapi.py) sees the cordon, the taint, the annotation and the pod deletions in that
order; the next node beyond the breaker's share is held, and `ftwatch explain` shows both."""

from __future__ import annotations

import subprocess
import sys
import time

from fluent import sender

from ftwatch.events import iso
from tests.integration.test_watch_cluster import XID_79, Watch, record
from tests.kubeapi import MERGE, STRATEGIC, FakeKubeApi

LABEL = "training.kubeflow.org/job-name"
RANKS_PER_NODE = 2


def pods_of(api: FakeKubeApi, job: str) -> set[str]:
    return {name for (_, name), pod in api.pods.items() if pod["metadata"]["labels"][LABEL] == job}


def wait(predicate, what: str, watch: Watch, deadline: float = 30) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} never happened:\n{''.join(watch.lines)}")


def test_isolate_node_reaches_the_kubernetes_api_in_order_and_the_breaker_holds(tmp_path):
    with FakeKubeApi() as api:
        for n in range(4):
            api.add_node(f"node-{n}")
        # node-0 was isolated a minute ago: with the default 50 % of 4 nodes, one more may go
        api.nodes["node-0"]["metadata"]["annotations"]["ftwatch.io/isolated-at"] = iso(time.time() - 60)
        for job in ("llm-a", "llm-b"):
            for node in range(4):
                for local in range(RANKS_PER_NODE):
                    rank = node * RANKS_PER_NODE + local
                    api.add_pod("train", f"{job}-worker-{rank}", {LABEL: job}, f"node-{node}")
        config = {
            "policy": {"enable_job_restart": True},
            "watch": {"sources": [{"type": "forward", "port": 0}], "settle": 1.0, "cooldown": 30.0,
                      "actuator": {"type": "kubernetes", "kubernetes": {
                          "kubeconfig": str(api.kubeconfig(tmp_path / "kubeconfig")), "backoff": 0.1}}},
        }
        watch = Watch(tmp_path, config)
        try:
            port = int(watch.wait_for(r"source forward started on port (\d+)").group(1))
            senders = [sender.FluentSender("kube", host="127.0.0.1", port=port, nanosecond_precision=True)
                       for _ in range(4)]

            def emit(job: str, node: int, log: str) -> None:
                for local in range(RANKS_PER_NODE):
                    rank = node * RANKS_PER_NODE + local
                    assert senders[node].emit("var.log.containers", record(job, node, rank, log))

            for step in range(3):
                for job in ("llm-a", "llm-b"):
                    for node in range(4):
                        emit(job, node, f"step {step} loss 0.5")
            emit("llm-a", 2, XID_79)
            wait(lambda: not pods_of(api, "llm-a"), "the deletion of llm-a's pods", watch)
            emit("llm-b", 3, XID_79)
            watch.wait_for(r"circuit breaker open")
            wait(lambda: len(watch.decisions_now()) == 2, "the second decision", watch)
            for s in senders:
                s.close()
        finally:
            code = watch.stop()
        assert code == 0, "".join(watch.lines)
        first, second = watch.decisions_now()
        assert first["action"] == second["action"] == "isolate_node"
        assert (first["target"]["job"], first["target"]["node"]) == ("train/llm-a", "node-2")
        assert (second["target"]["job"], second["target"]["node"]) == ("train/llm-b", "node-3")

        writes = api.writes()
        cordon, taint, annotate, *deletes = writes
        assert (cordon.method, cordon.path, cordon.content_type, cordon.body) == (
            "PATCH", "/api/v1/nodes/node-2", STRATEGIC, {"spec": {"unschedulable": True}})
        assert (annotate.path, annotate.content_type) == ("/api/v1/nodes/node-2", MERGE)
        decision_id = annotate.body["metadata"]["annotations"]["ftwatch.io/decision-id"]
        assert (taint.path, taint.content_type) == ("/api/v1/nodes/node-2", STRATEGIC)
        assert taint.body["spec"]["taints"] == [{"key": "ftwatch.io/isolated", "value": decision_id,
                                                 "effect": "NoSchedule"}]
        assert all(r.field_manager == "ftwatch" for r in (cordon, taint, annotate))
        assert sorted(r.path.rsplit("/", 1)[1] for r in deletes) == [f"llm-a-worker-{r}" for r in range(8)]
        assert all(r.method == "DELETE" for r in deletes)
        assert not any("node-3" in r.path for r in writes)             # held: nothing sent for node-3
        assert pods_of(api, "llm-b") == {f"llm-b-worker-{r}" for r in range(8)}
        assert api.nodes["node-3"]["spec"].get("unschedulable") is None

        state = str(tmp_path / "state")
        done = subprocess.run([sys.executable, "-m", "ftwatch", "explain", "--state-dir", state, decision_id],
                              capture_output=True, text=True, timeout=60)
        assert "Action taken" in done.stdout and "isolate_node: done" in done.stdout, done.stdout + done.stderr
        assert "patch nodes/node-2 (cordon, strategic merge" in done.stdout
        assert "delete pods/train/llm-a-worker-0 (restart job): ok" in done.stdout
        held = subprocess.run([sys.executable, "-m", "ftwatch", "explain", "--state-dir", state],  # the last one
                              capture_output=True, text=True, timeout=60)
        assert "isolate_node: held" in held.stdout and "circuit breaker open" in held.stdout, held.stdout
