"""The event type of an alert (SPEC N3's vocabulary), for Alertmanager's ``alertname`` and the
templates' ``event_type``.

Derived from the alert's action, its root cause and its labels, so that it works on any
:class:`~ftwatch.alerting.alerts.Alert` (spooled ones included). Where the alert carries an
explicit ``event_type`` (a field or a label), that wins.

=================  ==================================================================
``custom_message`` a message from the training code (label ``event: custom_message``)
``job_hang``       a restart (any scope) whose root cause is a hang or an exit hang
``job_restart``    ``restart_instance``, ``restart_in_place``, ``restart_job``
``node_isolated``  ``isolate_node``
``job_failed``     ``fail_job``
``job_notify``     ``notify`` (a person is asked to look), ``none``
=================  ==================================================================
"""

from __future__ import annotations

from typing import Any

EVENT_TYPES = ("job_restart", "job_hang", "node_isolated", "job_failed", "custom_message",
               "job_notify")

RESOLVABLE = frozenset({"job_restart", "job_hang", "node_isolated"})
"""Event types about an incident the job can get over (it runs on); these alerts resolve
(see ``ftwatch.pipeline.recorder.Recorder.resolve_open``). ``job_failed`` and the
notifications never resolve by themselves."""

_BY_ACTION = {"restart_instance": "job_restart", "restart_in_place": "job_restart",
              "restart_job": "job_restart", "isolate_node": "node_isolated",
              "fail_job": "job_failed", "notify": "job_notify", "none": "job_notify"}


def event_type_of(alert: Any) -> str:
    """The event type of ``alert`` (one of :data:`EVENT_TYPES`).

    Args:
        alert: an ``Alert`` (``labels``, ``decision`` with ``action`` and ``root_cause``).
    """
    explicit = getattr(alert, "event_type", None) or alert.labels.get("event_type")
    if explicit:
        return str(explicit)
    if alert.labels.get("event") == "custom_message":
        return "custom_message"
    decision = alert.decision
    label = decision.action.label
    kind = _BY_ACTION.get(label, "job_notify")
    rc = decision.root_cause
    if kind == "job_restart" and rc is not None and (
            rc.failure_class.value == "hang" or rc.kind in ("hang", "exit_hang")):
        return "job_hang"
    return kind
