"""deploy/: the fluent-bit configs forward to what ftwatch's config listens on, with acks and retries."""

from __future__ import annotations

from pathlib import Path

import yaml

from ftwatch.config.model import Config

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def daemonset_fluent_bit() -> dict:
    cm = next(d for d in docs(DEPLOY / "fluent-bit" / "fluent-bit-daemonset.yaml")
              if d["kind"] == "ConfigMap")
    return yaml.safe_load(cm["data"]["fluent-bit.yaml"])


def ftwatch_config() -> Config:
    cm = next(d for d in docs(DEPLOY / "ftwatch" / "ftwatch.yaml") if d["kind"] == "ConfigMap")
    return Config.model_validate(yaml.safe_load(cm["data"]["ftwatch.yaml"]))


def forward_outputs(fb: dict) -> list[dict]:
    return [o for o in fb["pipeline"]["outputs"] if o["name"] == "forward"]


def test_daemonset_forwards_to_the_ftwatch_service_port_with_acks():
    """The DaemonSet's forward output hits the Service and the listener port, acked and retried."""
    fb = daemonset_fluent_bit()
    config = ftwatch_config()
    listener = next(s for s in config.watch.sources if s.type == "forward")
    service = next(d for d in docs(DEPLOY / "ftwatch" / "ftwatch.yaml") if d["kind"] == "Service")
    for out in forward_outputs(fb):
        assert out["require_ack_response"] is True
        assert int(out["retry_limit"]) > 0
        assert out["host"] == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
        assert int(out["port"]) == service["spec"]["ports"][0]["port"] == listener.port
        assert ("shared_key" in out) == (listener.shared_key is not None or listener.shared_key_file is not None)
        assert (str(out.get("tls", "off")) in ("on", "true", "True")) == (listener.tls_cert is not None)
    assert listener.host == "0.0.0.0"     # in a pod: reachable through the Service on purpose


def test_daemonset_joins_cri_partials_and_python_tracebacks_and_labels_pods():
    """cri multiline on the input, the python multiline filter first, the kubernetes filter with labels."""
    fb = daemonset_fluent_bit()
    tail = fb["pipeline"]["inputs"][0]
    assert tail["name"] == "tail" and tail["multiline.parser"] == "cri"
    filters = fb["pipeline"]["filters"]
    assert filters[0]["name"] == "multiline" and filters[0]["multiline.parser"] == "python"
    k8s = next(f for f in filters if f["name"] == "kubernetes")
    assert k8s["labels"] == "on" or k8s["labels"] is True
    assert ftwatch_config().watch.identity.job_label == "training.kubeflow.org/job-name"


def test_host_config_forwards_to_a_local_listener():
    """The single-host config tails files and forwards to 127.0.0.1:24224 with acks."""
    fb = yaml.safe_load((DEPLOY / "fluent-bit" / "fluent-bit-host.yaml").read_text())
    out = forward_outputs(fb)[0]
    assert out["host"] == "127.0.0.1" and int(out["port"]) == 24224
    assert out["require_ack_response"] is True and int(out["retry_limit"]) > 0
    assert Config.model_validate({"watch": {"sources": [{"type": "forward"}]}}).watch.sources[0].port == 24224


def test_deployment_runs_watch_with_the_config_and_keeps_state():
    """One replica, Recreate, `ftwatch watch --config`, state on a volume."""
    dep = next(d for d in docs(DEPLOY / "ftwatch" / "ftwatch.yaml") if d["kind"] == "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["ftwatch", "watch"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(ftwatch_config().storage.state_dir) in mounts


# -- issue 13: the deployment acts through the Kubernetes API, as shipped ---------------------

import pytest  # noqa: E402

from ftwatch.clock import FakeClock  # noqa: E402
from ftwatch.config.kubernetes import KubernetesConfig  # noqa: E402
from ftwatch.events import Action, Decision, Target  # noqa: E402

MANIFESTS = sorted(DEPLOY.glob("*/*.yaml"))
K8S_DOCS = [(path, d) for path in MANIFESTS for d in docs(path) if "kind" in d and "apiVersion" in d]


def _model(d: dict) -> str:
    """The kubernetes client's OpenAPI model of a manifest: ``V1Deployment``, ``V1ClusterRole`` ..."""
    version = d["apiVersion"].rpartition("/")[2]
    return version[0].upper() + version[1:] + d["kind"]


def _drop_empty(value):
    if isinstance(value, dict):
        return {k: _drop_empty(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


@pytest.mark.parametrize("path, doc", K8S_DOCS, ids=[f"{p.parent.name}/{p.name}:{d['kind']}/{d['metadata']['name']}"
                                                      for p, d in K8S_DOCS])
def test_every_manifest_is_a_valid_object_of_the_kubernetes_openapi_models(path, doc):
    """Each object deserializes into the client's model (required fields, types) and serializes
    back to the same document: a misspelt or misplaced field would be dropped and differ."""
    from kubernetes.client import ApiClient
    api = ApiClient()
    obj = api._ApiClient__deserialize(doc, _model(doc))
    assert type(obj).__name__ == _model(doc)
    back = _drop_empty(api.sanitize_for_serialization(obj))
    expected = json_roundtrip(doc)
    assert back == expected


def json_roundtrip(doc):
    """The manifest as JSON would carry it (YAML's ints for octal modes and the like kept)."""
    import json
    return json.loads(json.dumps(doc))


def _objects(kind: str) -> list[dict]:
    return [d for _, d in K8S_DOCS if d["kind"] == kind]


def _granted(service_account: str, namespace: str) -> set[tuple[str, str, str]]:
    """(api group, resource, verb) the ClusterRoles bound to the ServiceAccount grant."""
    roles = {r["metadata"]["name"]: r for r in _objects("ClusterRole")}
    out = set()
    for binding in _objects("ClusterRoleBinding"):
        if {"kind": "ServiceAccount", "name": service_account, "namespace": namespace} in binding["subjects"]:
            for rule in roles[binding["roleRef"]["name"]]["rules"]:
                out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def _needed(tmp_path) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) the kubernetes actuator uses with the shipped config, for each
    decision, each job kind's suspend and a readmission: read from the calls it makes (its
    ``log`` gets each call's line) against the fake API."""
    from ftwatch.pipeline.actuators.kubernetes import KubernetesActuator
    from tests.kubeapi import FakeKubeApi
    shipped = ftwatch_config().watch.actuator.kubernetes
    lines: list[str] = []
    with FakeKubeApi() as api:
        for n in range(4):
            api.add_node(f"node-{n}")
        for prefix, plural in (("kubeflow.org/v1", "pytorchjobs"), ("trainer.kubeflow.org/v1alpha1", "trainjobs"),
                               ("jobset.x-k8s.io/v1alpha2", "jobsets"), ("batch/v1", "jobs")):
            api.add_object(prefix, "train", plural, "llm", {})
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        for kind in ("pytorchjob", "trainjob", "jobset", "job"):
            act = KubernetesActuator(shipped.model_copy(update={"kubeconfig": kubeconfig, "kind": kind}),
                                     clock=FakeClock(), sleep=lambda s: None, log=lines.append)
            for action, node in ((Action.ISOLATE_NODE, f"node-{len(lines) % 2}"), (Action.RESTART_INSTANCE, None),
                                 (Action.RESTART_JOB, None), (Action.FAIL_JOB, None)):
                api.add_pod("train", "llm-worker-0", {shipped.selectors[kind]: "llm"})
                target = Target("train/llm", "llm-worker-0" if action is Action.RESTART_INSTANCE else None, None, node)
                result = act.act(Decision(1_795_219_200.0, action, target, None, "test", 0, 3))
                assert result.status == "done", result.output
            for node in ("node-0", "node-1"):
                assert act.readmit(node).status == "done"
    return {_rbac(line) for line in lines}


def _rbac(line: str) -> tuple[str, str, str]:
    """``patch nodes/node-1 (...)`` -> ("", "nodes", "patch"); ``pytorchjobs.kubeflow.org`` -> group."""
    verb, rest = line.split(" ", 1)
    resource = rest.split("/", 1)[0].split(" ", 1)[0]
    name, _, group = resource.partition(".")
    return (group, name, verb)


def test_rbac_grants_exactly_what_the_actuator_calls(tmp_path):
    """Least privilege: the ClusterRoles bound to the Deployment's ServiceAccount grant every verb
    the actuator uses on every resource (no 403 as shipped), and nothing it does not use."""
    dep = _objects("Deployment")[0]
    account = dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert any(sa["metadata"]["name"] == account for sa in _objects("ServiceAccount"))
    needed = _needed(tmp_path)
    assert ("", "nodes", "patch") in needed and ("", "pods", "delete") in needed
    assert ("kubeflow.org", "pytorchjobs", "patch") in needed
    granted = _granted(account, dep["metadata"]["namespace"])
    assert needed - granted == set()
    unused = granted - needed
    # `get` on pods and the job objects: read by `kubectl auth can-i` style checks and kept for
    # a person's debugging; nothing else beyond what is called
    assert {v for _, _, v in unused} <= {"get"}, unused


def test_forward_is_authenticated_and_encrypted_on_both_sides():
    """fluent-bit sends the shared key from the Secret ftwatch mounts and verifies ftwatch's
    certificate against its CA for the Service's name; ftwatch reads the key and the cert from
    that Secret."""
    listener = next(s for s in ftwatch_config().watch.sources if s.type == "forward")
    dep = _objects("Deployment")[0]["spec"]["template"]["spec"]
    secret = next(v["secret"]["secretName"] for v in dep["volumes"] if "secret" in v)
    mount = next(m["mountPath"] for m in dep["containers"][0]["volumeMounts"] if m["name"] == "secret")
    assert str(listener.shared_key_file) == f"{mount}/shared_key"
    assert str(listener.tls_cert) == f"{mount}/tls.crt" and str(listener.tls_key) == f"{mount}/tls.key"
    out = forward_outputs(daemonset_fluent_bit())[0]
    ds = _objects("DaemonSet")[0]["spec"]["template"]["spec"]
    env = {e["name"]: e for e in ds["containers"][0]["env"]}
    assert out["shared_key"] == "${FTWATCH_SHARED_KEY}"
    assert env["FTWATCH_SHARED_KEY"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "shared_key"}
    assert out["tls"] == "on" or out["tls"] is True
    assert out["tls.verify"] == "on" or out["tls.verify"] is True
    assert out["tls.vhost"] == out["host"]
    tls = next(v for v in ds["volumes"] if v["name"] == "tls")["secret"]
    assert tls["secretName"] == secret and tls["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # no tls.key
    tls_mount = next(m["mountPath"] for m in ds["containers"][0]["volumeMounts"] if m["name"] == "tls")
    assert out["tls.ca_file"] == f"{tls_mount}/ca.crt"


def test_network_policy_admits_only_fluent_bit_to_the_listener():
    (policy,) = _objects("NetworkPolicy")
    dep = _objects("Deployment")[0]
    assert policy["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    rule, sdk_rule = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    fluent_bit = _objects("DaemonSet")[0]
    assert peer["podSelector"]["matchLabels"] == fluent_bit["spec"]["template"]["metadata"]["labels"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name":
                                                        fluent_bit["metadata"]["namespace"]}
    assert rule["ports"] == [{"port": 24224, "protocol": "TCP"}]
    monitor = ftwatch_config().watch.monitor        # the SDK endpoint: any pod, each job's token
    assert monitor.enabled and sdk_rule == {"from": [{"namespaceSelector": {}}],
                                            "ports": [{"port": monitor.port, "protocol": "TCP"}]}
    dep = _objects("Deployment")[0]["spec"]["template"]["spec"]
    mount = next(m["mountPath"] for m in dep["containers"][0]["volumeMounts"] if m["name"] == "secret")
    assert str(monitor.secret_file) == f"{mount}/monitor_secret"
    assert (str(monitor.tls_cert), str(monitor.tls_key)) == (f"{mount}/tls.crt", f"{mount}/tls.key")   # HTTPS
    service = _objects("Service")[0]
    assert {"name": "monitor", "port": monitor.port, "targetPort": "monitor", "protocol": "TCP"} in \
        service["spec"]["ports"]


def test_deployment_acts_through_kubernetes_as_its_own_account_with_state_on_a_volume():
    config = ftwatch_config()
    assert config.watch.actuator.type == "kubernetes"
    kube = config.watch.actuator.kubernetes
    assert kube.kubeconfig is None                     # in-cluster: the pod's ServiceAccount
    assert kube.breaker.max_share == 0.5 and kube.breaker.window == 300
    dep = _objects("Deployment")[0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in dep["volumes"]}
    state = next(m for m in dep["containers"][0]["volumeMounts"] if m["mountPath"] == str(config.storage.state_dir))
    claim = volumes[state["name"]]["persistentVolumeClaim"]["claimName"]
    assert any(p["metadata"]["name"] == claim for p in _objects("PersistentVolumeClaim"))
    assert dep["securityContext"]["fsGroup"] == dep["securityContext"]["runAsUser"]
    assert "act.sh" not in (DEPLOY / "ftwatch" / "ftwatch.yaml").read_text()


def test_image_is_built_from_this_checkout_with_the_projects_version():
    import tomllib
    version = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["version"]
    image = _objects("Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ftwatch:{version}"
    dockerfile = (DEPLOY / "ftwatch" / "Dockerfile").read_text()
    assert f"-t {image} ." in dockerfile and "pip install" in dockerfile


def test_the_deployment_tells_phases_from_log_lines():
    assert ftwatch_config().phases.enabled
