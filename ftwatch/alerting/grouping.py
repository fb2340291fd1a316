"""Grouping of routed alerts (SPEC N3): group_wait, group_interval, repeat_interval; held alerts on disk.

Alerts that end in the same route with the same ``group_by`` label values form a group. A new
group's first notification goes out ``group_wait`` seconds after its first alert; later alerts of
the group go out together, at most every ``group_interval`` seconds; when nothing new came, the last
notification is sent again after ``repeat_interval`` seconds (0: never). Unlike Alertmanager, a
notification carries the alerts that are new since the last one (ftwatch's alerts are events;
a resolved alert is a new one), and "the same content" means the same alerts (decision ids), not
the same labels: two restarts with equal labels are two alerts. A repeat re-sends the firing
alerts of the last notification that have not resolved since; resolved alerts are never repeated
(as in Alertmanager), and a group with nothing left firing is forgotten. Most alerts (failures,
notices) never resolve, so repeats stop :data:`REPEAT_HORIZON` seconds after the group's last new
alert (then the group is forgotten), so a long ``ftwatch watch`` does not remind of a job that
failed last week.

Bounded (issue 17, ``limits.max_alert_groups``): a new group beyond the cap forgets the group
idle longest (nothing waiting; its repeats stop), counted as ``alert_group`` in
``ftwatch_state_evicted_total``; when every group has alerts waiting, the oldest of them is due
at once instead (sent early, never dropped), and forgotten by a later new group once idle.

Time is whatever the caller passes (epoch seconds from ``ftwatch.clock``); nothing here sleeps.
A :class:`HeldStore` keeps every alert still waiting in a group on disk, so an ftwatch killed
during a group's wait sends it at its next start (``ftwatch.alerting.dispatch``).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ftwatch.alerting.alerts import Alert
from ftwatch.bounded import EVICTIONS
from ftwatch.config.limits import MAX_ALERT_GROUPS
from ftwatch.alerting.routing import RouteMatch
from ftwatch.alerting.spool import alert_from_dict, alert_to_dict

log = logging.getLogger(__name__)

REPEAT_HORIZON = 86400.0
"""Seconds after a group's last new alert during which it may be repeated (one day)."""


def alert_key(alert: Alert) -> str:
    """An alert's identity while it waits: its decision id, plus ``~<status>`` unless firing
    (a decision's firing and resolved alerts are two alerts)."""
    return alert.key


@dataclass(frozen=True)
class Batch:
    """One notification's worth of a group.

    Attributes:
        key: the group key (route path + group_by label values).
        match: the route the group belongs to (receivers, timing, mute windows).
        alerts: the alerts to send, oldest first.
        repeat: 0 for new alerts, n for the n-th re-send of the same alerts.
    """

    key: str
    match: RouteMatch
    alerts: tuple[Alert, ...]
    repeat: int = 0


@dataclass
class _Group:
    match: RouteMatch
    pending: list[Alert] = field(default_factory=list)
    next_flush: float = 0.0
    last_sent: float | None = None
    last_batch: tuple[Alert, ...] = ()
    repeats: int = 0
    last_new: float = 0.0


class Grouper:
    """The groups of one process.

    Alerts are added with :meth:`add`; :meth:`due` hands out the batches whose time came;
    :meth:`flush_all` hands out everything still waiting (at shutdown). The caller sends each
    batch and then calls :meth:`done` so the alert stops being held.

    Args:
        max_groups: ``limits.max_alert_groups`` (module docstring, "Bounded").
    """

    def __init__(self, max_groups: int = MAX_ALERT_GROUPS) -> None:
        self.max_groups = max_groups
        self.groups: dict[str, _Group] = {}     # least recently sent first (a group sending moves last)
        self._waiting: dict[str, int] = {}      # alert id -> groups where it waits

    def add(self, alert: Alert, match: RouteMatch, now: float) -> None:
        """Put ``alert`` into its group of ``match`` at ``now`` (epoch seconds)."""
        group = self.groups.get(match.group_key)
        if group is None:
            if len(self.groups) >= self.max_groups:
                self._make_room(now)
            group = self.groups[match.group_key] = _Group(match, next_flush=now + match.timing.group_wait)
        elif not group.pending and group.last_sent is not None:
            # Next notification: group_interval after the last one, never before now.
            group.next_flush = max(now, group.last_sent + match.timing.group_interval)
        group.match = match
        group.pending.append(alert)
        key = alert_key(alert)
        self._waiting[key] = self._waiting.get(key, 0) + 1

    def waiting(self, alert: Alert) -> list[str]:
        """The keys of the groups where the alert waits (empty: none)."""
        key = alert_key(alert)
        if key not in self._waiting:
            return []
        return [k for k, g in self.groups.items() if any(alert_key(a) == key for a in g.pending)]

    def next_due(self) -> float | None:
        """The earliest time (epoch seconds) something may be due, or None."""
        times = [g.next_flush for g in self.groups.values() if g.pending]
        times += [min(g.last_sent + g.match.timing.repeat_interval, g.last_new + REPEAT_HORIZON)
                  for g in self.groups.values()
                  if not g.pending and g.last_sent is not None and g.match.timing.repeat_interval > 0]
        return min(times, default=None)

    def due(self, now: float) -> list[Batch]:
        """The batches due at ``now``: new alerts of groups whose wait or interval passed, and
        re-sends of groups whose repeat_interval passed with nothing new."""
        out: list[Batch] = []
        for key, group in list(self.groups.items()):
            timing = group.match.timing
            if group.pending and now >= group.next_flush:
                out.append(self._take(key, group, now))
            elif (not group.pending and group.last_sent is not None and timing.repeat_interval > 0
                  and now >= group.last_new + REPEAT_HORIZON):
                del self.groups[key]       # repeated long enough: forget it
            elif (not group.pending and group.last_sent is not None and timing.repeat_interval > 0
                  and now >= group.last_sent + timing.repeat_interval and not group.last_batch):
                del self.groups[key]       # everything it said has resolved: nothing to remind of
            elif (not group.pending and group.last_sent is not None and timing.repeat_interval > 0
                  and now >= group.last_sent + timing.repeat_interval):
                group.repeats += 1
                group.last_sent = now
                out.append(Batch(key, group.match, group.last_batch, group.repeats))
            elif (not group.pending and group.last_sent is not None and timing.repeat_interval <= 0
                  and now >= group.last_sent + timing.group_interval):
                del self.groups[key]       # idle and nothing to repeat: a new alert starts afresh
        return out

    def flush_all(self, now: float) -> list[Batch]:
        """Every group's waiting alerts as batches, now (shutdown: nothing is left behind)."""
        return [self._take(key, g, now) for key, g in list(self.groups.items()) if g.pending]

    def done(self, batch: Batch) -> list[str]:
        """The batch was handled; returns the :func:`alert_key` of its alerts that wait in no
        group any more."""
        if batch.repeat:
            return []
        free = []
        for alert in batch.alerts:
            key = alert_key(alert)
            left = self._waiting.get(key, 1) - 1
            if left <= 0:
                self._waiting.pop(key, None)
                free.append(key)
            else:
                self._waiting[key] = left
        return free

    def _make_room(self, now: float) -> None:
        """At the cap: forget the group idle longest, or make the oldest waiting group due now."""
        for key, group in self.groups.items():
            if not group.pending:
                del self.groups[key]
                EVICTIONS.count("alert_group")
                return
        oldest = next(iter(self.groups.values()))
        oldest.next_flush = min(oldest.next_flush, now)

    def _take(self, key: str, group: _Group, now: float) -> Batch:
        self.groups[key] = self.groups.pop(key)      # the most recently sent: forgotten last
        batch = Batch(key, group.match, tuple(group.pending))
        group.pending = []
        group.last_sent = now
        resolved = {a.decision_id for a in batch.alerts if a.status != "firing"}
        firing = tuple(a for a in batch.alerts if a.status == "firing" and a.decision_id not in resolved)
        # what a repeat re-sends: this batch's firing alerts, or (a batch of resolutions only)
        # the earlier ones that are still firing
        group.last_batch = firing or tuple(a for a in group.last_batch if a.decision_id not in resolved)
        group.repeats = 0
        group.last_new = now
        group.next_flush = now + group.match.timing.group_interval
        return batch


class HeldStore:
    """Alerts waiting in a group, one JSON file each (``<directory>/<alert_key>.json``),
    written atomically (temporary file, fsync, ``os.replace``).

    Args:
        directory: created if missing.

    Raises:
        OSError: when the directory cannot be created.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def put(self, alert: Alert, groups: list[str]) -> None:
        """Keep ``alert`` and the keys of the groups it waits in until :meth:`remove`. An
        OSError is logged: the alert still waits in memory and is sent at shutdown; only a crash
        before that would lose it."""
        path = self.directory / f"{alert_key(alert)}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"alert": alert_to_dict(alert), "groups": groups},
                                    ensure_ascii=False, default=str))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            log.error("cannot hold alert %s on disk: %s", alert.decision_id, exc)
            tmp.unlink(missing_ok=True)

    def remove(self, key: str) -> None:
        """Forget a held alert by its :func:`alert_key` (it was sent or spooled)."""
        (self.directory / f"{key}.json").unlink(missing_ok=True)

    def load(self) -> list[tuple[Alert, list[str]]]:
        """The held alerts with their group keys, oldest first; unreadable files are renamed
        ``*.corrupt`` and skipped."""
        alerts = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                alerts.append((alert_from_dict(data["alert"]), [str(g) for g in data["groups"]]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("held alert %s is unreadable (%s)", path, exc)
                try:
                    os.replace(path, path.with_name(path.name + ".corrupt"))
                except OSError:
                    pass
        return sorted(alerts, key=lambda a: (a[0].starts_at, a[0].decision_id))
