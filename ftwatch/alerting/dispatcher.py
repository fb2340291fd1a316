"""Durable delivery of alerts to receivers: render, spool, send, retry (SPEC N4).

Write-ahead: every notification is put in the on-disk :class:`~ftwatch.alerting.spool.Spool`
before the first attempt to send it, and leaves it only once delivered (``ack``) or refused for
good (moved to ``<spool>/dead/``). A crash or a SIGKILL at any moment therefore leaves every
undelivered notification on disk, and :meth:`Dispatcher.resend_pending` (at start and
periodically) sends it; an acked one is never sent again.

Sending: on a retryable failure a new notification is retried with backoff (``backoff[i]``
seconds times a jitter factor) up to ``max_retries`` times; what still fails stays in the spool
(status ``spooled``) for the next resend pass. With ``background=True`` (``ftwatch run`` and
``ftwatch watch``) the sends happen in one :class:`~ftwatch.alerting.delivery.DeliveryWorker`
thread per receiver: :meth:`Dispatcher.dispatch` returns right after the spool write (status
``queued``) and the final results reach ``on_result`` from the worker's thread. Receivers whose
``send`` never blocks (``inline = True``: the console) are still sent in the caller's thread,
so the terminal shows the alert where it happened. With ``background=False`` (the default, for
tests and tools) everything happens in the caller's thread and the results are returned.

With a :class:`~ftwatch.alerting.ratelimit.RateLimiter`, a notification whose receiver has no
token left is spooled at once (error ``rate limited``) and resent when a token is back; the
limiter is only consulted in the caller's thread. Each notification carries a stable id
(decision id + receiver) sent as the idempotency key, so a resend after a lost response does
not show twice at a receiver that honours it.
"""

from __future__ import annotations

import logging
import random
import threading
import time as _time
from typing import Callable, Iterable, Sequence

from ftwatch.alerting.alerts import Alert, Notification, notification_id
from ftwatch.alerting.delivery import (  # noqa: F401 - the results are part of this face
    CLOSE_WAIT_CAP, DELIVERED, FAILED, QUEUED, SHUTDOWN, SPOOLED, DeliveryResult, DeliveryWorker, Job)
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.notifiers import Notifier
from ftwatch.alerting.ratelimit import RATE_LIMITED, RateLimiter
from ftwatch.alerting.spool import Spool
from ftwatch.errors import NotifyError, TemplateError

log = logging.getLogger(__name__)

class Dispatcher:
    """Sends alerts to every receiver, never losing one.

    Args:
        notifiers: the receivers (names must be unique).
        renderer: renders the text per receiver kind.
        spool: where notifications wait until delivered (written before the first attempt).
        max_retries: retries after the first attempt of a new notification (a notifier's own
            ``max_retries`` attribute, when not None, wins).
        backoff: seconds to wait before retry 1, 2, 3 ... (the last value repeats).
        jitter: each wait is multiplied by a factor drawn from ``[1 - jitter, 1 + jitter]``.
        sleep: waits that many seconds (tests pass a recorder); None: a wait that
            :meth:`close` cuts short.
        now: wall clock, epoch seconds.
        rng: random source for the jitter.
        on_result: called with each DeliveryResult (e.g. to store it in SQLite); in background
            mode also from the delivery workers' threads, so it must be thread-safe (the
            SQLite store and the Elasticsearch sink serialise their writes with a lock).
        max_delay: cap in seconds on a receiver's ``Retry-After``.
        limiter: per-receiver rate limits (None: none); consulted before each send.
        background: send from one worker thread per receiver (see the module doc).

    Raises:
        ValueError: for duplicate receiver names or a negative max_retries.

    Calls are serialised by a lock. Without ``background``, ``dispatch`` may sleep while
    holding it; with it, the lock is only held for spool writes and queueing.
    """

    def __init__(self, notifiers: Iterable[Notifier], renderer: TemplateRenderer, spool: Spool,
                 max_retries: int = 3, backoff: Sequence[float] = (0.5, 2.0, 5.0),
                 jitter: float = 0.2, sleep: Callable[[float], None] | None = None,
                 now: Callable[[], float] = _time.time, rng: random.Random | None = None,
                 on_result: Callable[[DeliveryResult], None] | None = None,
                 max_delay: float = 60.0, limiter: RateLimiter | None = None,
                 background: bool = False):
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
        self.background = background
        self._lock = threading.RLock()
        self._unknown_warned: set[str] = set()
        self._closing = threading.Event()     # close()'s wait is over: no more waits or sends
        self._closed = False
        self._idle = threading.Condition()
        self._queued: set[str] = set()        # ids handed to a worker and not finished
        self._workers: dict[str, DeliveryWorker] = {}
        self._pass = 0                        # resend passes (background)
        self._down: dict[str, int] = {}       # receiver -> the pass it failed in

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
            One DeliveryResult per receiver, in receiver order (status ``queued`` for those
            handed to a delivery worker). Never raises for a receiver's failure; those are in
            the results.
        """
        with self._lock:
            return [self._submit(n, self.notification(n, alert)) for n in self.notifiers.values()]

    def deliver(self, n: Notification) -> DeliveryResult:
        """Deliver one rendered notification to its receiver (spool, rate limit, retries).

        Raises:
            KeyError: the receiver is not configured.
        """
        with self._lock:
            return self._submit(self.notifiers[n.receiver], n)

    def note(self, n: Notification, status: str, reason: str) -> DeliveryResult:
        """Record a notification not sent on purpose (status ``muted`` or ``inhibited``)."""
        return self._result(n, status, 0, reason)

    def _submit(self, notifier: Notifier, n: Notification) -> DeliveryResult:
        if n.id in self._queued or self.spool.has(n.id):
            # Already waiting (e.g. dispatched again after a restart): resend_pending owns it.
            return self._result(n, SPOOLED, 0, "already pending in the spool")
        if self.limiter is not None and not self.limiter.take(n.receiver, self._now()):
            error = f"{RATE_LIMITED}: held until the receiver's rate limit allows it"
            if not self._spool_put(n, 0, error):
                return self._result(n, FAILED, 0, f"{error}; spool failed")
            return self._result(n, SPOOLED, 0, error)
        self._spool_put(n, 0, "")          # write-ahead: on disk before the first attempt
        if not self._async(notifier):
            return self._attempt_all(notifier, Job(n))
        if self._closed:
            return self._result(n, SPOOLED, 0, SHUTDOWN)
        self._hand_over(Job(n))
        return DeliveryResult(n.receiver, n.id, QUEUED, 0, "", n.alert.decision_id, n.body,
                              self._now())

    def resend_pending(self, only: set[str] | None = None) -> int:
        """Try each spooled notification once, oldest first.

        A receiver that fails retryably, or has no rate-limit token left, is skipped for the
        rest of this pass. Notifications whose receiver is no longer configured stay in the
        spool. In background mode the sends happen in the delivery workers (one pass per
        call; notifications already with a worker are left to it).

        Args:
            only: resend only to these receivers (None: all).

        Returns:
            How many were delivered (and removed from the spool); in background mode, how
            many were handed to the delivery workers.
        """
        count = 0
        with self._lock:
            if self._closed and self.background:
                return 0                       # shut down: the next start resends them
            self._pass += 1
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
                if n.id in self._queued or n.receiver in down or \
                        (only is not None and n.receiver not in only):
                    continue
                if self.limiter is not None and not self.limiter.take(n.receiver, self._now()):
                    down.add(n.receiver)
                    continue
                job = Job(n, entry.attempts, self._pass)
                if self._async(notifier):
                    self._hand_over(job)
                    count += 1
                elif self._attempt_once(notifier, job):
                    count += 1
                elif self.spool.has(n.id):        # retryable: the receiver is down this pass
                    down.add(n.receiver)
        return count

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the delivery workers have finished every notification handed to them
        (their results passed to ``on_result``), at most ``timeout`` seconds (None: no limit).
        Returns True when nothing is left with them. A no-op without ``background``."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._queued, timeout)

    def close(self, timeout: float | None = None) -> list[DeliveryResult]:
        """Shutdown: let the workers go on with what they have (sends, retries, backoff) for at
        most ``timeout`` seconds (None: :meth:`close_wait`); then their waits are cut short and
        what they have not sent stays in the spool, where it already is, for the next start
        (its result, status ``spooled``, may still reach ``on_result`` afterwards). Later
        notifications are only spooled. Returns at once without ``background``.

        Returns:
            [] (the workers' results went to ``on_result``).
        """
        wait = self.close_wait() if timeout is None else timeout
        if not self.drain(wait):
            log.warning("%d notification(s) not delivered within %.0f s of shutdown; kept in %s",
                        len(self._queued), wait, self.spool.directory)
        self._closing.set()
        with self._lock:
            self._closed = True
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.stop()
        return []

    def close_wait(self) -> float:
        """Seconds a shutdown waits for the workers: what one notification may take at the
        slowest receiver (its ``timeout`` times ``1 + max_retries`` attempts, plus the longest
        backoff waits between them), at most :data:`CLOSE_WAIT_CAP`."""
        waits = []
        for n in self.notifiers.values():
            if self._async(n):
                retries = self._retries(n)
                backoff = sum(self.backoff[min(i, len(self.backoff) - 1)] for i in range(retries))
                waits.append(float(getattr(n, "timeout", 5.0) or 5.0) * (1 + retries)
                             + backoff * (1.0 + self.jitter))
        return min(CLOSE_WAIT_CAP, max(waits, default=0.0))

    # -- sending ------------------------------------------------------------------------------

    def _async(self, notifier: Notifier) -> bool:
        return self.background and not getattr(notifier, "inline", False)

    def _retries(self, notifier: Notifier) -> int:
        own = getattr(notifier, "max_retries", None)
        return self.max_retries if own is None else max(0, int(own))

    def _hand_over(self, job: Job) -> None:
        receiver = job.notification.receiver
        worker = self._workers.get(receiver)
        if worker is None:
            worker = self._workers[receiver] = DeliveryWorker(receiver, self._work, self._finished)
        with self._idle:
            self._queued.add(job.notification.id)
        worker.submit(job)

    def _finished(self, job: Job) -> None:
        with self._idle:
            self._queued.discard(job.notification.id)
            self._idle.notify_all()

    def _work(self, job: Job) -> None:
        """In a worker's thread: send one job (no dispatcher lock held while sending)."""
        n = job.notification
        notifier = self.notifiers[n.receiver]
        if self._closing.is_set():             # shut down: the spool keeps it
            self._result(n, SPOOLED, job.attempts, SHUTDOWN)
            return
        if job.resend is not None:
            if self._down.get(n.receiver) == job.resend:
                return                         # failed earlier in this pass: left in the spool
            if not self._attempt_once(notifier, job) and self.spool.has(n.id):
                self._down[n.receiver] = job.resend
        else:
            self._attempt_all(notifier, job)

    def _attempt_all(self, notifier: Notifier, job: Job) -> DeliveryResult:
        """A new notification (in the spool already): the first attempt and the retries."""
        n = job.notification
        error = ""
        attempts = 0
        retry_after: float | None = None
        for retry in range(self._retries(notifier) + 1):
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
                return self._result(n, DELIVERED, job.attempts + attempts, "")
            if not retryable:
                self._dead(n, job.attempts + attempts, error)
                return self._result(n, FAILED, job.attempts + attempts, error)
        attempts += job.attempts
        if not self._spool_put(n, attempts, error):
            return self._result(n, FAILED, attempts, f"{error}; spool failed")
        log.warning("receiver %r did not take %s after %d attempts (%s); spooled",
                    n.receiver, n.id, attempts, error)
        return self._result(n, SPOOLED, attempts, error)

    def _attempt_once(self, notifier: Notifier, job: Job) -> bool:
        """A spooled notification: one try. True when delivered."""
        n = job.notification
        attempts = job.attempts + 1
        ok, retryable, error, _ = self._send(notifier, n)
        if ok:
            self._ack(n)
            self._result(n, DELIVERED, attempts, "")
        elif retryable:
            self.spool.record_attempt(n.id, error)
            self._result(n, SPOOLED, attempts, error)
        else:
            self._dead(n, attempts, error)
            self._result(n, FAILED, attempts, error)
        return ok

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

    def _spool_put(self, n: Notification, attempts: int, error: str) -> bool:
        try:
            self.spool.put(n, attempts, error)
        except OSError as exc:
            log.critical("cannot spool notification %s for %r: %s", n.id, n.receiver, exc)
            return False
        return True

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

    def _result(self, n: Notification, status: str, attempts: int, error: str) -> DeliveryResult:
        result = DeliveryResult(n.receiver, n.id, status, attempts, error,
                                n.alert.decision_id, n.body, self._now())
        on_result = self._on_result
        if on_result is not None:
            try:
                on_result(result)
            except Exception:  # noqa: BLE001 - recording must not stop delivery
                log.exception("on_result callback failed for %s", n.id)
        return result
