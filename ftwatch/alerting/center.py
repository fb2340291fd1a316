"""The event center (SPEC N3, N4): route, group, mute, inhibit, rate-limit and digest alerts.

:class:`EventCenter` sits in front of the :class:`~ftwatch.alerting.dispatcher.Dispatcher`
(which stays the delivery core: rendering, the write-ahead spool, the delivery workers,
retries with backoff and jitter) and has
the same ``dispatch(alert)`` / ``resend_pending()`` face, plus :meth:`EventCenter.tick` (call it
often: flushes due groups, releases rate-limited notifications, sends due digests) and
:meth:`EventCenter.close` (at shutdown: every waiting group is sent or spooled).

One notification per (batch, receiver): a batch of one alert is exactly the notification the
Dispatcher would make (id ``<decision id>-<receiver>``); a batch of several joins their rendered
texts under one title, with id ``grp<hash of the decision ids>-<receiver>``; a repeat adds
``~repeat<n>``. A resolved alert goes where its firing alert went: a receiver that had the
firing one muted or inhibited does not get the resolution either (recorded as such); a
resolved inhibit source inhibits nothing more. An Alertmanager receiver gets one notification per alert instead (its API takes
alerts, each with its own labels and ``endsAt``; it groups them itself). Muted and inhibited notifications are recorded (status ``muted`` /
``inhibited``) and listed in the receiver's daily digest; so are rate-limited ones (which are
also delivered once the limit allows).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ftwatch.alerting.alerts import RESOLVABLE, Alert, Notification, notification_id
from ftwatch.alerting.dispatcher import DeliveryResult, Dispatcher
from ftwatch.alerting.grouping import Batch, Grouper, HeldStore, alert_key
from ftwatch.alerting.ratelimit import (
    RATE_LIMITED,
    DigestBook,
    RateLimiter,
    digest_text,
)
from ftwatch.alerting.routing import EventView, Inhibitor, MuteWindows, Router
from ftwatch.events import Action, Decision, Target

log = logging.getLogger(__name__)

MUTED = "muted"
INHIBITED = "inhibited"
_RANK = {"critical": 0, "warning": 1, "info": 2}


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
        dispatcher: the delivery core; its receivers are the configured ones. Its ``limiter``
            is set from ``alerting.rate_limits`` unless it has one.
        now: wall clock, epoch seconds (``ftwatch.clock``; a FakeClock's ``time`` in tests).
        state_dir: where held alerts (``held/``), the digest (``digest.json``) and the rate-limit
            log (``ratelimit.json``) are kept;
            None keeps them in memory (tests).
    """

    def __init__(self, alerting: Any, dispatcher: Dispatcher, now: Callable[[], float],
                 state_dir: Path | None = None):
        self.dispatcher = dispatcher
        self.now = now
        self._lock = threading.RLock()
        self.language = getattr(alerting, "language", "en")
        names = list(dispatcher.notifiers)
        self.router = Router(alerting.route, names)
        self.mutes = MuteWindows(alerting.mute_time_intervals)
        self.inhibitor = Inhibitor(alerting.inhibit_rules)
        self.grouper = Grouper()
        if dispatcher.limiter is None:
            kinds = {n.name: n.kind for n in dispatcher.notifiers.values()}
            dispatcher.limiter = RateLimiter.from_config(
                alerting.rate_limits, kinds, now(), state_dir / "ratelimit.json" if state_dir is not None else None)
        self.limiter = dispatcher.limiter
        self.held = HeldStore(state_dir / "held") if state_dir is not None else None
        self.digest = DigestBook(state_dir / "digest.json" if state_dir is not None else None,
                                 alerting.digest)
        # (receiver, decision id) -> why its resolvable firing alert was not sent (muted /
        # inhibited): that alert's resolution is not sent to that receiver either
        self._unsent: dict[tuple[str, str], str] = {}

    # -- the Dispatcher's face ---------------------------------------------------------------

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
        """Resend spooled notifications (the Dispatcher's), then do what is due."""
        delivered = self.dispatcher.resend_pending()
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
        ready = self.limiter.ready(now) if self.limiter is not None else []
        if ready:
            self.dispatcher.resend_pending(set(ready))
        return results + self._digests(now)

    @_locked
    def close(self) -> list[DeliveryResult]:
        """Shutdown: every alert still waiting in a group is sent (or spooled) now, and a due
        digest goes out; then the dispatcher's delivery workers get a bounded time to finish
        (``Dispatcher.close``: what they have not delivered stays in the spool for the next
        start). Nothing waits in memory afterwards."""
        now = self.now()
        results: list[DeliveryResult] = []
        for batch in self.grouper.flush_all(now):
            results += self._send(batch, now)
        results += self._digests(now)
        return results + self.dispatcher.close()

    def next_due(self) -> float | None:
        """The earliest time (epoch seconds) :meth:`tick` has something to do, or None."""
        times = [t for t in (self.grouper.next_due(),
                             self.limiter.next_ready(self.now()) if self.limiter else None) if t is not None]
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
        for receiver in batch.match.receivers:
            notifier = self.dispatcher.notifiers.get(receiver)
            if notifier is None:
                log.error("route %s names unknown receiver %r", batch.match.path, receiver)
                continue
            for alert, why in blocked:
                if alert.event_type in RESOLVABLE:
                    self._unsent[(receiver, alert.decision_id)] = INHIBITED
                if not batch.repeat:
                    results.append(self._skip(notifier, alert, INHIBITED, why, now))
            mine = []
            for alert in live:
                held = (self._unsent.pop((receiver, alert.decision_id), None)
                        if alert.status != "firing" else None)
                if held is not None:     # no digest line: the digest lists the firing one
                    results.append(self._skip(notifier, alert, held,
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
                        results.append(self._skip(notifier, alert, MUTED, why, now))
                continue
            # Alertmanager takes alerts, not texts: each alert of the batch is posted on its own
            # (with its own labels and endsAt) and Alertmanager groups them by its own routes
            parts = [[a] for a in mine] if notifier.kind == "alertmanager" else [mine]
            for part in parts:
                for alert in part:       # (a repeat may bring what was inhibited at first)
                    self._unsent.pop((receiver, alert.decision_id), None)
                result = self.dispatcher.deliver(self._notification(notifier, part, batch))
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

    def _skip(self, notifier: Any, alert: Alert, status: str, why: str, now: float,
              digest: bool = True) -> DeliveryResult:
        if digest:
            self.digest.add(notifier.name, alert, why, now)
        return self.dispatcher.note(self.dispatcher.notification(notifier, alert), status, why)

    def _notification(self, notifier: Any, alerts: list[Alert], batch: Batch) -> Notification:
        """One notification for a batch (see the module doc for ids)."""
        suffix = f"~repeat{batch.repeat}" if batch.repeat else ""
        if len(alerts) == 1:
            n = self.dispatcher.notification(notifier, alerts[0])
            return replace(n, id=n.id + suffix) if suffix else n
        alerts = sorted(alerts, key=lambda a: (_RANK.get(a.severity, 3), a.starts_at))
        parts = [self.dispatcher.notification(notifier, a) for a in alerts]
        ids = ",".join(sorted(alert_key(a) for a in alerts))
        digest = hashlib.sha1(ids.encode()).hexdigest()[:16]
        group = batch.key[batch.key.find("{"):]
        title = (f"【ftwatch】{len(alerts)} 条告警 {group}" if self.language == "zh"
                 else f"[ftwatch] {len(alerts)} alerts {group}")
        body = title + "\n\n" + "\n\n---\n\n".join(p.body for p in parts)
        first = alerts[0]
        annotations = {**first.annotations, "group_key": batch.key, "grouped_alerts": ids}
        nid = notification_id(f"grp{digest}", notifier.name, first.status) + suffix
        return Notification(notifier.name, replace(first, annotations=annotations), title, body, nid)

    def _digests(self, now: float) -> list[DeliveryResult]:
        results = []
        for receiver, entries in self.digest.due(now).items():
            if receiver not in self.dispatcher.notifiers:
                continue
            title, body = digest_text(receiver, entries, self.language)
            upto = max(e.time for e in entries)
            decision = Decision(upto, Action.NOTIFY, Target("*"), None,
                                f"daily digest of {len(entries)} alerts", 0, 0)
            alert = Alert({"alertname": "ftwatch_digest", "event_type": "digest", "severity": "info",
                           "job": "*"}, {"summary": title}, "firing", upto, None, decision)
            nid = notification_id(f"digest{int(upto)}", receiver)
            results.append(self.dispatcher.deliver(Notification(receiver, alert, title, body, nid)))
            self.digest.clear(receiver, upto)
        return results
