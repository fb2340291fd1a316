"""The common part of the chat-bot receivers (DingTalk, Feishu/Lark, WeCom, Slack; SPEC N2).

A chat bot is a :class:`~ftwatch.alerting.notifiers.webhook.WebhookNotifier` with its own
message body, an optional signing ``secret`` (never printed) and a stricter answer check: an
HTTP 2xx whose JSON body carries a non-zero error code is a failed delivery, retryable only
for the service's rate-limit codes. DingTalk, WeCom and Feishu always answer a JSON object, so
a 2xx without one (a proxy's or captive portal's page) is a failed, retryable delivery too
(``answers_json``; Slack answers a plain ``ok`` and checks that itself).
"""

from __future__ import annotations

import time
from typing import Any, Callable, ClassVar, Mapping

import httpx

from ftwatch.alerting.notifiers.webhook import WebhookNotifier, _snippet, json_body, redact_url


class ChatBotNotifier(WebhookNotifier):
    """A chat bot's incoming webhook.

    Args:
        name: the receiver's name.
        url: the bot's webhook URL (its token is a secret: never printed).
        secret: the signing secret, for services that sign (None: unsigned).
        timeout: seconds for connect, read and write each.
        client: an ``httpx.Client`` to use (tests); default: one made on first use.
        max_retries: retries within one dispatch (None: the sender's).
        clock: epoch seconds, for the signature's timestamp (tests pass a fixed one).

    Subclasses set ``code_keys`` (body keys holding the error code, first present wins)
    and ``rate_limit_codes`` (codes that are worth retrying).
    """

    kind = "chatbot"
    code_keys: ClassVar[tuple[str, ...]] = ("errcode",)
    message_keys: ClassVar[tuple[str, ...]] = ("errmsg", "msg")
    rate_limit_codes: ClassVar[frozenset[int]] = frozenset()
    answers_json: ClassVar[bool] = True
    """The service always answers a JSON object (a 2xx without one is not its answer)."""
    path_secret_after: ClassVar[str | None] = None
    """The URL path segment after which every segment is a secret (Slack ``services``,
    Feishu ``hook``); None: the path holds no secret."""

    def __init__(self, name: str, url: str, secret: str | None = None, timeout: float = 5.0,
                 client: httpx.Client | None = None, max_retries: int | None = None,
                 clock: Callable[[], float] = time.time):
        super().__init__(name, url, timeout=timeout, client=client, max_retries=max_retries)
        self.secret = secret or None
        self._clock = clock

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> "ChatBotNotifier":
        """One notifier from a config entry (``name``, ``url``, ``secret``, ``timeout``,
        ``max_retries``).

        Raises:
            KeyError: a required field is missing.
        """
        return cls(str(data["name"]), str(data["url"]), secret=data.get("secret"),
                   timeout=float(data.get("timeout", 5.0)), max_retries=data.get("max_retries"))

    def secrets(self) -> list[str]:
        """The webhook's secrets plus the signing secret."""
        found = super().secrets() + ([self.secret] if self.secret else [])
        if self.path_secret_after:
            try:
                parts = httpx.URL(self.url).path.split("/")
            except (httpx.InvalidURL, TypeError):
                return found
            if self.path_secret_after in parts:
                found += [p for p in parts[parts.index(self.path_secret_after) + 1:] if p]
        return found

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, url={self._redact(redact_url(self.url))!r})"

    def check_response(self, response: httpx.Response) -> None:
        """Delivered only for a 2xx whose body has no non-zero error code.

        Raises:
            NotifyError: as the generic webhook for a non-2xx status; for a 2xx with an error
                code, retryable only for ``rate_limit_codes``; for a 2xx without a JSON object
                (when ``answers_json``), retryable: something else answered, the message may
                not have reached the service.
        """
        super().check_response(response)
        body = json_body(response)
        if body is None:
            if self.answers_json:
                raise self.failure(f"answered HTTP {response.status_code} without the service's JSON "
                                   f"answer: {_snippet(response)}", True, response)
            return
        code = next((body[k] for k in self.code_keys if k in body), 0)
        if code in (0, None, "0"):
            return
        try:
            number = int(code)
        except (TypeError, ValueError):
            number = -1
        raise self.failure(f"answered error code {code}: {_snippet(response)}",
                           number in self.rate_limit_codes, response)
