"""Sending alerts to receivers, never losing one (SPEC N4): the notify stage, after
``ftwatch.alerting.dispatch`` routed and grouped them (Alertmanager's dispatch/notify split).

One notification goes down a chain of steps, each one method of :class:`Sender`::

    render (render / render_batch) -> rate-limit (_submit: the limiter's token)
      -> spool (write-ahead) -> retry (_attempt_all: backoff with jitter) -> send (_send)
      -> result (_result: onto the results queue)

Write-ahead: every notification is put in the on-disk :class:`~ftwatch.alerting.spool.Spool`
before the first attempt to send it, and leaves it only once delivered (``ack``) or refused for
good (moved to ``<spool>/dead/``). A crash or a SIGKILL at any moment therefore leaves every
undelivered notification on disk, and :meth:`Sender.resend_pending` (at start and periodically)
sends it; an acked one is never sent again.

Sending: on a retryable failure a new notification is retried with backoff (``backoff[i]``
seconds times a jitter factor) up to ``max_retries`` times; what still fails stays in the spool
(status ``spooled``) for the next resend pass. With ``background=True`` (``ftwatch run`` and
``ftwatch watch``) the sends happen in one :class:`~ftwatch.alerting.workers.DeliveryWorker`
thread per receiver: :meth:`Sender.send` returns right after the spool write (status
``queued``). Receivers whose ``send`` never blocks (``inline = True``: the console) are still
sent in the caller's thread, so the terminal shows the alert where it happened. With
``background=False`` (the default, for tests and tools) everything happens in the caller's
thread.

Results: every final result (delivered, spooled, failed, muted, inhibited; never ``queued``) is
put on :attr:`Sender.results`, a queue, in whichever thread it was known; the pipeline's thread
takes them (:meth:`Sender.take_results`, from ``Recorder.resend_due`` and after each dispatch)
and stores them. Nothing from here calls back into the pipeline. The calls also return the
results they produced in the caller's thread (tests and tools read those).

Rate limits: the :class:`~ftwatch.alerting.ratelimit.RateLimiter` belongs to the sender. A
notification whose receiver has no token left is spooled at once (error ``rate limited``) and
sent by :meth:`Sender.release` once a token is back; the limiter is only consulted in the
caller's thread. Each notification carries a stable id (decision id + receiver) sent as the
idempotency key, so a resend after a lost response does not show twice at a receiver that
honours it.

Size: about 480 lines, one class, on purpose: the steps share one lock, the set of
notifications in flight and the resend pass; split over files they would reach into each
other's state again (what the center did to the old dispatcher). The threads are apart
(``ftwatch.alerting.workers``).
"""

from __future__ import annotations

import hashlib
import logging
import queue
import random
import threading
import time as _time
from dataclasses import replace
from typing import Callable, Iterable, Sequence

from ftwatch.alerting.alerts import Alert, Notification, notification_id
from ftwatch.alerting.notifiers import Notifier
from ftwatch.alerting.ratelimit import RATE_LIMITED, RateLimiter
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.spool import Spool
from ftwatch.alerting.workers import DeliveryWorker, Job
from ftwatch.errors import NotifyError, TemplateError
from ftwatch.events import DeliveryResult

__all__ = ["CLOSE_WAIT_CAP", "DELIVERED", "FAILED", "QUEUED", "SHUTDOWN", "SPOOLED", "DeliveryResult",
           "Sender"]

log = logging.getLogger(__name__)

DELIVERED = "delivered"
SPOOLED = "spooled"
FAILED = "failed"
QUEUED = "queued"
CLOSE_WAIT_CAP = 30.0   # seconds: the most a shutdown waits for the delivery workers
SHUTDOWN = "not sent before shutdown; kept in the spool for the next start"
_RANK = {"critical": 0, "warning": 1, "info": 2}


class Sender:
    """Renders, rate-limits, spools, retries and sends notifications; reports on a queue.

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
        max_delay: cap in seconds on a receiver's ``Retry-After``.
        limiter: per-receiver rate limits (None: none); consulted before each send.
        background: send from one worker thread per receiver (see the module doc).
        language: ``en`` or ``zh``: the title of a grouped notification.

    Raises:
        ValueError: for duplicate receiver names or a negative max_retries.

    Calls are serialised by a lock. Without ``background``, ``send`` may sleep while
    holding it; with it, the lock is only held for spool writes and queueing.
    """

    def __init__(self, notifiers: Iterable[Notifier], renderer: TemplateRenderer, spool: Spool,
                 max_retries: int = 3, backoff: Sequence[float] = (0.5, 2.0, 5.0),
                 jitter: float = 0.2, sleep: Callable[[float], None] | None = None,
                 now: Callable[[], float] = _time.time, rng: random.Random | None = None,
                 max_delay: float = 60.0, limiter: RateLimiter | None = None,
                 background: bool = False, language: str = "en"):
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
        self.max_delay = max_delay
        self.limiter = limiter
        self.background = background
        self.language = language
        self.results: queue.SimpleQueue[DeliveryResult] = queue.SimpleQueue()
        self._lock = threading.RLock()
        self._unknown_warned: set[str] = set()
        self._closing = threading.Event()     # close()'s wait is over: no more waits or sends
        self._closed = False
        self._idle = threading.Condition()
        self._queued: set[str] = set()        # ids handed to a worker and not finished
        self._workers: dict[str, DeliveryWorker] = {}
        self._pass = 0                        # resend passes (background)
        self._down: dict[str, int] = {}       # receiver -> the pass it failed in

    @property
    def kinds(self) -> dict[str, str]:
        """Receiver name -> its kind (``webhook``, ``alertmanager`` ...), in config order."""
        return {name: n.kind for name, n in self.notifiers.items()}

    def take_results(self) -> list[DeliveryResult]:
        """Every result put on :attr:`results` since the last call, oldest first (call it from
        the pipeline's thread; the workers only ever put)."""
        out = []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                return out

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based), jitter included."""
        base = self.backoff[min(retry, len(self.backoff) - 1)]
        return max(0.0, base * (1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)))

    # -- render ------------------------------------------------------------------------------

    def render(self, receiver: str, alert: Alert) -> Notification:
        """Render ``alert`` for one receiver. A broken user template falls back to the
        built-in one (logged), so a template mistake never loses an alert.

        Raises:
            KeyError: the receiver is not configured.
        """
        notifier = self.notifiers[receiver]
        try:
            text = self.renderer.render(notifier.kind, alert)
        except TemplateError as exc:
            log.error("alert template for receiver %r failed, using the built-in one: %s",
                      notifier.name, exc)
            text = self.renderer.render(notifier.kind, alert, builtin_only=True)
        title = text.splitlines()[0] if text else alert.annotations.get("summary", "")
        nid = notification_id(alert.decision_id, notifier.name, alert.status)
        return Notification(notifier.name, alert, title, text, nid)

    def render_batch(self, receiver: str, alerts: Sequence[Alert], group_key: str = "",
                     repeat: int = 0) -> Notification:
        """One notification for a batch of alerts of one group: a batch of one is exactly
        :meth:`render`'s; several join their texts under one title, with id ``grp<hash of the
        alert keys>-<receiver>``; a repeat adds ``~repeat<n>``.

        Args:
            receiver: the receiver's name.
            alerts: at least one alert.
            group_key: the group's key (``route.routes.0{job=a}``), named in the title.
            repeat: 0 for a first notification, n for the n-th repeat of the same content.
        """
        suffix = f"~repeat{repeat}" if repeat else ""
        if len(alerts) == 1:
            n = self.render(receiver, alerts[0])
            return replace(n, id=n.id + suffix) if suffix else n
        alerts = sorted(alerts, key=lambda a: (_RANK.get(a.severity, 3), a.starts_at))
        parts = [self.render(receiver, a) for a in alerts]
        ids = ",".join(sorted(a.key for a in alerts))
        digest = hashlib.sha1(ids.encode()).hexdigest()[:16]
        group = group_key[group_key.find("{"):]
        title = (f"【ftwatch】{len(alerts)} 条告警 {group}" if self.language == "zh"
                 else f"[ftwatch] {len(alerts)} alerts {group}")
        body = title + "\n\n" + "\n\n---\n\n".join(p.body for p in parts)
        first = alerts[0]
        annotations = {**first.annotations, "group_key": group_key, "grouped_alerts": ids}
        nid = notification_id(f"grp{digest}", receiver, first.status) + suffix
        return Notification(receiver, replace(first, annotations=annotations), title, body, nid)

    # -- send --------------------------------------------------------------------------------

    def dispatch(self, alert: Alert) -> list[DeliveryResult]:
        """Deliver ``alert`` to every receiver (no routing: a sender used on its own).

        Returns:
            One DeliveryResult per receiver, in receiver order (status ``queued`` for those
            handed to a delivery worker). Never raises for a receiver's failure; those are in
            the results.
        """
        with self._lock:
            return [self._submit(n, self.render(n.name, alert)) for n in self.notifiers.values()]

    def send(self, n: Notification) -> DeliveryResult:
        """Deliver one rendered notification to its receiver (rate limit, spool, retries).

        Raises:
            KeyError: the receiver is not configured.
        """
        with self._lock:
            return self._submit(self.notifiers[n.receiver], n)

    def skip(self, receiver: str, alert: Alert, status: str, reason: str) -> DeliveryResult:
        """Record ``alert`` not sent to ``receiver`` on purpose (status ``muted`` or
        ``inhibited``, ``reason`` why)."""
        return self._result(self.render(receiver, alert), status, 0, reason)

    def tick(self, now: float | None = None) -> list[DeliveryResult]:
        """What is due without routing: rate-limited notifications whose receiver has a token
        again (:meth:`release`). Returns [] (their results go on the queue)."""
        self.release(self._now() if now is None else now)
        return []

    def release(self, now: float) -> int:
        """Resend the rate-limited notifications of the receivers that have a token again at
        ``now`` (epoch s). Returns how many were delivered (or handed to a worker)."""
        ready = self.limiter.ready(now) if self.limiter is not None else []
        return self.resend_pending(set(ready)) if ready else 0

    def next_ready(self, now: float) -> float | None:
        """When (epoch s) a rate-limited receiver next has a token, or None."""
        return self.limiter.next_ready(now) if self.limiter is not None else None

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
        (their results put on the queue), at most ``timeout`` seconds (None: no limit).
        Returns True when nothing is left with them. A no-op without ``background``."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._queued, timeout)

    def close(self, timeout: float | None = None) -> list[DeliveryResult]:
        """Shutdown: let the workers go on with what they have (sends, retries, backoff) for at
        most ``timeout`` seconds (None: :meth:`close_wait`); then their waits are cut short and
        what they have not sent stays in the spool, where it already is, for the next start
        (its result, status ``spooled``, may still reach the queue afterwards). Later
        notifications are only spooled. Returns at once without ``background``.

        Returns:
            [] (the workers' results go on the queue).
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
        """In a worker's thread: send one job (no sender lock held while sending)."""
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
        self.results.put(result)
        return result
