"""The delivery threads of ``ftwatch.alerting.notify``: one worker per receiver (SPEC N4: deciding
and acting never wait on a receiver).

The :class:`~ftwatch.alerting.notify.Sender` writes each notification to the spool first and
then hands it to its receiver's :class:`DeliveryWorker`, which sends it (with the retries,
backoff and jitter) in its own thread. One worker per receiver, not one per sender: a receiver
that accepts connections but never answers (webhook timeout x retries, about 27 s with the
defaults) would otherwise hold up every other receiver's alerts behind it. A receiver's
notifications still go out one at a time, in the order they were handed over. A worker never
calls into the pipeline: its results go on the sender's queue.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from ftwatch.alerting.alerts import Notification

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Job:
    """One notification for a worker.

    Attributes:
        notification: what to send (already in the spool).
        attempts: sends tried before (a spooled notification's count).
        resend: None for a new notification (the full retries); else the number of the
            resend pass it belongs to (one try; after a retryable failure the receiver's
            other notifications of the same pass are left in the spool).
    """

    notification: Notification
    attempts: int = 0
    resend: int | None = None


class DeliveryWorker:
    """A daemon thread that hands each submitted :class:`Job` to ``handle``, in order.

    Args:
        receiver: the receiver's name (names the thread).
        handle: called with each job in the worker's thread; must not raise (an exception
            is logged and the worker goes on).
        done: called with each job after ``handle`` returned (or raised).
    """

    def __init__(self, receiver: str, handle: Callable[[Job], None], done: Callable[[Job], None]):
        self.receiver = receiver
        self._handle = handle
        self._done = done
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"ftwatch-deliver-{receiver}",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; returns at once."""
        self._queue.put(job)

    def stop(self) -> None:
        """Let the thread end after the jobs already queued (returns at once)."""
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end; True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._handle(job)
            except Exception:  # noqa: BLE001 - one bad notification must not stop the receiver
                log.exception("delivery of %s to %r failed unexpectedly; it stays in the spool",
                              job.notification.id, self.receiver)
            finally:
                self._done(job)
