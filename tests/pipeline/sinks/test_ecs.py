"""ECS documents (ecs.py), the index template / ILM policy (essetup.py) and ``ftwatch es setup``."""

from __future__ import annotations

import pytest

from ftwatch.alerting.notify import DeliveryResult
from ftwatch.cli import main
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.sinks.elasticsearch import ecs, setup as essetup

T0 = 1_795_219_200.0
KINDS_ECS = {"alert", "asset", "enrichment", "event", "metric", "state", "pipeline_error"}
CATEGORIES = {"host", "process"}
OUTCOMES = {"success", "failure", "unknown"}


def finding(**fields) -> Finding:
    return Finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, Severity.CRITICAL,
                   Origin("pod-3", 3, "job-b", "gpu-node-7", "stdout", "forward"), "NVRM: Xid 79", T0,
                   seq=4, evidence=("x", "y"), fields=fields)


def all_docs() -> list[ecs.Doc]:
    f = finding()
    d = Decision(T0 + 1, Action.ISOLATE_NODE, Target("job-b", "pod-3", 3, "gpu-node-7"), f, "hardware", 1, 0, (f,))
    result = DeliveryResult("ops", f"{d.decision_id}-ops", "failed", 4, error="HTTP 500", decision_id=d.decision_id)
    return [ecs.event_doc(T0, "job-b", "instance_exit", "pod-3", 3, {"returncode": 1, "signal": None}),
            ecs.run_end_doc("job-b", 0, T0 + 2, "failed"), ecs.finding_doc(f, 0), ecs.decision_doc(d),
            ecs.delivery_doc(result, time=T0 + 3, job="job-b"),
            ecs.output_doc("job-b", "pod-3", 3, T0, 5.0, 12, 900, writer="w", n=0)]


@pytest.mark.parametrize("doc", all_docs(), ids=lambda d: d.kind)
def test_every_document_has_the_ecs_core_fields(doc):
    s = doc.source
    assert s["@timestamp"].endswith("+00:00") and s["message"]
    assert s["event"]["kind"] in KINDS_ECS and set(s["event"]["category"]) <= CATEGORIES
    assert s["event"]["outcome"] in OUTCOMES and s["event"]["action"]
    assert s["event"]["dataset"] == f"ftwatch.{doc.kind}" and s["event"]["module"] == "ftwatch"
    assert s["host"]["name"] and s["log"]["level"] in {"info", "warning", "error", "critical"}
    assert s["labels"]["job"] == "job-b" and s["ftwatch"]
    assert doc.kind in ecs.KINDS


def test_values_that_matter_to_the_dashboards():
    event, run_end, f, d, alert, output = all_docs()
    assert (event.source["event"]["outcome"], event.source["error"]["message"]) == (
        "failure", "instance_exit rank 3 (returncode 1, signal None)")
    assert run_end.source["event"]["action"] == "job_end" and run_end.source["event"]["outcome"] == "failure"
    assert f.source["event"]["kind"] == "alert" and f.source["rule"]["id"] == "xid.79"
    assert f.source["host"]["name"] == "gpu-node-7" and f.source["error"]["stack_trace"] == "x\ny"
    assert d.id == d.source["event"]["id"] and d.source["event"]["category"] == ["process", "host"]
    assert d.source["ftwatch"]["target"]["node"] == "gpu-node-7"
    assert d.source["ftwatch"]["root_cause"]["failure_class"] == "hardware_node"
    assert alert.source["event"]["outcome"] == "failure" and alert.source["error"]["message"] == "HTTP 500"
    assert output.source["event"]["kind"] == "metric" and output.source["ftwatch"]["lines"] == 12
    assert all(doc.source["ftwatch"]["epoch"] in (T0, T0 + 1, T0 + 2, T0 + 3) for doc in all_docs())


def test_ids_are_stable_and_tell_different_documents_apart():
    assert [d.id for d in all_docs()] == [d.id for d in all_docs()]
    a = ecs.event_doc(T0, "j", "instance_start", "w-0", 0, {"pid": 1})
    b = ecs.event_doc(T0, "j", "instance_start", "w-0", 0, {"pid": 2})
    assert a.id != b.id and len({d.id for d in all_docs()}) == 6


def test_dotted_kubernetes_labels_are_dedotted_and_kept_verbatim():
    """``app.kubernetes.io/name`` beside ``app``: no object/keyword clash in ``labels``."""
    labels = {"app.kubernetes.io/name": "trainer", "app": "demo", "team": "ml"}
    doc = ecs.finding_doc(finding(kubernetes={"labels": {"training.kubeflow.org/replica-index": "3"}}),
                          labels=labels).source
    assert doc["labels"] == {"app_kubernetes_io/name": "trainer", "app": "demo", "team": "ml",
                             "training_kubeflow_org/replica-index": "3", "job": "job-b"}
    assert not any("." in key for key in doc["labels"])
    assert doc["ftwatch"]["labels"]["app.kubernetes.io/name"] == "trainer"
    mapping = essetup.mappings()["properties"]
    assert mapping["ftwatch"]["properties"]["labels"]["type"] == "flattened"
    assert mapping["ftwatch"]["properties"]["fields"]["type"] == "flattened"


def test_dedot_keeps_the_first_of_colliding_keys():
    assert ecs.dedot({"a_b": "plain", "a.b": "dotted", "n": 3, "none": None}) == {"a_b": "plain", "n": "3"}


def test_every_field_the_documents_use_is_mapped():
    """With ``dynamic: false`` an unmapped field would not be searchable: map them all."""
    props = essetup.mappings()["properties"]

    def mapped(path: list[str], where=props) -> bool:
        head, rest = path[0], path[1:]
        if head not in where:
            return False
        node = where[head]
        if not rest or node.get("type") in ("flattened",) or head == "labels":
            return True
        return mapped(rest, node.get("properties", {}))

    def leaves(value, prefix=()):
        if isinstance(value, dict) and value:
            for key, sub in value.items():
                yield from leaves(sub, prefix + (key,))
        else:
            yield list(prefix)

    missing = {".".join(p) for d in all_docs() for p in leaves(d.source) if not mapped(p)}
    assert missing == set()


def test_template_and_policy_shape():
    policy = essetup.ilm_policy("1d", "30d")
    assert policy["phases"]["hot"]["actions"]["rollover"]["max_age"] == "1d"
    assert policy["phases"]["delete"]["min_age"] == "30d"
    assert essetup.data_streams("ftw") == ["ftw-events", "ftw-findings", "ftw-decisions", "ftw-alerts",
                                           "ftw-output"]


def test_es_setup_installs_policy_and_templates(fake_es, capsys):
    assert main(["es", "setup", "--url", fake_es.url]) == 0
    puts = fake_es.puts
    assert set(puts) == {"/_ilm/policy/ftwatch", "/_component_template/ftwatch-settings",
                         "/_component_template/ftwatch-mappings", "/_index_template/ftwatch"}
    template = puts["/_index_template/ftwatch"]
    assert template["index_patterns"] == ["ftwatch-*"] and template["data_stream"] == {}
    assert template["composed_of"] == ["ftwatch-settings", "ftwatch-mappings"] and template["priority"] == 200
    assert puts["/_component_template/ftwatch-settings"]["template"]["settings"]["index.lifecycle.name"] == "ftwatch"
    assert puts["/_ilm/policy/ftwatch"]["policy"]["phases"]["delete"]["min_age"] == "90d"
    assert all(r["headers"]["accept"].endswith("compatible-with=8") for r in fake_es.requests)
    assert "ftwatch-decisions" in capsys.readouterr().out


def test_es_setup_without_a_cluster_says_so(capsys):
    assert main(["es", "setup", "--url", "http://127.0.0.1:9"]) == 1
    assert "Elasticsearch at http://127.0.0.1:9" in capsys.readouterr().err


def test_es_setup_without_elasticsearch_config_is_a_config_error(capsys):
    assert main(["es", "setup"]) == 2
    assert "storage.elasticsearch is not set" in capsys.readouterr().err
