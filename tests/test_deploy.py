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
        assert ("shared_key" in out) == (listener.shared_key is not None)
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
