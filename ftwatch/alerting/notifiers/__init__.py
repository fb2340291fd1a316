"""Receivers (SPEC N2): the ``Notifier`` protocol, the registry of kinds, and a builder.

A notifier has a ``name`` (the receiver's, from the config), a ``kind`` (the config's
``type:``, which also picks the template) and ``send(notification)``, which returns when the
receiver took it and raises ``NotifyError(message, retryable)`` when not. A notifier may have
a ``max_retries`` attribute (int) that the sender (``ftwatch.alerting.notify``) uses instead
of its own, a ``timeout`` (seconds per attempt; bounds how long a shutdown waits for its
delivery worker), and
``inline = True`` when ``send`` never blocks (the console): the sender then sends in the
caller's thread instead of the receiver's delivery worker.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Protocol, TextIO, runtime_checkable

from ftwatch.alerting.alerts import Notification
from ftwatch.alerting.notifiers.alertmanager import AlertmanagerNotifier
from ftwatch.alerting.notifiers.chatbot import ChatBotNotifier
from ftwatch.alerting.notifiers.console import ConsoleNotifier
from ftwatch.alerting.notifiers.dingtalk import DingTalkNotifier
from ftwatch.alerting.notifiers.email import EmailNotifier
from ftwatch.alerting.notifiers.feishu import FeishuNotifier
from ftwatch.alerting.notifiers.slack import SlackNotifier
from ftwatch.alerting.notifiers.webhook import WebhookNotifier
from ftwatch.alerting.notifiers.wecom import WeComNotifier


@runtime_checkable
class Notifier(Protocol):
    """A receiver of notifications."""

    name: str
    kind: str

    def send(self, notification: Notification) -> None:
        """Deliver one notification.

        Raises:
            NotifyError: not delivered; ``retryable`` says whether sending again may work.
        """
        ...


REGISTRY: dict[str, type] = {
    "console": ConsoleNotifier, "webhook": WebhookNotifier, "dingtalk": DingTalkNotifier,
    "feishu": FeishuNotifier, "wecom": WeComNotifier, "slack": SlackNotifier,
    "email": EmailNotifier, "alertmanager": AlertmanagerNotifier}
"""The config's receiver ``type:`` -> the notifier class."""


def build_notifiers(receivers: Iterable[Any], out: TextIO | None = None) -> list[Notifier]:
    """One notifier per receiver config.

    Args:
        receivers: pydantic models or mappings with ``type`` and ``name`` plus the kind's
            fields: console ``color`` (optional); webhook ``url``, ``headers``, ``timeout``,
            ``max_retries`` (optional); dingtalk, feishu, wecom, slack ``url``, ``secret``
            (dingtalk, feishu), ``timeout``, ``max_retries``; email and alertmanager: the
            fields of ``ftwatch.config.receivers.EmailReceiver`` / ``AlertmanagerReceiver``.
        out: the console receivers' stream (None: ``sys.stdout`` at send time); colour is
            on by default when it is a terminal.

    Returns:
        The notifiers, in config order.

    Raises:
        ValueError: an unknown ``type`` or a missing field (the message names the receiver,
            never a URL or header value).
    """
    notifiers: list[Notifier] = []
    for r in receivers:
        data = dict(r.model_dump() if hasattr(r, "model_dump") else r)
        kind, name = data.get("type"), data.get("name")
        if kind not in REGISTRY:
            raise ValueError(f"receiver {name!r}: unknown type {kind!r}; known: {', '.join(REGISTRY)}")
        try:
            if kind == "console":
                color = data.get("color")
                if color is None:
                    isatty = getattr(out if out is not None else sys.stdout, "isatty", None)
                    color = bool(isatty and isatty())
                notifiers.append(ConsoleNotifier(out, bool(color), name=str(name or "console")))
            else:
                notifiers.append(REGISTRY[kind].from_config(data))
        except KeyError as exc:
            raise ValueError(f"receiver {name!r} ({kind}): missing field {exc.args[0]!r}") from None
    return notifiers


__all__ = ["AlertmanagerNotifier", "ChatBotNotifier", "ConsoleNotifier", "DingTalkNotifier",
           "EmailNotifier", "FeishuNotifier",
           "Notification", "Notifier", "REGISTRY", "SlackNotifier", "WeComNotifier",
           "WebhookNotifier", "build_notifiers"]
