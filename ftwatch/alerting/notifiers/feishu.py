"""The Feishu/Lark custom bot receiver (SPEC N2).

Message: an interactive card, ``{"msg_type": "interactive", "card": {"header": {"title"},
"elements": [{"tag": "markdown", "content"}]}}`` (Feishu custom bot: message card). With a
secret, "Feishu custom bot: signature verification" applies: the JSON body carries
``timestamp`` (epoch seconds, a string) and ``sign`` = base64(HMAC-SHA256(
key=f"{timestamp}\\n{secret}", msg=b"")).

Feishu answers HTTP 200 with ``{"code": 0, ...}`` (older deployments: ``{"StatusCode": 0}``);
a non-zero code is a failure. 11232 (frequency limited) is worth retrying; the rest (19021
bad signature, 19024 keyword missing, 9499 bad request, ...) are not.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from ftwatch.alerting.alerts import Notification
from ftwatch.alerting.notifiers.chatbot import ChatBotNotifier
from ftwatch.alerting.notifiers.webhook import truncate_utf8

RATE_LIMITED = 11232
"""Feishu's code for "frequency limited"."""

MAX_TEXT_BYTES = 20000
"""The card's markdown is cut to this many bytes (a request body is limited to 20 KB)."""


def feishu_sign(secret: str, timestamp_s: int) -> str:
    """base64(HMAC-SHA256(key=f"{timestamp}\\n{secret}", msg=b""))."""
    key = f"{timestamp_s}\n{secret}".encode("utf-8")
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode("ascii")


class FeishuNotifier(ChatBotNotifier):
    """A Feishu/Lark custom bot (interactive card, optionally signed)."""

    kind = "feishu"
    code_keys = ("code", "StatusCode")
    rate_limit_codes = frozenset({RATE_LIMITED})
    path_secret_after = "hook"

    def payload(self, notification: Notification) -> dict[str, Any]:
        """The card: the first line as header title (red while firing, green resolved), the
        rest as its markdown."""
        alert = notification.alert
        title = notification.title or alert.annotations.get("summary", "ftwatch")
        body: dict[str, Any] = {
            "msg_type": "interactive",
            "card": {
                "config": {"wide_screen_mode": True},
                "header": {"title": {"tag": "plain_text", "content": title},
                           "template": "green" if alert.status == "resolved" else "red"},
                "elements": [{"tag": "markdown",
                              "content": truncate_utf8(_without_title(notification.body),
                                                       MAX_TEXT_BYTES)}],
            },
        }
        if self.secret:
            ts = int(self._clock())
            body = {"timestamp": str(ts), "sign": feishu_sign(self.secret, ts), **body}
        return body


def _without_title(text: str) -> str:
    """``text`` without its first line (the card's header), unless that is all there is."""
    head, sep, rest = text.partition("\n")
    return rest.strip("\n") if sep and rest.strip() else text
