"""What ftwatch writes to Elasticsearch: one ECS document per event, finding, decision, alert and
output bucket.

Pure functions, no I/O (the sink in ``elasticsearch.py`` sends them). Field names follow the
Elastic Common Schema (ECS 8/9: ``@timestamp``, ``message``, ``event.*``, ``host.name``,
``log.level``, ``error.*``, ``rule.*``, ``labels``); everything ftwatch-specific lives under
``ftwatch.*``. Allowed ``event.kind`` / ``event.category`` / ``event.type`` / ``event.outcome``
values are ECS's (research/ecosystem-anchors.md section 5.4): findings are ``event.kind: alert``
(a detection made outside Kibana; ``signal`` is reserved for Kibana), output counts are
``event.kind: metric``, everything else is ``event``.

Exact times: ``@timestamp`` has milliseconds (Elasticsearch's ``date``); ``ftwatch.epoch`` keeps
the time as the store has it (epoch seconds, a double), so ``ftwatch report`` reads back from
Elasticsearch exactly what the SQLite store holds (``ecsread`` inverts these documents).

Each document goes to the data stream ``<prefix>-<kind>`` (``kind`` one of :data:`KINDS`) under
a stable ``_id`` (a hash of what makes it unique, or the decision id): written with the bulk
``create`` op, a document sent twice is refused the second time with 409, so a retry after a lost
acknowledgement never doubles it.

Labels: ECS ``labels`` is a flat map of keywords. Kubernetes label keys carry dots
(``app.kubernetes.io/name``) which Elasticsearch reads as object paths, so that label and a plain
``app`` label would clash (``labels.app`` cannot be a keyword and an object at once). Keys are
therefore *de-dotted* in ``labels`` (``.`` -> ``_``: ``labels.app_kubernetes_io/name``), as
Filebeat and fluent-bit do, and kept verbatim in ``ftwatch.labels``, a ``flattened`` field (one
mapping for the whole map; keys are never turned into sub-fields).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from ftwatch.events import Action, Decision, Finding, Severity, iso

KINDS = ("events", "findings", "decisions", "alerts", "output")
"""The document kinds, one data stream each."""

DATASET = "ftwatch"

_LEVEL = {Severity.INFO: "info", Severity.WARNING: "warning", Severity.ERROR: "error",
          Severity.CRITICAL: "critical"}
_EVENT_TYPE = {"job_start": "start", "instance_start": "start", "instance_exit": "end",
               "job_end": "end", "job_restart": "change", "actuator": "change"}
_DELIVERY_OUTCOME = {"delivered": "success", "failed": "failure", "spooled": "unknown"}
_RUN_OUTCOME = {"succeeded": "success", "failed": "failure"}


@dataclass(frozen=True)
class Doc:
    """One document to index.

    Attributes:
        kind: one of :data:`KINDS` (the data stream is ``<prefix>-<kind>``).
        id: the stable ``_id``.
        source: the ECS document (JSON-ready).
    """

    kind: str
    id: str
    source: dict[str, Any]


def dedot(labels: Mapping[str, Any]) -> dict[str, str]:
    """Label keys with ``.`` replaced by ``_``, values as strings (None dropped).

    A de-dotted key that collides with an existing one keeps the first value seen (a plain
    ``a_b`` given before ``a.b`` wins); the verbatim map is in ``ftwatch.labels`` anyway.
    """
    out: dict[str, str] = {}
    for key, value in labels.items():
        if value is None:
            continue
        out.setdefault(str(key).replace(".", "_"), value if isinstance(value, str) else json.dumps(value))
    return out


def stable_id(*parts: Any) -> str:
    """A 20-hex-digit id from ``parts`` (JSON-encoded, so the same values give the same id)."""
    raw = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(raw.encode()).hexdigest()[:20]


def _labels(job: str, static: Mapping[str, Any], extra: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """(ECS ``labels``, verbatim ``ftwatch.labels``) from the static labels and any k8s labels."""
    raw: dict[str, Any] = dict(static)
    if isinstance(extra, Mapping):
        raw.update({str(k): v for k, v in extra.items()})
    return {**dedot(raw), "job": job}, raw


def _k8s_labels(values: Mapping[str, Any]) -> Any:
    """Pod labels carried in a finding's fields or an event's detail (``labels`` or
    ``kubernetes.labels``), else None."""
    if isinstance(values.get("labels"), Mapping):
        return values["labels"]
    kube = values.get("kubernetes")
    return kube.get("labels") if isinstance(kube, Mapping) else None


def _base(time: float, kind: str, event: dict[str, Any], host: str, level: str, message: str,
          labels: tuple[dict[str, str], dict[str, Any]], ftwatch: dict[str, Any]) -> dict[str, Any]:
    ecs, raw = labels
    doc = {
        "@timestamp": iso(time),
        "message": message,
        "event": {"module": DATASET, "dataset": f"{DATASET}.{kind}", **event},
        "host": {"name": host},
        "log": {"level": level},
        "labels": ecs,
        "ftwatch": {**ftwatch, "epoch": time, **({"labels": raw} if raw else {})},
    }
    return doc


def event_doc(time: float, job: str, kind: str, instance: str | None = None, rank: int | None = None,
              detail: Mapping[str, Any] | None = None, *, host: str = "localhost",
              labels: Mapping[str, Any] | None = None) -> Doc:
    """A lifecycle event (``job_start``, ``instance_start``, ``instance_exit``, ``job_restart``,
    ``custom_message``, ``actuator`` ...; ``time`` in epoch seconds) -> ``events`` document.

    ``instance_exit`` has ``event.outcome`` success (exit 0), failure (non-zero or a signal not
    sent by ftwatch) or unknown (stopped by ftwatch); other kinds are ``unknown``.
    """
    detail = dict(detail or {})
    outcome, level = "unknown", "info"
    if kind == "instance_exit":
        if detail.get("stopped_by_us"):
            outcome = "unknown"
        elif detail.get("returncode") == 0 and not detail.get("signal"):
            outcome = "success"
        else:
            outcome, level = "failure", "error"
    who = f"rank {rank}" if rank is not None else (instance or job)
    message = f"{kind} {who}"
    if "content" in detail:
        message += f": {detail['content']}"
    elif kind == "new_signature":
        message += f": {detail.get('template', '')}"
    elif kind == "instance_exit":
        message += f" (returncode {detail.get('returncode')}, signal {detail.get('signal')})"
    ftw: dict[str, Any] = {"job": job, "instance": instance, "rank": rank, "kind": kind, "detail": detail}
    if isinstance(detail.get("attempt"), int):
        ftw["attempt"] = detail["attempt"]
    event = {"kind": "event", "category": ["process"], "type": [_EVENT_TYPE.get(kind, "info")],
             "action": kind, "outcome": outcome}
    if kind == "new_signature":          # the template, aggregatable (Kibana "new failure signatures")
        event["reason"] = str(detail.get("template", ""))[:1024]
    doc_id = stable_id("event", time, job, kind, instance, rank, detail)
    source = _base(time, "events", event, host, level, message,
                   _labels(job, labels or {}, _k8s_labels(detail)), ftw)
    if outcome == "failure":
        source["error"] = {"message": message}
    return Doc("events", doc_id, source)


def run_end_doc(job: str, attempt: int, time: float, status: str, *, host: str = "localhost",
                labels: Mapping[str, Any] | None = None) -> Doc:
    """How an attempt ended (``succeeded``, ``failed``, ``restarted``, ``stopped``) -> a ``job_end``
    event (outcome success / failure / unknown)."""
    outcome = _RUN_OUTCOME.get(status, "unknown")
    event = {"kind": "event", "category": ["process"], "type": ["end"], "action": "job_end",
             "outcome": outcome}
    source = _base(time, "events", event, host, "error" if outcome == "failure" else "info",
                   f"job {job} attempt {attempt} {status}", _labels(job, labels or {}, None),
                   {"job": job, "attempt": attempt, "kind": "job_end", "status": status})
    return Doc("events", stable_id("run_end", job, attempt, time, status), source)


def finding_doc(f: Finding, attempt: int = 0, *, labels: Mapping[str, Any] | None = None) -> Doc:
    """A finding -> ``findings`` document (``event.kind: alert``, ``rule.*``, the line as
    ``error.message``, the evidence as ``error.stack_trace``)."""
    o = f.origin
    event = {"kind": "alert", "category": ["process"],
             "type": ["info" if f.severity is Severity.INFO else "error"], "action": f.rule_id,
             "outcome": "failure", "severity": int(f.severity), "reason": f.failure_class.value}
    ftw = {"job": o.job, "attempt": attempt, "instance": o.instance, "rank": o.rank, "node": o.node,
           "stream": o.stream, "rule_id": f.rule_id, "kind": f.kind,
           "failure_class": f.failure_class.value, "action": f.action.label,
           "severity": f.severity.name.lower(), "line": f.line, "seq": f.seq, "source": f.source,
           "fields": dict(f.fields)}
    who = f"rank {o.rank}" if o.rank is not None else o.instance
    source = _base(f.time, "findings", event, o.node, _LEVEL[f.severity],
                   f"[{f.failure_class.value}] {f.rule_id} on {who}: {f.line}",
                   _labels(o.job, labels or {}, {**dict(o.labels), **(_k8s_labels(f.fields) or {})}), ftw)
    source["rule"] = {"id": f.rule_id, "category": f.failure_class.value, "ruleset": DATASET}
    source["error"] = {"message": f.line, "type": f.failure_class.value}
    if f.evidence:
        source["error"]["stack_trace"] = "\n".join(f.evidence)
    doc_id = stable_id("finding", o.job, attempt, f.rule_id, o.instance, o.rank, f.time, f.seq, f.line)
    return Doc("findings", doc_id, source)


def decision_doc(d: Decision, *, host: str = "localhost", labels: Mapping[str, Any] | None = None) -> Doc:
    """A decision -> ``decisions`` document under its ``decision_id``.

    ``event.action`` is the action label (``restart_job``, ``isolate_node`` ...), ``event.reason``
    the policy clause; ``event.outcome`` is success for ``none``, failure for ``fail_job``, else
    unknown (the job goes on). Node isolation adds ``host`` to ``event.category``.
    """
    t, rc = d.target, d.root_cause
    category = ["process", "host"] if d.action is Action.ISOLATE_NODE else ["process"]
    outcome = {Action.NONE: "success", Action.FAIL_JOB: "failure"}.get(d.action, "unknown")
    level = {Action.NONE: "info", Action.NOTIFY: "warning", Action.ISOLATE_NODE: "error",
             Action.FAIL_JOB: "error"}.get(d.action, "warning")
    event = {"kind": "event", "category": category,
             "type": ["info" if d.action is Action.NONE else "change"], "action": d.action.label,
             "outcome": outcome, "reason": d.policy_clause, "id": d.decision_id}
    ftw: dict[str, Any] = {
        "job": t.job, "attempt": d.attempt, "decision_id": d.decision_id, "action": d.action.label,
        "policy_clause": d.policy_clause, "restarts_used": d.restarts_used,
        "restarts_left": d.restarts_left, "findings_count": len(d.findings),
        "target": {"job": t.job, "instance": t.instance, "rank": t.rank, "node": t.node}}
    message = f"decision {d.action.label}" + (f" -> {t.instance}" if t.instance else "")
    if rc is not None:
        ro = rc.origin
        ftw["root_cause"] = {"rule_id": rc.rule_id, "failure_class": rc.failure_class.value,
                             "instance": ro.instance, "rank": ro.rank, "node": ro.node, "line": rc.line}
        message += f": [{rc.failure_class.value}] {rc.rule_id}"
    node = t.node or (rc.origin.node if rc is not None else None) or host
    source = _base(d.time, "decisions", event, node, level, message, _labels(t.job, labels or {}, None), ftw)
    if rc is not None:
        source["error"] = {"message": rc.line, "type": rc.failure_class.value}
        source["rule"] = {"id": rc.rule_id, "category": rc.failure_class.value, "ruleset": DATASET}
    return Doc("decisions", d.decision_id, source)


def delivery_doc(result: Any, text: Any = None, *, time: float, job: str = "", host: str = "localhost",
                 labels: Mapping[str, Any] | None = None) -> Doc:
    """What became of one notification (a ``DeliveryResult``: ``notification_id``, ``receiver``,
    ``status``, ``attempts``, ``error``, ``decision_id``, ``text``, ``time``) -> ``alerts``
    document with ``event.action: notify`` (outcome success / failure / unknown for delivered /
    failed / spooled). ``time`` is used when the result carries none."""
    if not isinstance(text, str):
        text = getattr(result, "text", "") or ""
    when = getattr(result, "time", 0.0) or time
    status = str(result.status)
    decision_id = getattr(result, "decision_id", "") or str(result.notification_id).split("-")[0]
    outcome = _DELIVERY_OUTCOME.get(status, "unknown")
    event = {"kind": "event", "category": ["process"], "type": ["info"], "action": "notify",
             "outcome": outcome}
    ftw = {"job": job or None, "notification_id": result.notification_id, "decision_id": decision_id,
           "receiver": result.receiver, "status": status, "attempts": int(result.attempts),
           "text": text}
    level = {"success": "info", "failure": "error"}.get(outcome, "warning")
    source = _base(when, "alerts", event, host, level,
                   f"alert {result.notification_id} to {result.receiver}: {status}",
                   _labels(job, labels or {}, None), ftw)
    if result.error:
        source["error"] = {"message": str(result.error)}
    doc_id = stable_id("alert", result.notification_id, result.receiver, status, int(result.attempts), when)
    return Doc("alerts", doc_id, source)


def output_doc(job: str, instance: str, rank: int | None, bucket: float, seconds: float, lines: int,
               nbytes: int, *, writer: str, n: int, host: str = "localhost",
               labels: Mapping[str, Any] | None = None, pod_labels: Mapping[str, Any] | None = None) -> Doc:
    """One output bucket (a store ``output`` row: ``lines`` lines of ``nbytes`` bytes read from
    ``instance`` in the ``seconds`` long bucket starting at ``bucket``, epoch s) -> ``output``
    document (``event.kind: metric``, ``@timestamp`` the bucket's start).

    The same bucket may be written more than once (a late chunk reopens it; the SQLite store adds
    the counts up), so the ``_id`` is not the bucket's: it is made from ``writer`` (one per sink
    instance) and ``n`` (that sink's count of output documents), and readers sum the documents
    of a bucket. A retry still sends the same ``_id`` (it is journaled with the document).
    ``host`` is the instance's node when known; ``pod_labels`` its pod's labels (``Origin.labels``).
    """
    event = {"kind": "metric", "category": ["process"], "type": ["info"], "action": "output",
             "outcome": "unknown"}
    who = f"rank {rank}" if rank is not None else instance
    ftw = {"job": job, "instance": instance, "rank": rank, "kind": "output", "seconds": seconds,
           "lines": lines, "bytes": nbytes}
    source = _base(bucket, "output", event, host, "info",
                   f"output {who}: {lines} lines, {nbytes} bytes in {seconds:g} s",
                   _labels(job, labels or {}, pod_labels), ftw)
    return Doc("output", stable_id("output", writer, n, job, instance, bucket), source)
