"""The WeCom (WeChat Work) group robot receiver (SPEC N2).

Message: ``{"msgtype": "markdown", "markdown": {"content"}}`` (WeCom group robot: markdown
message, at most 4096 bytes). The URL's ``key`` is the secret; WeCom does not sign.

WeCom answers HTTP 200 with ``{"errcode": 0, "errmsg": "ok"}``; any other ``errcode`` is a
failure. 45009 (API frequency limit: 20 messages a minute) is worth retrying; the rest (93000
invalid webhook URL, 40058 bad content, ...) are not.
"""

from __future__ import annotations

from typing import Any

from ftwatch.alerting.alerts import Notification
from ftwatch.alerting.notifiers.chatbot import ChatBotNotifier
from ftwatch.alerting.notifiers.webhook import truncate_utf8

RATE_LIMITED = 45009
"""WeCom's errcode for "api freq out of limit"."""

MAX_CONTENT_BYTES = 4096
"""WeCom's limit on a markdown message's content, in UTF-8 bytes."""


class WeComNotifier(ChatBotNotifier):
    """A WeCom group robot (markdown message)."""

    kind = "wecom"
    code_keys = ("errcode",)
    rate_limit_codes = frozenset({RATE_LIMITED})

    def payload(self, notification: Notification) -> dict[str, Any]:
        """The markdown message, cut to 4096 bytes."""
        return {"msgtype": "markdown",
                "markdown": {"content": truncate_utf8(notification.body, MAX_CONTENT_BYTES)}}
