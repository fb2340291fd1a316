"""The Slack incoming webhook receiver (SPEC N2).

Message: ``{"text": ...}`` (Slack incoming webhooks). The URL's path is the secret; Slack
does not sign incoming webhooks.

Slack answers HTTP 200 with the plain body ``ok``. Errors come as a 4xx with a plain body
(``invalid_payload``, ``no_text``, ``invalid_token``, ``channel_not_found``,
``channel_is_archived``, ...): not retryable; 429 (rate limited, with ``Retry-After``) and 5xx
are retryable.
"""

from __future__ import annotations

from typing import Any

import httpx

from ftwatch.alerting.alerts import Notification
from ftwatch.alerting.notifiers.chatbot import ChatBotNotifier
from ftwatch.alerting.notifiers.webhook import _snippet

MAX_TEXT_CHARS = 40000
"""Slack truncates a message's text longer than this."""


class SlackNotifier(ChatBotNotifier):
    """A Slack incoming webhook (``text`` message)."""

    kind = "slack"
    path_secret_after = "services"
    answers_json = False      # a plain ``ok``

    def payload(self, notification: Notification) -> dict[str, Any]:
        """``{"text": body}``."""
        return {"text": notification.body[:MAX_TEXT_CHARS]}

    def check_response(self, response: httpx.Response) -> None:
        """Delivered only for a 2xx whose body is ``ok``.

        Raises:
            NotifyError: retryable for 408, 425, 429 and 5xx; not for other statuses or a
                2xx with another body.
        """
        super().check_response(response)  # statuses; answers_json is off, so a plain body passes
        if response.text.strip() != "ok":
            raise self.failure(f"answered {_snippet(response)} instead of ok", False, response)

