"""A notification for one receiver, from an alert or a group's batch of alerts: its text, title
and idempotency id (the notify stage's render step, ``ftwatch.alerting.notify``).

The text comes from the receiver kind's template (:class:`~ftwatch.alerting.rendering.TemplateRenderer`);
a broken user template falls back to the built-in one (logged), so a template mistake never
loses an alert. The title is the text's first line. The id is
:func:`~ftwatch.alerting.alerts.notification_id` (decision id + receiver + status), a batch's
``grp<hash of the alert keys>-<receiver>``, a repeat's with ``~repeat<n>``: the same content
sent again carries the same id, which the spool and the receivers' idempotency keys rely on.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import Sequence

from ftwatch.alerting.alerts import Alert, Notification, notification_id
from ftwatch.alerting.notifiers import Notifier
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.errors import TemplateError

log = logging.getLogger(__name__)

_RANK = {"critical": 0, "warning": 1, "info": 2}


def compose(notifier: Notifier, renderer: TemplateRenderer, alert: Alert) -> Notification:
    """``alert`` rendered for one receiver (``notifier``: its name and kind)."""
    try:
        text = renderer.render(notifier.kind, alert)
    except TemplateError as exc:
        log.error("alert template for receiver %r failed, using the built-in one: %s",
                  notifier.name, exc)
        text = renderer.render(notifier.kind, alert, builtin_only=True)
    title = text.splitlines()[0] if text else alert.annotations.get("summary", "")
    nid = notification_id(alert.decision_id, notifier.name, alert.status)
    return Notification(notifier.name, alert, title, text, nid)


def compose_batch(notifier: Notifier, renderer: TemplateRenderer, alerts: Sequence[Alert],
                  group_key: str = "", repeat: int = 0, language: str = "en") -> Notification:
    """One notification for a batch of alerts of one group: a batch of one is exactly
    :func:`compose`'s; several join their texts (most severe, then oldest, first) under one
    title, with id ``grp<hash of the alert keys>-<receiver>``; a repeat adds ``~repeat<n>``.

    Args:
        notifier: the receiver.
        renderer: renders each alert's text.
        alerts: at least one alert.
        group_key: the group's key (``route.routes.0{job=a}``), named in the title.
        repeat: 0 for a first notification, n for the n-th repeat of the same content.
        language: ``en`` or ``zh``: the title of a batch of several.
    """
    suffix = f"~repeat{repeat}" if repeat else ""
    if len(alerts) == 1:
        n = compose(notifier, renderer, alerts[0])
        return replace(n, id=n.id + suffix) if suffix else n
    alerts = sorted(alerts, key=lambda a: (_RANK.get(a.severity, 3), a.starts_at))
    parts = [compose(notifier, renderer, a) for a in alerts]
    ids = ",".join(sorted(a.key for a in alerts))
    digest = hashlib.sha1(ids.encode()).hexdigest()[:16]
    group = group_key[group_key.find("{"):]
    title = (f"【ftwatch】{len(alerts)} 条告警 {group}" if language == "zh"
             else f"[ftwatch] {len(alerts)} alerts {group}")
    body = title + "\n\n" + "\n\n---\n\n".join(p.body for p in parts)
    first = alerts[0]
    annotations = {**first.annotations, "group_key": group_key, "grouped_alerts": ids}
    nid = notification_id(f"grp{digest}", notifier.name, first.status) + suffix
    return Notification(notifier.name, replace(first, annotations=annotations), title, body, nid)
