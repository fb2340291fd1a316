"""Durable delivery of alerts to receivers: render, send, retry, spool (SPEC N4).

For each receiver, :meth:`Dispatcher.dispatch` renders the alert's text, sends it, and on a
retryable failure retries with backoff (``backoff[i]`` seconds times a jitter factor) up to
``max_retries`` times; what still fails is put in the :class:`~ftwatch.alerting.spool.Spool`
and resent by :meth:`Dispatcher.resend_pending` (call it at start and periodically). A
non-retryable failure is recorded as a dead letter in ``<spool>/dead/``. With a
:class:`~ftwatch.alerting.ratelimit.RateLimiter`, a notification whose receiver has no token
left is spooled at once (error ``rate limited``) and resent when a token is back. Each notification
carries a stable id (decision id + receiver) sent as the idempotency key, so a resend after a
lost response does not show twice at a receiver that honours it.
"""

from __future__ import annotations

import logging
import random
import threading
import time as _time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ftwatch.alerting.alerts import Alert, Notification, notification_id
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.notifiers import Notifier
from ftwatch.alerting.ratelimit import RATE_LIMITED, RateLimiter
from ftwatch.alerting.spool import Spool
from ftwatch.errors import NotifyError, TemplateError

log = logging.getLogger(__name__)

DELIVERED = "delivered"
SPOOLED = "spooled"
FAILED = "failed"


@dataclass(frozen=True)
class DeliveryResult:
    """What became of one notification.

    Attributes:
        receiver: the receiver's name.
        notification_id: the notification's stable id.
        status: ``delivered``, ``spooled`` (will be resent) or ``failed`` (a dead letter).
        attempts: sends tried in total, including earlier ones for a spooled notification.
        error: the last failure's message ("" when delivered at once).
        decision_id: the decision the alert is about.
        text: the rendered text.
        time: epoch seconds when the result was known.
    """

    receiver: str
    notification_id: str
    status: str
    attempts: int
    error: str = ""
    decision_id: str = ""
    text: str = ""
    time: float = 0.0


class Dispatcher:
    """Sends alerts to every receiver, never losing one.

    Args:
        notifiers: the receivers (names must be unique).
        renderer: renders the text per receiver kind.
        spool: where undelivered notifications wait.
        max_retries: retries after the first attempt, within one ``dispatch`` (a notifier's
            own ``max_retries`` attribute, when not None, wins).
        backoff: seconds to wait before retry 1, 2, 3 ... (the last value repeats).
        jitter: each wait is multiplied by a factor drawn from ``[1 - jitter, 1 + jitter]``.
        sleep: waits that many seconds (tests pass a recorder).
        now: wall clock, epoch seconds.
        rng: random source for the jitter.
        on_result: called with each DeliveryResult (e.g. to store it in SQLite).
        max_delay: cap in seconds on a receiver's ``Retry-After``.
        limiter: per-receiver rate limits (None: none); consulted before each send.

    Raises:
        ValueError: for duplicate receiver names or a negative max_retries.

    Calls are serialised by a lock; ``dispatch`` may sleep while holding it.
    """

    def __init__(self, notifiers: Iterable[Notifier], renderer: TemplateRenderer, spool: Spool,
                 max_retries: int = 3, backoff: Sequence[float] = (0.5, 2.0, 5.0),
                 jitter: float = 0.2, sleep: Callable[[float], None] = _time.sleep,
                 now: Callable[[], float] = _time.time, rng: random.Random | None = None,
                 on_result: Callable[[DeliveryResult], None] | None = None,
                 max_delay: float = 60.0, limiter: RateLimiter | None = None):
        self.notifiers: dict[str, Notifier] = {}
        for n in notifiers:
            if n.name in self.notifiers:
                raise ValueError(f"two receivers are named {n.name!r}")
            self.notifiers[n.name] = n
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.renderer = renderer
        self.spool = spool
        self.max_retries = max_retries
        self.backoff = tuple(backoff) or (0.0,)
        self.jitter = jitter
        self._sleep = sleep
        self._now = now
        self._rng = rng or random.Random()
        self._on_result = on_result
        self.max_delay = max_delay
        self.limiter = limiter
        self._lock = threading.Lock()
        self._unknown_warned: set[str] = set()
        self._last_exc: BaseException | None = None

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based), jitter included."""
        base = self.backoff[min(retry, len(self.backoff) - 1)]
        return max(0.0, base * (1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)))

    def notification(self, notifier: Notifier, alert: Alert) -> Notification:
        """Render ``alert`` for one receiver. A broken user template falls back to the
        built-in one (logged), so a template mistake never loses an alert."""
        try:
            text = self.renderer.render(notifier.kind, alert)
        except TemplateError as exc:
            log.error("alert template for receiver %r failed, using the built-in one: %s",
                      notifier.name, exc)
            text = self.renderer.render(notifier.kind, alert, builtin_only=True)
        title = text.splitlines()[0] if text else alert.annotations.get("summary", "")
        nid = notification_id(alert.decision_id, notifier.name, alert.status)
        return Notification(notifier.name, alert, title, text, nid)

    def dispatch(self, alert: Alert) -> list[DeliveryResult]:
        """Deliver ``alert`` to every receiver.

        Returns:
            One DeliveryResult per receiver, in receiver order. Never raises for a
            receiver's failure; those are in the results.
        """
        with self._lock:
            return [self._dispatch_one(n, alert) for n in self.notifiers.values()]

    def deliver(self, n: Notification) -> DeliveryResult:
        """Deliver one rendered notification to its receiver (retries, rate limit, spool).

        Raises:
            KeyError: the receiver is not configured.
        """
        with self._lock:
            return self._deliver(self.notifiers[n.receiver], n)

    def note(self, n: Notification, status: str, reason: str) -> DeliveryResult:
        """Record a notification not sent on purpose (status ``muted`` or ``inhibited``)."""
        return self._result(n, status, 0, reason)

    def _dispatch_one(self, notifier: Notifier, alert: Alert) -> DeliveryResult:
        return self._deliver(notifier, self.notification(notifier, alert))

    def _deliver(self, notifier: Notifier, n: Notification) -> DeliveryResult:
        if self.spool.has(n.id):
            # Already waiting (e.g. dispatched again after a restart): resend_pending owns it.
            return self._result(n, SPOOLED, 0, "already pending in the spool")
        error = ""
        attempts = 0
        if self.limiter is not None and not self.limiter.take(n.receiver, self._now()):
            error = f"{RATE_LIMITED}: held until the receiver's rate limit allows it"
            try:
                self.spool.put(n, 0, error)
            except OSError as exc:
                log.critical("cannot spool notification %s for %r: %s", n.id, n.receiver, exc)
                return self._result(n, FAILED, 0, f"{error}; spool failed: {exc}")
            return self._result(n, SPOOLED, 0, error)
        own = getattr(notifier, "max_retries", None)
        max_retries = self.max_retries if own is None else max(0, int(own))
        for retry in range(max_retries + 1):
            if retry:
                wait = self.delay(retry - 1)
                retry_after = getattr(self._last_exc, "retry_after", None)
                if retry_after is not None:
                    wait = max(wait, min(float(retry_after), self.max_delay))
                self._sleep(wait)
            attempts += 1
            ok, retryable, error = self._send(notifier, n)
            if ok:
                return self._result(n, DELIVERED, attempts, "")
            if not retryable:
                self._dead(n, attempts, error)
                return self._result(n, FAILED, attempts, error)
        try:
            self.spool.put(n, attempts, error)
        except OSError as exc:
            log.critical("cannot spool notification %s for %r: %s", n.id, n.receiver, exc)
            return self._result(n, FAILED, attempts, f"{error}; spool failed: {exc}")
        log.warning("receiver %r did not take %s after %d attempts (%s); spooled",
                    n.receiver, n.id, attempts, error)
        return self._result(n, SPOOLED, attempts, error)

    def resend_pending(self, only: set[str] | None = None) -> int:
        """Try each spooled notification once, oldest first.

        A receiver that fails retryably, or has no rate-limit token left, is skipped for the
        rest of this pass. Notifications whose receiver is no longer configured stay in the
        spool.

        Args:
            only: resend only to these receivers (None: all).

        Returns:
            How many were delivered (and removed from the spool).
        """
        delivered = 0
        with self._lock:
            down: set[str] = set()
            for entry in self.spool.pending():
                n = entry.notification
                notifier = self.notifiers.get(n.receiver)
                if notifier is None:
                    if n.receiver not in self._unknown_warned:
                        self._unknown_warned.add(n.receiver)
                        log.warning("spooled notifications for unknown receiver %r are kept",
                                    n.receiver)
                    continue
                if n.receiver in down or (only is not None and n.receiver not in only):
                    continue
                if self.limiter is not None and not self.limiter.take(n.receiver, self._now()):
                    down.add(n.receiver)
                    continue
                attempts = entry.attempts + 1
                ok, retryable, error = self._send(notifier, n)
                if ok:
                    self.spool.ack(n.id)
                    delivered += 1
                    self._result(n, DELIVERED, attempts, "")
                elif retryable:
                    down.add(n.receiver)
                    self.spool.record_attempt(n.id, error)
                    self._result(n, SPOOLED, attempts, error)
                else:
                    self._dead(n, attempts, error)
                    self._result(n, FAILED, attempts, error)
        return delivered

    def _send(self, notifier: Notifier, n: Notification) -> tuple[bool, bool, str]:
        """(delivered, retryable, error) of one attempt."""
        self._last_exc = None
        try:
            notifier.send(n)
        except NotifyError as exc:
            self._last_exc = exc
            return False, exc.retryable, str(exc)
        except Exception as exc:  # noqa: BLE001 - a notifier bug must not lose the alert
            self._last_exc = exc
            log.exception("receiver %r raised unexpectedly", notifier.name)
            return False, True, f"{type(exc).__name__}: {exc}"
        return True, False, ""

    def _dead(self, n: Notification, attempts: int, error: str) -> None:
        log.error("receiver %r refused %s: %s (dead letter)", n.receiver, n.id, error)
        try:
            self.spool.dead(n, attempts, error)
        except OSError as exc:
            log.critical("cannot write dead letter %s: %s", n.id, exc)

    def _result(self, n: Notification, status: str, attempts: int, error: str) -> DeliveryResult:
        result = DeliveryResult(n.receiver, n.id, status, attempts, error,
                                n.alert.decision_id, n.body, self._now())
        if self._on_result is not None:
            try:
                self._on_result(result)
            except Exception:  # noqa: BLE001 - recording must not stop delivery
                log.exception("on_result callback failed for %s", n.id)
        return result
