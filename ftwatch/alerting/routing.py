"""The event center's routing (SPEC N3): which receivers an alert goes to, muted when, inhibited by what.

A :class:`Router` is built from ``alerting.route`` (``ftwatch.config.routes.RouteConfig``). Like
Alertmanager (https://prometheus.io/docs/alerting/latest/configuration/#route), every alert enters
the root route; it descends into the first child route that matches, and past it into the later
siblings only when that child has ``continue: true``; a route none of whose children matched is
where the alert ends. Each route where it ends gives one :class:`RouteMatch`: receivers, the group
key (route path + the ``group_by`` label values) and the timing of the group.

Mute windows (:class:`MuteWindows`) and inhibit rules (:class:`Inhibitor`) are checked when a group
is about to be sent, not when an alert arrives, so a node isolation that comes during a group's wait
still suppresses the per-rank restarts waiting there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ftwatch.bounded import trim_oldest
from ftwatch.config.limits import MAX_REMEMBERED_ALERTS
from ftwatch.config.routes import (
    InhibitRuleConfig,
    MatchConfig,
    RouteConfig,
    TimeIntervalConfig,
    clock_minutes,
    weekday_range,
    zone,
)


@dataclass(frozen=True)
class EventView:
    """What routing looks at: an event type, a severity and labels (an Alert, or a sample event
    given to ``ftwatch check --route``)."""

    event_type: str
    severity: str
    labels: Mapping[str, str]

    @classmethod
    def of(cls, alert) -> EventView:
        """The view of an ``Alert``."""
        return cls(alert.event_type, alert.severity, dict(alert.labels))

    def label(self, key: str) -> str:
        """A label's value; ``event_type`` and ``severity`` are labels too ("" when absent)."""
        if key == "event_type":
            return self.event_type
        if key == "severity":
            return self.severity
        return str(self.labels.get(key, ""))


class Matcher:
    """A compiled ``MatchConfig``: every given condition must hold."""

    def __init__(self, config: MatchConfig):
        self.event_types = frozenset(config.event_type)
        self.severities = frozenset(config.severity)
        self.labels: list[tuple[str, str, re.Pattern[str] | None]] = [
            (k, v, re.compile(v[1:]) if v.startswith("~") else None) for k, v in config.labels.items()]

    def __call__(self, event: EventView) -> bool:
        if self.event_types and event.event_type not in self.event_types:
            return False
        if self.severities and event.severity not in self.severities:
            return False
        for key, value, regex in self.labels:
            have = event.label(key)
            if (regex.fullmatch(have) is None) if regex is not None else have != value:
                return False
        return True

    def describe(self) -> str:
        """The conditions in one line (``any`` when there are none)."""
        parts = []
        if self.event_types:
            parts.append("event_type in " + ",".join(sorted(self.event_types)))
        if self.severities:
            parts.append("severity in " + ",".join(sorted(self.severities)))
        parts += [f"{k}={v}" for k, v, _ in self.labels]
        return " and ".join(parts) or "any"


@dataclass(frozen=True)
class Timing:
    """A route's effective grouping (seconds; repeat 0 = never repeat)."""

    group_by: tuple[str, ...] = ()
    group_wait: float = 0.0
    group_interval: float = 0.0
    repeat_interval: float = 0.0


@dataclass(frozen=True)
class RouteMatch:
    """Where an event ends in the route tree.

    Attributes:
        path: the route's path, e.g. ``route.routes.1.routes.0``.
        receivers: receiver names.
        group_key: path + ``{label=value,...}`` of the group_by labels.
        timing: the route's grouping.
        mute_windows: names of the mute windows of that route.
        trail: the routes passed, each ``path (conditions)``, root first.
    """

    path: str
    receivers: tuple[str, ...]
    group_key: str
    timing: Timing
    mute_windows: tuple[str, ...]
    trail: tuple[str, ...]


class _Node:
    def __init__(self, config: RouteConfig, path: str, parent: _Node | None, all_receivers: Sequence[str]):
        self.path = path
        self.matcher = Matcher(config.match)
        self.continue_ = config.continue_
        up = parent.timing if parent else Timing()

        def pick(value, inherited):
            return inherited if value is None else value
        self.timing = Timing(tuple(pick(config.group_by, list(up.group_by))),
                             pick(config.group_wait, up.group_wait),
                             pick(config.group_interval, up.group_interval),
                             pick(config.repeat_interval, up.repeat_interval))
        self.receivers = tuple(config.receivers) or (parent.receivers if parent else tuple(all_receivers))
        self.mutes = tuple(config.mute_time_intervals) or (parent.mutes if parent else ())
        self.children = [_Node(c, f"{path}.routes.{i}", self, all_receivers) for i, c in enumerate(config.routes)]


class Router:
    """Routes events through the tree of ``alerting.route``.

    Args:
        config: the root route (its ``match`` applies too: an event it does not match goes nowhere).
        receivers: every receiver name, in config order (the root's default).
    """

    def __init__(self, config: RouteConfig, receivers: Sequence[str]):
        self.root = _Node(config, "route", None, receivers)

    def route(self, event: EventView) -> list[RouteMatch]:
        """Every route where ``event`` ends, in tree order (empty when the root does not match)."""
        if not self.root.matcher(event):
            return []
        out: list[RouteMatch] = []
        self._descend(self.root, event, (self._step(self.root),), out)
        return out

    def _descend(self, node: _Node, event: EventView, trail: tuple[str, ...], out: list[RouteMatch]) -> None:
        matched = False
        for child in node.children:
            if child.matcher(event):
                matched = True
                self._descend(child, event, trail + (self._step(child),), out)
                if not child.continue_:
                    break
        if not matched:
            out.append(RouteMatch(node.path, node.receivers, group_key(node.path, node.timing.group_by, event),
                                  node.timing, node.mutes, trail))

    @staticmethod
    def _step(node: _Node) -> str:
        return f"{node.path} ({node.matcher.describe()}{', continue' if node.continue_ else ''})"


def group_key(path: str, group_by: Sequence[str], event: EventView) -> str:
    """``path{k=v,...}`` of the group_by labels; ``...`` groups by every label."""
    if "..." in group_by:
        keys = sorted({*event.labels, "event_type", "severity"})
    else:
        keys = list(group_by)
    return path + "{" + ",".join(f"{k}={event.label(k)}" for k in keys) + "}"


class MuteWindows:
    """The named mute windows of ``alerting.mute_time_intervals``."""

    def __init__(self, intervals: Iterable[TimeIntervalConfig]):
        self._windows = {}
        for w in intervals:
            days = set().union(*(weekday_range(d) for d in w.weekdays)) if w.weekdays else set(range(7))
            ranges = [(clock_minutes(t.start), clock_minutes(t.end)) for t in w.times] or [(0, 24 * 60)]
            self._windows[w.name] = (days, ranges, zone(w.timezone))

    def active(self, names: Iterable[str], at: float) -> list[str]:
        """The windows among ``names`` that hold at ``at`` (epoch seconds); unknown names are ignored."""
        hits = []
        for name in names:
            if name not in self._windows:
                continue
            days, ranges, tz = self._windows[name]
            local = datetime.fromtimestamp(at, tz) if tz is not None else datetime.fromtimestamp(at)
            minute = local.hour * 60 + local.minute
            yesterday = (local.weekday() - 1) % 7
            for start, end in ranges:
                if start <= end:
                    inside = local.weekday() in days and start <= minute < end
                else:        # crosses midnight: the part after midnight belongs to the day it started
                    inside = ((local.weekday() in days and minute >= start)
                              or (yesterday in days and minute < end))
                if inside:
                    hits.append(name)
                    break
        return hits


@dataclass(frozen=True)
class Inhibition:
    """Why an event is inhibited: the rule's index and the source alert's id and event type."""

    rule: int
    source_id: str
    source_event: str

    def __str__(self) -> str:
        return f"inhibited by inhibit_rules[{self.rule}]: {self.source_event} alert {self.source_id}"


class Inhibitor:
    """Remembers source alerts and tells whether a target is inhibited.

    Args:
        rules: ``alerting.inhibit_rules``.
        max_sources: ``limits.max_remembered_alerts``: past it the oldest sources are forgotten
            (to three quarters of it; kind ``inhibit_source``), besides those a day past their
            rules' longest ``duration``.
    """

    def __init__(self, rules: Iterable[InhibitRuleConfig], max_sources: int = MAX_REMEMBERED_ALERTS):
        self.rules = [(Matcher(r.source_match), Matcher(r.target_match), tuple(r.equal), r.duration)
                      for r in rules]
        self.max_sources = max_sources
        self._sources: list[tuple[float, str, EventView]] = []   # (fired at, id, event)
        self._ended: dict[str, float] = {}                         # source id -> resolved at

    def observe(self, alert_id: str, event: EventView, at: float) -> None:
        """Note an alert that fired at ``at``; it inhibits while a rule's ``duration`` lasts
        and it has not resolved (:meth:`end`)."""
        if any(src(event) for src, _, _, _ in self.rules):
            self._sources.append((at, alert_id, event))
            trim_oldest(self._sources, self.max_sources, "inhibit_source")

    def end(self, alert_id: str, at: float) -> None:
        """The source alert ``alert_id`` resolved at ``at``: from then on it inhibits nothing
        (as in Alertmanager, inhibition lasts while the source fires)."""
        if any(sid == alert_id for _, sid, _ in self._sources):
            self._ended[alert_id] = at

    def inhibited(self, event: EventView, at: float, alert_id: str = "") -> Inhibition | None:
        """The first rule whose live source inhibits ``event`` at ``at``, or None.

        An alert never inhibits itself; a source counts from the time it fired, so a source is
        live at ``at`` when ``fired <= at < fired + duration``.
        """
        horizon = max((d for *_, d in self.rules), default=0.0)
        self._sources = [s for s in self._sources if s[0] + horizon > at - 86400.0]
        live = {s[1] for s in self._sources}
        self._ended = {k: v for k, v in self._ended.items() if k in live}
        for i, (src, dst, equal, duration) in enumerate(self.rules):
            if not dst(event):
                continue
            for fired, sid, source in self._sources:
                if sid == alert_id or not (fired <= at < fired + duration) or not src(source):
                    continue
                if at >= self._ended.get(sid, float("inf")):
                    continue                    # the source resolved
                if all(source.label(k) == event.label(k) for k in equal):
                    return Inhibition(i, sid, source.event_type)
        return None
