"""The event center (SPEC N3, N4): route, group, mute, inhibit and digest alerts; the dispatch
stage of Alertmanager's dispatch/notify split.

:class:`EventCenter` decides which receiver gets which alerts when; the
:class:`~ftwatch.alerting.notify.Sender` behind it renders, rate-limits, spools, retries and
sends (``ftwatch.alerting.notify``). The center only calls the sender's public steps:
``render_batch`` / ``send`` for a batch, ``skip`` for what it holds back, ``release`` /
``next_ready`` for what the rate limits let go, ``resend_pending`` and ``close``. Both have the
face of :class:`AlertPath` (what the recorder calls): ``dispatch(alert)``, ``tick()`` (call it
often: flushes due groups, releases rate-limited notifications, sends due digests),
``resend_pending()``, ``close()`` (at shutdown: every waiting group is sent or spooled) and
``take_results()`` (the delivery results, from the sender's queue).

One notification per (batch, receiver) (``Sender.render_batch`` for its id and text). A
resolved alert goes where its firing alert went: a receiver that had the firing one muted or
inhibited does not get the resolution either (recorded as such); a resolved inhibit source
inhibits nothing more. An Alertmanager receiver gets one notification per alert instead (its API
takes alerts, each with its own labels and ``endsAt``; it groups them itself). Muted and
inhibited notifications are recorded (status ``muted`` / ``inhibited``) and listed in the
receiver's daily digest; so are rate-limited ones (which are also delivered once the limit
allows).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typing import Protocol

from ftwatch.alerting.alerts import RESOLVABLE, Alert, Notification, notification_id
from ftwatch.alerting.grouping import Batch, Grouper, HeldStore, alert_key
from ftwatch.alerting.notify import Sender
from ftwatch.alerting.ratelimit import RATE_LIMITED, DigestBook, digest_text
from ftwatch.alerting.routing import EventView, Inhibitor, MuteWindows, Router
from ftwatch.bounded import BoundedDict
from ftwatch.config.limits import LimitsConfig
from ftwatch.events import DeliveryResult

log = logging.getLogger(__name__)

MUTED = "muted"
INHIBITED = "inhibited"


class AlertPath(Protocol):
    """What the pipeline (``Recorder``) calls on alerting: the event center, a bare
    :class:`~ftwatch.alerting.notify.Sender`, or :data:`NULL_ALERTS`."""

    def dispatch(self, alert: Alert) -> list[DeliveryResult]: ...

    def tick(self, now: float | None = None) -> list[DeliveryResult]: ...

    def resend_pending(self) -> int: ...

    def close(self) -> list[DeliveryResult]: ...

    def take_results(self) -> list[DeliveryResult]: ...


class NullAlerts:
    """No alerting configured: every alert goes nowhere."""

    def dispatch(self, alert: Alert) -> list[DeliveryResult]:
        return []

    def tick(self, now: float | None = None) -> list[DeliveryResult]:
        return []

    def resend_pending(self) -> int:
        return 0

    def close(self) -> list[DeliveryResult]:
        return []

    def take_results(self) -> list[DeliveryResult]:
        return []


NULL_ALERTS = NullAlerts()


def _locked(method):
    """Run a public method under the center's lock (the SDK's and the runner's calls may meet)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


class EventCenter:
    """Routes alerts to receivers through groups, mute windows, inhibit rules and rate limits.

    Args:
        alerting: ``Config.alerting`` (receivers, route, mute_time_intervals, inhibit_rules,
            rate_limits, digest, language).
        sender: the notify stage; its receivers are the configured ones (and its rate limiter
            the one from ``alerting.rate_limits``: ``ftwatch.alerting.ratelimit.RateLimiter.from_config``).
        now: wall clock, epoch seconds (``ftwatch.clock``; a FakeClock's ``time`` in tests).
        state_dir: where held alerts (``held/``) and the digest (``digest.json``) are kept;
            None keeps them in memory (tests).
        limits: the ``limits`` section (``ftwatch.config.limits``; default: its defaults):
            ``max_alert_groups`` bounds the groups (``grouping``), ``max_remembered_alerts`` the
            inhibit sources and the alerts whose resolution is held back (kind ``unsent_alert``).
    """

    def __init__(self, alerting: Any, sender: Sender, now: Callable[[], float],
                 state_dir: Path | None = None, limits: LimitsConfig | None = None):
        limits = limits or LimitsConfig()
        self.sender = sender
        self.now = now
        self._lock = threading.RLock()
        self.language = getattr(alerting, "language", "en")
        self.router = Router(alerting.route, list(sender.kinds))
        self.mutes = MuteWindows(alerting.mute_time_intervals)
        self.inhibitor = Inhibitor(alerting.inhibit_rules, limits.max_remembered_alerts)
        self.grouper = Grouper(limits.max_alert_groups)
        self.held = HeldStore(state_dir / "held") if state_dir is not None else None
        self.digest = DigestBook(state_dir / "digest.json" if state_dir is not None else None,
                                 alerting.digest)
        # (receiver, decision id) -> why its resolvable firing alert was not sent (muted /
        # inhibited): that alert's resolution is not sent to that receiver either
        self._unsent: dict[tuple[str, str], str] = BoundedDict(limits.max_remembered_alerts, "unsent_alert",
                                                               lru=False)

    # -- the AlertPath face -------------------------------------------------------------------

    @_locked
    def dispatch(self, alert: Alert) -> list[DeliveryResult]:
        """Route ``alert`` and send what is due now (all of it with the default route).

        Returns:
            The results of the notifications handled during this call (possibly of other
            groups that came due too); none while the alert waits in its group.
        """
        now = self.now()
        event = EventView.of(alert)
        self._observe(alert, now)
        matches = self.router.route(event)
        if not matches:
            log.info("alert %s (%s) matches no route; not sent", alert.decision_id, event.event_type)
            return []
        for match in matches:
            self.grouper.add(alert, match, now)
        results = self.tick(now)
        waiting = self.grouper.waiting(alert)
        if self.held is not None and waiting:
            self.held.put(alert, waiting)      # it waits in a group: keep it on disk until sent
        return results

    @_locked
    def resend_pending(self) -> int:
        """Resend spooled notifications (the sender's), then do what is due."""
        delivered = self.sender.resend_pending()
        self.tick()
        return delivered

    # -- time --------------------------------------------------------------------------------

    @_locked
    def recover(self) -> list[DeliveryResult]:
        """At start: alerts an earlier process left waiting in a group are sent now."""
        if self.held is None:
            return []
        results = []
        for alert, groups in self.held.load():
            now = self.now()
            self._observe(alert, alert.starts_at)
            matches = self.router.route(EventView.of(alert))
            if not matches:
                log.warning("held alert %s matches no route of this config; kept in %s",
                            alert.decision_id, self.held.directory)
            # only the groups it still waited in (the others had it); with a changed config that
            # has none of them, every route it matches now: sent twice rather than lost
            for match in [m for m in matches if m.group_key in groups] or matches:
                self.grouper.add(alert, match, now)
        for batch in self.grouper.flush_all(self.now()):
            results += self._send(batch, self.now())
        return results + self._digests(self.now())

    @_locked
    def tick(self, now: float | None = None) -> list[DeliveryResult]:
        """Send the groups that came due, release rate-limited notifications whose receiver has
        a token again, and send due digests. Cheap when nothing is due."""
        now = self.now() if now is None else now
        results: list[DeliveryResult] = []
        for batch in self.grouper.due(now):
            results += self._send(batch, now)
        self.sender.release(now)
        return results + self._digests(now)

    @_locked
    def close(self) -> list[DeliveryResult]:
        """Shutdown: every alert still waiting in a group is sent (or spooled) now, and a due
        digest goes out; then the sender's delivery workers get a bounded time to finish
        (``Sender.close``: what they have not delivered stays in the spool for the next
        start). Nothing waits in memory afterwards."""
        now = self.now()
        results: list[DeliveryResult] = []
        for batch in self.grouper.flush_all(now):
            results += self._send(batch, now)
        results += self._digests(now)
        return results + self.sender.close()

    def take_results(self) -> list[DeliveryResult]:
        """The delivery results known since the last call (``Sender.take_results``)."""
        return self.sender.take_results()

    def next_due(self) -> float | None:
        """The earliest time (epoch seconds) :meth:`tick` has something to do, or None."""
        times = [t for t in (self.grouper.next_due(), self.sender.next_ready(self.now())) if t is not None]
        return min(times, default=None)

    # -- sending -----------------------------------------------------------------------------

    def _observe(self, alert: Alert, at: float) -> None:
        """A firing alert may inhibit others from ``at``; a resolved one ends its inhibition."""
        if alert.status == "firing":
            self.inhibitor.observe(alert_key(alert), EventView.of(alert), at)
        else:
            self.inhibitor.end(alert.decision_id, alert.ends_at if alert.ends_at is not None else at)

    def _send(self, batch: Batch, now: float) -> list[DeliveryResult]:
        results: list[DeliveryResult] = []
        live: list[Alert] = []
        blocked: list[tuple[Alert, str]] = []
        for alert in batch.alerts:
            # a resolution is judged by its firing alert: sent where that was sent (it closes
            # it), held back where that was not (the receiver never saw it)
            why = (self.inhibitor.inhibited(EventView.of(alert), now, alert_key(alert))
                   if alert.status == "firing" else None)
            (blocked.append((alert, str(why))) if why is not None else live.append(alert))
        muted = self.mutes.active(batch.match.mute_windows, now)
        kinds = self.sender.kinds
        for receiver in batch.match.receivers:
            if receiver not in kinds:
                log.error("route %s names unknown receiver %r", batch.match.path, receiver)
                continue
            for alert, why in blocked:
                if alert.event_type in RESOLVABLE:
                    self._unsent[(receiver, alert.decision_id)] = INHIBITED
                if not batch.repeat:
                    results.append(self._skip(receiver, alert, INHIBITED, why, now))
            mine = []
            for alert in live:
                held = (self._unsent.pop((receiver, alert.decision_id), None)
                        if alert.status != "firing" else None)
                if held is not None:     # no digest line: the digest lists the firing one
                    results.append(self._skip(receiver, alert, held,
                                              f"{held}: its firing alert was not sent", now,
                                              digest=False))
                else:
                    mine.append(alert)
            if not mine:
                continue
            if muted:
                if not batch.repeat:
                    why = f"muted: {', '.join(muted)}"
                    for alert in mine:
                        if alert.status == "firing" and alert.event_type in RESOLVABLE:
                            self._unsent[(receiver, alert.decision_id)] = MUTED
                        results.append(self._skip(receiver, alert, MUTED, why, now))
                continue
            # Alertmanager takes alerts, not texts: each alert of the batch is posted on its own
            # (with its own labels and endsAt) and Alertmanager groups them by its own routes
            parts = [[a] for a in mine] if kinds[receiver] == "alertmanager" else [mine]
            for part in parts:
                for alert in part:       # (a repeat may bring what was inhibited at first)
                    self._unsent.pop((receiver, alert.decision_id), None)
                result = self.sender.send(self.sender.render_batch(receiver, part, batch.key, batch.repeat))
                if result.error.startswith(RATE_LIMITED):
                    for alert in part:
                        self.digest.add(receiver, alert, RATE_LIMITED, now)
                results.append(result)
        free = self.grouper.done(batch)
        if self.held is not None and not batch.repeat:
            for alert in batch.alerts:
                if alert_key(alert) in free:
                    self.held.remove(alert_key(alert))
                else:               # still waiting in another group: only that one is left
                    self.held.put(alert, self.grouper.waiting(alert))
        return results

    def _skip(self, receiver: str, alert: Alert, status: str, why: str, now: float,
              digest: bool = True) -> DeliveryResult:
        if digest:
            self.digest.add(receiver, alert, why, now)
        return self.sender.skip(receiver, alert, status, why)

    def _digests(self, now: float) -> list[DeliveryResult]:
        results = []
        for receiver, entries in self.digest.due(now).items():
            if receiver not in self.sender.kinds:
                continue
            title, body = digest_text(receiver, entries, self.language)
            upto = max(e.time for e in entries)
            key = f"digest{int(upto)}"             # no decision: the alert names itself
            alert = Alert({"alertname": "ftwatch_digest", "event_type": "digest", "severity": "info",
                           "job": "*"}, {"summary": title, "description": f"daily digest of {len(entries)} alerts"},
                          "firing", upto, None, id=key)
            nid = notification_id(key, receiver)
            results.append(self.sender.send(Notification(receiver, alert, title, body, nid)))
            self.digest.clear(receiver, upto)
        return results
