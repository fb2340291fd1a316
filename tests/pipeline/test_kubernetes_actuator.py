"""The kubernetes actuator against a local server that plays the Kubernetes API (tests/kubeapi.py):
every request's method, path, patch type, body and field manager; the API's 404, 409, 403, 429."""

from __future__ import annotations

import os

import pytest

from ftwatch.clock import FakeClock
from ftwatch.config.kubernetes import KubernetesConfig
from ftwatch.config.model import Config
from ftwatch.errors import ConfigError
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target, iso
from ftwatch.pipeline.actuators.breaker import NodeBreaker
from ftwatch.pipeline.actuators.exec import build_actuator
from ftwatch.pipeline.actuators.kubernetes import ANNOTATION_AT, ANNOTATION_DECISION, KubernetesActuator
from ftwatch.pipeline.sources.identity import split_job
from tests.kubeapi import JSON_PATCH, MERGE, STRATEGIC, FakeKubeApi

LABEL = "training.kubeflow.org/job-name"
NODES = "/api/v1/nodes"


@pytest.fixture
def api():
    with FakeKubeApi() as fake:
        for n in range(4):
            fake.add_node(f"node-{n}")
        for n in range(4):
            fake.add_pod("train", f"llm-a-worker-{n}", {LABEL: "llm-a"}, f"node-{n}")
            fake.add_pod("train", f"llm-b-worker-{n}", {LABEL: "llm-b"}, f"node-{n}")
        fake.add_pod("other", "llm-a-worker-0", {LABEL: "llm-a"})      # same name, other namespace
        yield fake


def actuator(api, tmp_path, clock=None, sleeps=None, **config) -> KubernetesActuator:
    cfg = KubernetesConfig(kubeconfig=api.kubeconfig(tmp_path / "kubeconfig"), **config)
    return KubernetesActuator(cfg, clock=clock or FakeClock(), sleep=(sleeps if sleeps is not None else []).append)


def decision(action: Action, job: str = "train/llm-a", instance: str | None = None, node: str | None = None,
             t: float = 1_795_219_200.0) -> Decision:
    root = Finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, action, Severity.CRITICAL,
                   Origin(instance or "llm-a-worker-2", 2, job, node or "node-2"),
                   "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", t)
    return Decision(t, action, Target(job, instance, None, node), root, "test clause", 0, 3)


def pods(api, namespace="train") -> set[str]:
    return {name for ns, name in api.pods if ns == namespace}


def test_restart_job_deletes_the_jobs_pods_in_its_namespace_only(api, tmp_path):
    result = actuator(api, tmp_path).act(decision(Action.RESTART_JOB))
    assert result.status == "done", result.output
    listing = api.requests[0]
    assert (listing.method, listing.path) == ("GET", "/api/v1/namespaces/train/pods")
    assert listing.query["labelSelector"] == [f"{LABEL}=llm-a"]
    assert [(r.method, r.path) for r in api.writes()] == [
        ("DELETE", f"/api/v1/namespaces/train/pods/llm-a-worker-{n}") for n in range(4)]
    assert pods(api) == {f"llm-b-worker-{n}" for n in range(4)}
    assert pods(api, "other") == {"llm-a-worker-0"}
    assert len(result.calls) == 5 and result.calls[1].startswith("delete pods/train/llm-a-worker-0")


def test_selector_per_kind_is_configuration(api, tmp_path):
    api.add_pod("train", "js-0", {"jobset.sigs.k8s.io/jobset-name": "llm-a"})
    act = actuator(api, tmp_path, kind="jobset")
    assert act.act(decision(Action.RESTART_JOB)).status == "done"
    assert api.requests[0].query["labelSelector"] == ["jobset.sigs.k8s.io/jobset-name=llm-a"]
    assert [r.path.rsplit("/", 1)[1] for r in api.writes()] == ["js-0"]
    custom = actuator(api, tmp_path, kind="pods", selectors={"pods": "app"})
    custom.act(decision(Action.RESTART_JOB))
    assert api.requests[-1].query["labelSelector"] == ["app=llm-a"]


def test_restart_instance_deletes_one_pod_and_a_gone_pod_is_done(api, tmp_path):
    act = actuator(api, tmp_path)
    result = act.act(decision(Action.RESTART_INSTANCE, instance="llm-a-worker-1"))
    assert result.status == "done"
    assert [(r.method, r.path) for r in api.requests] == [("DELETE", "/api/v1/namespaces/train/pods/llm-a-worker-1")]
    again = act.act(decision(Action.RESTART_IN_PLACE, instance="llm-a-worker-1"))
    assert again.status == "done" and "gone (404)" in again.output


def test_isolate_node_cordons_taints_annotates_then_restarts_in_that_order(api, tmp_path):
    clock = FakeClock()
    d = decision(Action.ISOLATE_NODE, node="node-2", t=clock.time())
    result = actuator(api, tmp_path, clock=clock).act(d)
    assert result.status == "done", result.output
    writes = api.writes()
    cordon, taint, annotate = writes[:3]
    assert (cordon.method, cordon.path, cordon.content_type) == ("PATCH", f"{NODES}/node-2", STRATEGIC)
    assert cordon.body == {"spec": {"unschedulable": True}}
    assert taint.content_type == STRATEGIC and taint.body["spec"]["taints"] == [
        {"key": "ftwatch.io/isolated", "value": d.decision_id, "effect": "NoSchedule"}]
    assert taint.body["metadata"]["resourceVersion"]           # optimistic concurrency
    assert annotate.content_type == MERGE
    ann = annotate.body["metadata"]["annotations"]
    assert ann[ANNOTATION_DECISION] == d.decision_id and ann[ANNOTATION_AT] == iso(clock.time())
    assert ann["ftwatch.io/reason"].startswith("xid.79: NVRM")
    assert all(r.field_manager == "ftwatch" for r in writes[:3])
    assert [r.method for r in writes[3:]] == ["DELETE"] * 4
    node = api.nodes["node-2"]
    assert node["spec"]["unschedulable"] is True and node["spec"]["taints"][0]["key"] == "ftwatch.io/isolated"
    assert pods(api) == {f"llm-b-worker-{n}" for n in range(4)}


def test_taint_keeps_other_taints_and_rereads_on_409(api, tmp_path):
    api.nodes["node-2"]["spec"]["taints"] = [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]
    api.fail("PATCH", f"{NODES}/node-2", 409, 'Operation cannot be fulfilled on nodes "node-2"',
             match=lambda r: "taints" in (r.body or {}).get("spec", {}))
    act = actuator(api, tmp_path, taint={"key": "k", "value": "v", "effect": "NoExecute"})
    assert act.act(decision(Action.ISOLATE_NODE, node="node-2")).status == "done"
    taints = [r for r in api.writes() if "taints" in (r.body or {}).get("spec", {})]
    assert len(taints) == 2                                     # the conflict, then the retry
    gets = [r for r in api.requests if r.method == "GET" and r.path == f"{NODES}/node-2"]
    assert len(gets) == 2                                       # read again after the 409
    assert api.nodes["node-2"]["spec"]["taints"] == [{"key": "gpu", "value": "a100", "effect": "NoSchedule"},
                                                     {"key": "k", "value": "v", "effect": "NoExecute"}]


def test_403_names_the_missing_rbac_verb_and_resource(api, tmp_path):
    api.fail("DELETE", "/api/v1/namespaces/train/pods/llm-a-worker-0", 403,
             'pods "llm-a-worker-0" is forbidden: User "system:serviceaccount:ftwatch:ftwatch" cannot delete '
             'resource "pods" in API group "" in the namespace "train"')
    sleeps: list[float] = []
    result = actuator(api, tmp_path, sleeps=sleeps).act(decision(Action.RESTART_JOB))
    assert result.status == "failed"
    assert "lacks the RBAC verb 'delete' on 'pods'" in result.output and "cannot delete" in result.output
    assert sleeps == []                                          # a 403 is not retried


def test_429_waits_retry_after_and_5xx_backs_off_then_fails(api, tmp_path):
    api.fail("DELETE", "/api/v1/namespaces/train/pods/llm-a-worker-1", 429, "too many requests",
             headers={"Retry-After": "7"})
    sleeps: list[float] = []
    assert actuator(api, tmp_path, sleeps=sleeps).act(decision(Action.RESTART_JOB)).status == "done"
    assert sleeps == [7.0]
    for _ in range(3):
        api.fail("GET", "/api/v1/namespaces/train/pods", 500, "etcdserver: leader changed")
    sleeps.clear()
    result = actuator(api, tmp_path, sleeps=sleeps, retries=2, backoff=0.5).act(decision(Action.RESTART_JOB))
    assert result.status == "failed" and "500 etcdserver: leader changed" in result.output
    assert "after 3 tries" in result.output
    assert sleeps == [0.5, 1.0]


def test_breaker_holds_the_node_beyond_its_share_and_says_why(api, tmp_path):
    clock = FakeClock()
    api.nodes["node-0"]["metadata"]["annotations"][ANNOTATION_AT] = iso(clock.time() - 60)  # isolated 1 min ago
    act = actuator(api, tmp_path, clock=clock)                 # 50 % of 4 nodes: 2 per 5 min
    assert act.act(decision(Action.ISOLATE_NODE, node="node-2", t=clock.time())).status == "done"
    before = len(api.writes())
    held = act.act(decision(Action.ISOLATE_NODE, job="train/llm-b", node="node-3", t=clock.time()))
    assert held.status == "held"
    assert "circuit breaker open: 2 node(s) isolated in the last 300 s (node-0, node-2)" in held.output
    assert "node-3 is not isolated" in held.output
    assert len(api.writes()) == before                          # nothing was sent
    clock.advance(301)                                          # the window passed
    assert act.act(decision(Action.ISOLATE_NODE, job="train/llm-b", node="node-3", t=clock.time())).status == "done"


def test_breaker_limit_by_share_and_count():
    b = NodeBreaker(0.5, 1, 300)
    assert b.limit(10) == 1 and NodeBreaker(0.5).limit(5) == 2 and NodeBreaker(0.5).limit(1) == 0
    assert b.check("a", 0.0, 10) is None
    b.record("a", 0.0)
    assert "at most 1" in b.check("b", 10.0, 10) and b.check("a", 10.0, 10) is None


def test_dry_run_sends_no_write_and_logs_every_call(api, tmp_path):
    logged: list[str] = []
    cfg = KubernetesConfig(kubeconfig=api.kubeconfig(tmp_path / "kc"), dry_run=True)
    act = KubernetesActuator(cfg, clock=FakeClock(), sleep=lambda s: None, log=logged.append)
    result = act.act(decision(Action.ISOLATE_NODE, node="node-2"))
    assert result.status == "dry_run"
    assert api.writes() == []
    assert {r.method for r in api.requests} == {"GET"}
    would = [c for c in result.calls if c.endswith("dry run (not sent)")]
    assert [c.split(" (")[0] for c in would[:3]] == ["patch nodes/node-2"] * 3
    assert len(would) == 3 + 4 and logged == list(result.calls)


@pytest.mark.parametrize("kind, path, body", [
    ("pytorchjob", "/apis/kubeflow.org/v1/namespaces/train/pytorchjobs/llm-a", {"spec": {"runPolicy": {"suspend": True}}}),
    ("jobset", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/train/jobsets/llm-a", {"spec": {"suspend": True}}),
    ("trainjob", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/train/trainjobs/llm-a", {"spec": {"suspend": True}}),
    ("job", "/apis/batch/v1/namespaces/train/jobs/llm-a", {"spec": {"suspend": True}}),
])
def test_fail_job_suspends_the_job_object(api, tmp_path, kind, path, body):
    prefix, plural = "/".join(path.split("/")[2:4]), path.split("/")[6]
    api.add_object(prefix, "train", plural, "llm-a", {})
    result = actuator(api, tmp_path, kind=kind).act(decision(Action.FAIL_JOB))
    assert result.status == "done", result.output
    (req,) = api.writes()
    assert (req.method, req.path, req.content_type, req.body) == ("PATCH", path, MERGE, body)
    assert req.field_manager == "ftwatch"


def test_fail_job_delete_and_volcano_without_suspend(api, tmp_path):
    api.add_object("kubeflow.org/v1", "train", "pytorchjobs", "llm-a", {})
    assert actuator(api, tmp_path, fail="delete").act(decision(Action.FAIL_JOB)).status == "done"
    (req,) = api.writes()
    assert (req.method, req.path) == ("DELETE", "/apis/kubeflow.org/v1/namespaces/train/pytorchjobs/llm-a")
    assert ("kubeflow.org/v1", "train", "pytorchjobs", "llm-a") not in api.objects
    result = actuator(api, tmp_path, kind="volcano").act(decision(Action.FAIL_JOB))
    assert result.status == "failed" and "no suspend field" in result.output


def test_readmit_uncordons_removes_taint_and_annotations_with_one_json_patch(api, tmp_path):
    clock = FakeClock()
    api.nodes["node-2"]["spec"]["taints"] = [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]
    act = actuator(api, tmp_path, clock=clock)
    act.act(decision(Action.ISOLATE_NODE, node="node-2"))
    assert [n["name"] for n in act.isolated_nodes()] == ["node-2"]
    api.requests.clear()
    result = act.readmit("node-2")
    assert result.status == "done", result.output
    (patch,) = api.writes()
    assert patch.content_type == JSON_PATCH and patch.field_manager == "ftwatch"
    assert patch.body[0]["op"] == "test" and patch.body[0]["path"] == "/metadata/resourceVersion"
    assert {"op": "remove", "path": "/metadata/annotations/ftwatch.io~1decision-id"} in patch.body
    node = api.nodes["node-2"]
    assert node["spec"]["unschedulable"] is False
    assert node["spec"]["taints"] == [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]
    assert not any(k.startswith("ftwatch.io/") for k in node["metadata"]["annotations"])
    assert act.isolated_nodes() == []


def test_readmission_after_a_quiet_period_when_turned_on(api, tmp_path):
    clock = FakeClock()
    act = actuator(api, tmp_path, clock=clock, readmit_after=600)
    act.act(decision(Action.ISOLATE_NODE, node="node-1", t=clock.time()))
    assert act.tick(clock.time()) == []                         # isolated just now
    clock.advance(601)
    (node, result), = act.tick(clock.time())
    assert node == "node-1" and result.status == "done"
    assert api.nodes["node-1"]["spec"]["unschedulable"] is False
    assert actuator(api, tmp_path, clock=clock).tick(clock.time() + 10_000) == []    # off by default


def test_split_job_keeps_namespace_and_name_apart():
    assert split_job("team-a/mnist") == ("team-a", "mnist")
    assert split_job("mnist", "jobs") == ("jobs", "mnist")


def test_config_selects_the_actuator_and_a_missing_cluster_is_a_config_error(tmp_path, monkeypatch):
    config = Config.model_validate({"watch": {"actuator": {"type": "kubernetes", "kubernetes": {
        "kubeconfig": str(tmp_path / "missing"), "breaker": {"max_share": 0.25}}}}})
    assert config.watch.actuator.kubernetes.breaker.max_share == 0.25
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="no usable cluster configuration"):
        build_actuator(config.watch.actuator)


def test_nodes_cli_lists_and_readmits(api, tmp_path, capsys):
    from ftwatch.cli import main
    kc = str(api.kubeconfig(tmp_path / "kc"))
    actuator(api, tmp_path).act(decision(Action.ISOLATE_NODE, node="node-3"))
    assert main(["nodes", "list", "--kubeconfig", kc]) == 0
    out = capsys.readouterr().out
    assert "node-3" in out and "xid.79" in out and "node-1" not in out
    assert main(["nodes", "readmit", "node-3", "--kubeconfig", kc, "--dry-run"]) == 0
    assert api.nodes["node-3"]["spec"]["unschedulable"] is True
    assert main(["nodes", "readmit", "node-3", "--kubeconfig", kc]) == 0
    assert "node-3 readmitted" in capsys.readouterr().out
    assert api.nodes["node-3"]["spec"]["unschedulable"] is False


@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no real cluster to test "
                    "against (README \"Running on Kubernetes\": kind create cluster, then KUBECONFIG=...)")
def test_against_a_real_cluster_when_kubeconfig_is_set(tmp_path):
    """Opt-in: with KUBECONFIG at a disposable cluster (kind, k3s): the isolation of a real node in
    dry run (reads only), then a restart that deletes a labelled pod of namespace default."""
    from kubernetes import client
    from ftwatch.pipeline.actuators.kubeapi import load_api_client
    api_client = load_api_client(os.environ["KUBECONFIG"])
    core = client.CoreV1Api(api_client)
    node = core.list_node().items[0].metadata.name
    dry = KubernetesActuator(KubernetesConfig(kubeconfig=os.environ["KUBECONFIG"], dry_run=True, kind="pods"))
    assert dry.act(decision(Action.ISOLATE_NODE, job="default/ftwatch-e2e", node=node)).status == "dry_run"
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="ftwatch-e2e-0", labels={"ftwatch.io/job": "ftwatch-e2e"}),
                       spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox",
                                                                            command=["sleep", "600"])]))
    core.create_namespaced_pod("default", pod)
    act = KubernetesActuator(KubernetesConfig(kubeconfig=os.environ["KUBECONFIG"], kind="pods"))
    result = act.act(decision(Action.RESTART_JOB, job="default/ftwatch-e2e"))
    assert result.status == "done", result.output
    assert "delete pods/default/ftwatch-e2e-0" in result.output
