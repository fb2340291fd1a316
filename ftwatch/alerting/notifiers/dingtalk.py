"""The DingTalk custom robot receiver (SPEC N2).

Message: ``{"msgtype": "markdown", "markdown": {"title", "text"}}`` (DingTalk custom robot:
message types, markdown). With a secret the robot's "security settings: signature" applies:
``timestamp`` (epoch milliseconds) and ``sign`` = base64(HMAC-SHA256(key=secret,
msg=f"{timestamp}\\n{secret}")) are added to the URL's query, URL-encoded, as in DingTalk's
documented example (``urllib.parse.quote_plus(base64.b64encode(hmac_code))``).

DingTalk answers HTTP 200 with ``{"errcode": 0, "errmsg": "ok"}``; any other ``errcode`` is a
failure. 130101 ("send too fast, exceed 20 times per minute") is the rate limit and worth
retrying; the rest (310000 bad signature or missing keyword, 300001 bad token, ...) are not.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import httpx

from ftwatch.alerting.alerts import Notification
from ftwatch.alerting.notifiers.chatbot import ChatBotNotifier
from ftwatch.alerting.notifiers.webhook import truncate_utf8

RATE_LIMITED = 130101
"""DingTalk's errcode for "send too fast" (20 messages a minute per robot)."""

MAX_TEXT_BYTES = 20000
"""The markdown text is cut to this many bytes (DingTalk rejects a too long message)."""


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """base64(HMAC-SHA256(key=secret, msg=f"{timestamp}\\n{secret}")), not yet URL-encoded."""
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp_ms}\n{secret}".encode("utf-8"),
                      hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


class DingTalkNotifier(ChatBotNotifier):
    """A DingTalk custom robot (markdown message, optionally signed)."""

    kind = "dingtalk"
    code_keys = ("errcode",)
    rate_limit_codes = frozenset({RATE_LIMITED})

    def payload(self, notification: Notification) -> dict[str, Any]:
        """The markdown message: the first line (without heading marks) as title, shown in
        the notification preview; the whole text as body."""
        title = notification.title.lstrip("#").strip() or notification.alert.annotations.get(
            "summary", "ftwatch")
        return {"msgtype": "markdown",
                "markdown": {"title": title[:64],
                             "text": truncate_utf8(notification.body, MAX_TEXT_BYTES)}}

    def request_url(self) -> str:
        """The URL, with ``timestamp`` and ``sign`` added when there is a secret."""
        if not self.secret:
            return self.url
        ts = int(self._clock() * 1000)
        url = httpx.URL(self.url).copy_merge_params(
            {"timestamp": str(ts), "sign": dingtalk_sign(self.secret, ts)})
        return str(url)
