"""The generic webhook receiver: one JSON POST per notification (SPEC N2, N4, Q2).

The body is::

    {"id", "receiver", "status", "labels", "annotations", "startsAt", "endsAt",
     "text", "decision": Decision.to_json()}

(``decision`` is null for an alert made from no decision: a custom message, a digest) with the
header ``Idempotency-Key: <id>``, so a receiver can drop a notification that a
retry after a lost response delivers twice. Header values, URL credentials and query values
(DingTalk's ``access_token``, a Slack hook's path is kept) never appear in an error message
or a log line.
"""

from __future__ import annotations

from typing import Any, Mapping

import httpx

from ftwatch.alerting.alerts import Notification
from ftwatch.errors import NotifyError
from ftwatch.events import iso

RETRYABLE_STATUS = frozenset({408, 425, 429})
"""4xx statuses worth retrying (timeout, too early, rate limited); every 5xx is retryable too."""


def redact_url(url: str) -> str:
    """``url`` with its user info dropped and each query value replaced by ``***``."""
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "<invalid url>"
    query = "&".join(f"{k}=***" for k in u.params.keys())
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}{u.path}" + (f"?{query}" if query else "")


class WebhookNotifier:
    """POSTs each notification as JSON to ``url``.

    Args:
        name: the receiver's name.
        url: the endpoint (http or https).
        headers: extra request headers (e.g. ``Authorization``); their values are secrets.
        timeout: seconds for connect, read and write each.
        client: an ``httpx.Client`` to use (tests, shared pools); by default one is made
            on first use and closed by :meth:`close`.
        max_retries: retries within one dispatch for this receiver (None: the sender's).

    Subclasses for chat bots override :meth:`payload` and :meth:`check_response` (a bot's
    HTTP 200 with an error code in the body is a failure, SPEC N2), :meth:`request_url` when
    the URL changes per request (a signature in the query), and :meth:`secrets` when they hold
    secrets besides the headers and the URL; :meth:`from_config` builds one from a config entry.
    """

    kind = "webhook"

    def __init__(self, name: str, url: str, headers: Mapping[str, str] | None = None,
                 timeout: float = 5.0, client: httpx.Client | None = None,
                 max_retries: int | None = None):
        self.name = name
        self.max_retries = max_retries
        self.url = url
        self.headers = dict(headers or {})
        self.timeout = timeout
        self._client = client
        self._own_client = client is None

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> "WebhookNotifier":
        """One notifier from a config entry (``name``, ``url``, ``headers``, ``timeout``,
        ``max_retries``).

        Raises:
            KeyError: a required field is missing.
        """
        return cls(str(data["name"]), str(data["url"]), headers=data.get("headers") or None,
                   timeout=float(data.get("timeout", 5.0)), max_retries=data.get("max_retries"))

    # -- what is sent ---------------------------------------------------------------------

    def payload(self, notification: Notification) -> dict[str, Any]:
        """The JSON body for one notification."""
        alert = notification.alert
        return {
            "id": notification.id,
            "receiver": notification.receiver,
            "status": alert.status,
            "labels": dict(alert.labels),
            "annotations": dict(alert.annotations),
            "startsAt": iso(alert.starts_at),
            "endsAt": None if alert.ends_at is None else iso(alert.ends_at),
            "text": notification.body,
            "decision": None if alert.decision is None else alert.decision.to_json(),
        }

    def request_url(self) -> str:
        """The URL of the next request (here: ``url``; signing chat bots add query values)."""
        return self.url

    def secrets(self) -> list[str]:
        """Values that must never appear in a message: header values, URL query values, URL
        user info (subclasses add their signing secret)."""
        found = [v for v in self.headers.values() if v]
        try:
            u = httpx.URL(self.url)
            found += [v for _, v in u.params.multi_items() if v]
            found += [s for s in (u.userinfo.decode(errors="replace"),) if s]
        except (httpx.InvalidURL, TypeError):
            found.append(self.url)
        return found

    def failure(self, detail: str, retryable: bool,
                response: httpx.Response | None = None) -> NotifyError:
        """A redacted ``NotifyError`` naming this receiver (with ``retry_after`` from the
        response's ``Retry-After`` header, when there is one)."""
        err = NotifyError(self._redact(f"{self.kind} {self.name!r}: {redact_url(self.url)} "
                                       f"{detail}"), retryable=retryable)
        retry_after = None if response is None else _retry_after(response)
        if retry_after is not None:
            err.retry_after = retry_after  # type: ignore[attr-defined]
        return err

    def check_response(self, response: httpx.Response) -> None:
        """Raise NotifyError unless ``response`` means delivered (here: any 2xx).

        Raises:
            NotifyError: retryable for 408, 425, 429 and 5xx; not retryable otherwise.
        """
        status = response.status_code
        if 200 <= status < 300:
            return
        retryable = status >= 500 or status in RETRYABLE_STATUS
        raise self.failure(f"answered HTTP {status}: {_snippet(response)}", retryable, response)

    # -- sending --------------------------------------------------------------------------

    def send(self, notification: Notification) -> None:
        """POST one notification.

        Raises:
            NotifyError: ``retryable=True`` for timeouts, connection errors, 408/425/429
                and 5xx; ``retryable=False`` for other statuses and for a body that cannot
                be encoded. The message never contains header values or URL secrets.
        """
        headers = {**self.headers, "Idempotency-Key": notification.id}
        try:
            body = self.payload(notification)
            response = self._http().post(self.request_url(), json=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise self.failure(f"timed out: {type(exc).__name__}", True) from None
        except httpx.TransportError as exc:
            raise self.failure(f"unreachable: {type(exc).__name__}: {exc}", True) from None
        except (TypeError, ValueError, httpx.InvalidURL) as exc:
            raise NotifyError(self._redact(f"{self.kind} {self.name!r}: cannot send: "
                                           f"{type(exc).__name__}: {exc}"),
                              retryable=False) from None
        self.check_response(response)

    def close(self) -> None:
        """Close the HTTP client if this notifier made it."""
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout, follow_redirects=False)
        return self._client

    def _redact(self, text: str) -> str:
        """Replace every secret this notifier knows (:meth:`secrets`) in ``text`` with ``***``."""
        for secret in sorted(set(self.secrets()), key=len, reverse=True):
            if len(secret) >= 3:
                text = text.replace(secret, "***")
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, url={redact_url(self.url)!r})"


def json_body(response: httpx.Response) -> dict[str, Any] | None:
    """The response's JSON object, or None when the body is not one."""
    try:
        data = response.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def truncate_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (on a character boundary), marked with ``...``."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:max(0, limit - 3)].decode("utf-8", errors="ignore") + "..."


def _snippet(response: httpx.Response, limit: int = 200) -> str:
    try:
        text = response.text
    except Exception:  # noqa: BLE001 - undecodable body
        return "<undecodable body>"
    text = " ".join(text.split())
    return text[:limit] + ("..." if len(text) > limit else "") if text else "<empty body>"


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a ``Retry-After: <seconds>`` header, else None (dates are ignored)."""
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
