"""The Prometheus Alertmanager receiver (SPEC N2): ``POST <url>/api/v2/alerts``.

Source: Alertmanager's API v2 (``api/v2/openapi.yaml``, operation ``postAlerts``,
https://github.com/prometheus/alertmanager/blob/main/api/v2/openapi.yaml) and "Clients"
(https://prometheus.io/docs/alerting/latest/clients/). The body is a JSON list of
``postableAlert``; ftwatch sends one per notification::

    [{"labels": {...}, "annotations": {...}, "startsAt": RFC 3339,
      "endsAt": RFC 3339 (see below), "generatorURL": "http(s)://..." (only when known)}]

Labels (they are the alert's identity in Alertmanager; empty values are left out):
``alertname`` = the event type (``job_restart``, ``job_hang``, ``node_isolated``,
``job_failed``, ``custom_message``, ``notice``; ``ftwatch.alerting.alerts.event_type_of``), ``job``,
``severity``, ``action``, ``instance``, ``node``, ``rank``, ``failure_class``, ``rule_id``, plus
the receiver's static ``labels`` (they win). Decision ids are not labels (they would make every
restart of one job a different alert); they are in the annotations.

Annotations: ``summary`` (the ``alertmanager`` template's first line), ``description`` (the
rest: job, action, root-cause line with instance and time, budgets, link), ``root_cause``
(``<line> (instance I, rank R, node N, at T)``), ``explain`` (the ``ftwatch explain`` command or
report URL), ``decision_id``, ``restarts_left``, ``event_type``.

Resolution. An alert is resolved when ``endsAt`` is in the past (Alertmanager marks it resolved
and, with ``send_resolved``, tells its receivers). ftwatch sends it:

* for a resolved alert (``status == "resolved"``, from ``Recorder.resolve_open``): the same
  labels with ``endsAt`` = the resolution time;
* for a firing ``job_restart`` / ``job_hang`` / ``node_isolated`` alert: ``endsAt`` =
  ``startsAt + resolve_after``, so Alertmanager resolves it by itself if ftwatch sends nothing
  more (a new incident of the same job sends the alert again and pushes ``endsAt`` on);
* for ``job_failed``, ``custom_message``, ``notice``: no ``endsAt``; Alertmanager then
  resolves it after its own ``resolve_timeout`` (default 5 minutes) since nothing resends it.

Answers: 200 accepted; 400 (invalid alert) is not retryable; 5xx, 408, 429 and connection
errors are retryable (the generic webhook's rules).
"""

from __future__ import annotations

from typing import Any, Mapping

import httpx

from ftwatch.alerting.alerts import Alert, Notification
from ftwatch.alerting.alerts import RESOLVABLE
from ftwatch.alerting.notifiers.webhook import WebhookNotifier
from ftwatch.config.routes import parse_duration
from ftwatch.events import iso

_LABEL_KEYS = ("job", "severity", "action", "instance", "node", "rank", "failure_class", "rule_id")

DEFAULT_RESOLVE_AFTER = 300.0
"""Seconds; the config's default ``resolve_after``."""


def am_labels(alert: Alert, static: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Alertmanager labels of ``alert`` (see the module docstring)."""
    labels = {"alertname": alert.event_type}
    labels.update({k: str(alert.labels[k]) for k in _LABEL_KEYS if alert.labels.get(k)})
    labels.update({k: str(v) for k, v in (static or {}).items()})
    return labels


def am_annotations(notification: Notification) -> dict[str, str]:
    """The annotations: summary and description from the rendered text, plus the details."""
    alert = notification.alert
    lines = notification.body.splitlines()
    summary = notification.title or (lines[0] if lines else alert.annotations.get("summary", ""))
    description = "\n".join(lines[1:]).strip("\n") or alert.annotations.get("description", "")
    a = alert.annotations
    root = ""
    if a.get("root_cause_line"):
        node = _root_node(alert)
        where = ", ".join(p for p in (
            f"instance {a['root_cause_instance']}" if a.get("root_cause_instance") else "",
            f"rank {a['root_cause_rank']}" if a.get("root_cause_rank") else "",
            f"node {node}" if node else "",
            f"at {a['root_cause_time']}" if a.get("root_cause_time") else "") if p)
        root = f"{a['root_cause_line']} ({where})" if where else a["root_cause_line"]
    out = {"summary": summary, "description": description, "root_cause": root,
           "explain": a.get("explain", ""), "decision_id": alert.decision_id,
           "restarts_left": str(alert.budgets.get("restarts_left", "")),
           "event_type": alert.event_type}
    return {k: v for k, v in out.items() if v}


def _root_node(alert: Alert) -> str:
    rc = alert.decision.root_cause if alert.decision is not None else None
    return (rc.origin.node or "") if rc is not None else alert.labels.get("node", "")


class AlertmanagerNotifier(WebhookNotifier):
    """Posts alerts to an Alertmanager's API v2.

    Args:
        name: the receiver's name.
        url: the Alertmanager's base URL (``http://alertmanager:9093``; a trailing
            ``/api/v2/alerts`` is accepted too).
        resolve_after: seconds; a firing restart/hang/isolate alert is sent with
            ``endsAt = startsAt + resolve_after``.
        labels: static labels added to every alert.
        timeout: seconds for connect, read and write each.
        client: an ``httpx.Client`` to use (tests).
        max_retries: retries within one dispatch (None: the sender's).
    """

    kind = "alertmanager"

    def __init__(self, name: str, url: str, resolve_after: float = DEFAULT_RESOLVE_AFTER,
                 labels: Mapping[str, str] | None = None, timeout: float = 5.0,
                 client: httpx.Client | None = None, max_retries: int | None = None):
        base = url.rstrip("/")
        if base.endswith("/api/v2/alerts"):
            base = base[: -len("/api/v2/alerts")]
        super().__init__(name, base + "/api/v2/alerts", timeout=timeout, client=client,
                         max_retries=max_retries)
        self.resolve_after = float(resolve_after)
        self.static_labels = dict(labels or {})

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> "AlertmanagerNotifier":
        """One notifier from a config entry (``name``, ``url``, ``resolve_after``, ``labels``,
        ``timeout``, ``max_retries``).

        ``resolve_after`` is seconds or a duration string (``30s``, ``5m``, ``1h``;
        ``ftwatch.config.routes.parse_duration``).

        Raises:
            KeyError: ``name`` or ``url`` is missing.
            ValueError: ``resolve_after`` is not a duration (the message names the receiver).
        """
        try:
            resolve_after = parse_duration(data.get("resolve_after", DEFAULT_RESOLVE_AFTER))
        except ValueError as exc:
            raise ValueError(f"receiver {data.get('name')!r} (alertmanager): resolve_after: {exc}") from None
        return cls(str(data["name"]), str(data["url"]), resolve_after=resolve_after,
                   labels=data.get("labels") or None, timeout=float(data.get("timeout", 5.0)),
                   max_retries=data.get("max_retries"))

    def payload(self, notification: Notification) -> list[dict[str, Any]]:  # type: ignore[override]
        """The ``postableAlert`` list (one alert)."""
        alert = notification.alert
        item: dict[str, Any] = {"labels": am_labels(alert, self.static_labels),
                                "annotations": am_annotations(notification),
                                "startsAt": iso(alert.starts_at)}
        if alert.status == "resolved" and alert.ends_at is not None:
            item["endsAt"] = iso(alert.ends_at)
        elif alert.event_type in RESOLVABLE:
            item["endsAt"] = iso(alert.starts_at + self.resolve_after)
        link = alert.annotations.get("explain", "")
        if link.startswith(("http://", "https://")):
            item["generatorURL"] = link
        return [item]
