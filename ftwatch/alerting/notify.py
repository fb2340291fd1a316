"""Sending alerts to receivers, never losing one (SPEC N4): the notify stage, after
``ftwatch.alerting.dispatch`` routed and grouped them (Alertmanager's dispatch/notify split).

One notification goes down a chain of steps, each one call from :class:`Sender`::

    render (render / render_batch: ``compose``) -> rate-limit (_submit: the limiter's token)
      -> spool (write-ahead) -> retry (``retry.Retrier.attempt_all``: backoff with jitter)
      -> send (``Retrier._send``) -> result (``Retrier.result``: onto the results queue)

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

This module is the receivers' registry and the sender's bookkeeping: the steps that share one
lock, the set of notifications in flight and the resend pass stay in one class (split over files
they would reach into each other's state again, what the center did to the old dispatcher). What
needs none of that state is beside it: a notification's text, title and id
(``ftwatch.alerting.compose``), one notification's attempts, backoff and spool outcome
(``ftwatch.alerting.retry``), the threads (``ftwatch.alerting.workers``).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time as _time
from typing import Callable, Iterable, Sequence

from ftwatch.alerting.alerts import Alert, Notification
from ftwatch.alerting.compose import compose, compose_batch
from ftwatch.alerting.notifiers import Notifier
from ftwatch.alerting.ratelimit import RATE_LIMITED, RateLimiter
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.retry import DELIVERED, FAILED, SPOOLED, Retrier
from ftwatch.alerting.spool import Spool
from ftwatch.alerting.workers import DeliveryWorker, Job
from ftwatch.events import DeliveryResult

__all__ = ["CLOSE_WAIT_CAP", "DELIVERED", "FAILED", "QUEUED", "SHUTDOWN", "SPOOLED", "DeliveryResult",
           "Sender"]

log = logging.getLogger(__name__)

QUEUED = "queued"
CLOSE_WAIT_CAP = 30.0   # seconds: the most a shutdown waits for the delivery workers
SHUTDOWN = "not sent before shutdown; kept in the spool for the next start"


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
        self._now = now
        self.limiter = limiter
        self.background = background
        self.language = language
        self.results: queue.SimpleQueue[DeliveryResult] = queue.SimpleQueue()
        self._lock = threading.RLock()
        self._unknown_warned: set[str] = set()
        self._closing = threading.Event()     # close()'s wait is over: no more waits or sends
        self._retry = Retrier(spool, self.results, now, max_retries=max_retries, backoff=backoff, jitter=jitter,
                              rng=rng, max_delay=max_delay, sleep=sleep, closing=self._closing,
                              background=background)
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

    # -- render ------------------------------------------------------------------------------

    def render(self, receiver: str, alert: Alert) -> Notification:
        """Render ``alert`` for one receiver (``ftwatch.alerting.compose``). A broken user
        template falls back to the built-in one (logged), so a template mistake never loses an
        alert.

        Raises:
            KeyError: the receiver is not configured.
        """
        return compose(self.notifiers[receiver], self.renderer, alert)

    def render_batch(self, receiver: str, alerts: Sequence[Alert], group_key: str = "",
                     repeat: int = 0) -> Notification:
        """One notification for a batch of alerts of one group (``compose.compose_batch``): a
        batch of one is exactly :meth:`render`'s; several join their texts under one title, with
        id ``grp<hash of the alert keys>-<receiver>``; a repeat adds ``~repeat<n>``.

        Args:
            receiver: the receiver's name.
            alerts: at least one alert.
            group_key: the group's key (``route.routes.0{job=a}``), named in the title.
            repeat: 0 for a first notification, n for the n-th repeat of the same content.

        Raises:
            KeyError: the receiver is not configured.
        """
        return compose_batch(self.notifiers[receiver], self.renderer, alerts, group_key, repeat, self.language)

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
        return self._retry.result(self.render(receiver, alert), status, 0, reason)

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
            return self._retry.result(n, SPOOLED, 0, "already pending in the spool")
        if self.limiter is not None and not self.limiter.take(n.receiver, self._now()):
            error = f"{RATE_LIMITED}: held until the receiver's rate limit allows it"
            if not self._retry.spool_put(n, 0, error):
                return self._retry.result(n, FAILED, 0, f"{error}; spool failed")
            return self._retry.result(n, SPOOLED, 0, error)
        self._retry.spool_put(n, 0, "")    # write-ahead: on disk before the first attempt
        if not self._async(notifier):
            return self._retry.attempt_all(notifier, Job(n))
        if self._closed:
            return self._retry.result(n, SPOOLED, 0, SHUTDOWN)
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
                elif self._retry.attempt_once(notifier, job):
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
        waits = [self._retry.longest(n) for n in self.notifiers.values() if self._async(n)]
        return min(CLOSE_WAIT_CAP, max(waits, default=0.0))

    # -- sending ------------------------------------------------------------------------------

    def _async(self, notifier: Notifier) -> bool:
        return self.background and not getattr(notifier, "inline", False)

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
            self._retry.result(n, SPOOLED, job.attempts, SHUTDOWN)
            return
        if job.resend is not None:
            if self._down.get(n.receiver) == job.resend:
                return                         # failed earlier in this pass: left in the spool
            if not self._retry.attempt_once(notifier, job) and self.spool.has(n.id):
                self._down[n.receiver] = job.resend
        else:
            self._retry.attempt_all(notifier, job)
