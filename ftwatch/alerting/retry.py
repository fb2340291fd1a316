"""One notification's attempts at its receiver (SPEC N4): send, retry with backoff and jitter, and
what the spool keeps of each outcome (the notify stage's retry and send steps,
``ftwatch.alerting.notify``).

A new notification (already in the spool: write-ahead) gets the first attempt and up to
``max_retries`` retries (:meth:`Retrier.attempt_all`); a spooled one gets one try per resend pass
(:meth:`Retrier.attempt_once`). Delivered: acked out of the spool. Refused for good (a
non-retryable :class:`~ftwatch.errors.NotifyError`): moved to the spool's ``dead/``. Still failing:
left in the spool (status ``spooled``) for the next resend pass. A notifier that raises anything
else is a bug, logged and treated as retryable, so it never loses the alert. Every final result
goes onto the results queue, in whichever thread it was known (:meth:`Retrier.result`). A wait
between attempts is cut short, and the retries end, once the sender's shutdown wait is over
(``closing``, background mode only).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time as _time
from typing import Callable, Sequence

from ftwatch.alerting.alerts import Notification
from ftwatch.alerting.notifiers import Notifier
from ftwatch.alerting.spool import Spool
from ftwatch.alerting.workers import Job
from ftwatch.errors import NotifyError
from ftwatch.events import DeliveryResult

log = logging.getLogger(__name__)

DELIVERED = "delivered"
SPOOLED = "spooled"
FAILED = "failed"


class Retrier:
    """Sends a notification to its receiver with retries, and records the outcome in the spool.

    Args:
        spool: where the notification already is; acked, kept or moved to ``dead/``.
        results: the queue every final result goes on.
        now: wall clock, epoch seconds (a result's time).
        max_retries: retries after the first attempt of a new notification (a notifier's own
            ``max_retries`` attribute, when not None, wins).
        backoff: seconds to wait before retry 1, 2, 3 ... (the last value repeats).
        jitter: each wait is multiplied by a factor drawn from ``[1 - jitter, 1 + jitter]``.
        rng: random source for the jitter.
        max_delay: cap in seconds on a receiver's ``Retry-After``.
        sleep: waits that many seconds (tests pass a recorder); None: a wait that ``closing``
            cuts short.
        closing: set when the sender's shutdown wait is over.
        background: the sender sends from worker threads (only then does ``closing`` end the
            retries).
    """

    def __init__(self, spool: Spool, results: queue.SimpleQueue, now: Callable[[], float] = _time.time, *,
                 max_retries: int = 3, backoff: Sequence[float] = (0.5, 2.0, 5.0), jitter: float = 0.2,
                 rng: random.Random | None = None, max_delay: float = 60.0,
                 sleep: Callable[[float], None] | None = None, closing: threading.Event | None = None,
                 background: bool = False):
        self.spool = spool
        self.results = results
        self.max_retries = max_retries
        self.backoff = tuple(backoff) or (0.0,)
        self.jitter = jitter
        self.max_delay = max_delay
        self.background = background
        self._now = now
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._closing = closing if closing is not None else threading.Event()

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based), jitter included."""
        base = self.backoff[min(retry, len(self.backoff) - 1)]
        return max(0.0, base * (1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)))

    def retries(self, notifier: Notifier) -> int:
        """Retries after a new notification's first attempt at ``notifier``."""
        own = getattr(notifier, "max_retries", None)
        return self.max_retries if own is None else max(0, int(own))

    def longest(self, notifier: Notifier) -> float:
        """Seconds one new notification may take at ``notifier``: its ``timeout`` times
        ``1 + retries`` attempts, plus the longest backoff waits between them."""
        retries = self.retries(notifier)
        backoff = sum(self.backoff[min(i, len(self.backoff) - 1)] for i in range(retries))
        return float(getattr(notifier, "timeout", 5.0) or 5.0) * (1 + retries) + backoff * (1.0 + self.jitter)

    def attempt_all(self, notifier: Notifier, job: Job) -> DeliveryResult:
        """A new notification (in the spool already): the first attempt and the retries."""
        n = job.notification
        error = ""
        attempts = 0
        retry_after: float | None = None
        for retry in range(self.retries(notifier) + 1):
            if retry:
                wait = self.delay(retry - 1)
                if retry_after is not None:
                    wait = max(wait, min(float(retry_after), self.max_delay))
                if not self._closing_now():
                    self._wait(wait)
                if self._closing_now():
                    break                         # shutting down: the spool keeps it
            attempts += 1
            ok, retryable, error, retry_after = self._send(notifier, n)
            if ok:
                self._ack(n)
                return self.result(n, DELIVERED, job.attempts + attempts, "")
            if not retryable:
                self._dead(n, job.attempts + attempts, error)
                return self.result(n, FAILED, job.attempts + attempts, error)
        attempts += job.attempts
        if not self.spool_put(n, attempts, error):
            return self.result(n, FAILED, attempts, f"{error}; spool failed")
        log.warning("receiver %r did not take %s after %d attempts (%s); spooled",
                    n.receiver, n.id, attempts, error)
        return self.result(n, SPOOLED, attempts, error)

    def attempt_once(self, notifier: Notifier, job: Job) -> bool:
        """A spooled notification: one try. True when delivered."""
        n = job.notification
        attempts = job.attempts + 1
        ok, retryable, error, _ = self._send(notifier, n)
        if ok:
            self._ack(n)
            self.result(n, DELIVERED, attempts, "")
        elif retryable:
            self.spool.record_attempt(n.id, error)
            self.result(n, SPOOLED, attempts, error)
        else:
            self._dead(n, attempts, error)
            self.result(n, FAILED, attempts, error)
        return ok

    def spool_put(self, n: Notification, attempts: int, error: str) -> bool:
        """Writes ``n`` to the spool (its attempts so far, the last error); False when the write
        failed (logged)."""
        try:
            self.spool.put(n, attempts, error)
        except OSError as exc:
            log.critical("cannot spool notification %s for %r: %s", n.id, n.receiver, exc)
            return False
        return True

    def result(self, n: Notification, status: str, attempts: int, error: str) -> DeliveryResult:
        """The result of ``n``, put on the results queue and returned."""
        result = DeliveryResult(n.receiver, n.id, status, attempts, error,
                                n.alert.decision_id, n.body, self._now())
        self.results.put(result)
        return result

    def _closing_now(self) -> bool:
        return self.background and self._closing.is_set()

    def _wait(self, seconds: float) -> None:
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            self._closing.wait(seconds)

    def _send(self, notifier: Notifier, n: Notification) -> tuple[bool, bool, str, float | None]:
        """(delivered, retryable, error, the receiver's Retry-After) of one attempt."""
        try:
            notifier.send(n)
        except NotifyError as exc:
            return False, exc.retryable, str(exc), getattr(exc, "retry_after", None)
        except Exception as exc:  # noqa: BLE001 - a notifier bug must not lose the alert
            log.exception("receiver %r raised unexpectedly", notifier.name)
            return False, True, f"{type(exc).__name__}: {exc}", None
        return True, False, "", None

    def _ack(self, n: Notification) -> None:
        try:
            self.spool.ack(n.id)
        except OSError as exc:   # delivered, but may be sent again (same idempotency key)
            log.error("cannot remove delivered notification %s from the spool: %s", n.id, exc)

    def _dead(self, n: Notification, attempts: int, error: str) -> None:
        log.error("receiver %r refused %s: %s (dead letter)", n.receiver, n.id, error)
        try:
            self.spool.dead(n, attempts, error)
        except OSError as exc:
            log.critical("cannot write dead letter %s: %s", n.id, exc)
