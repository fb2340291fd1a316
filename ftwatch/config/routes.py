"""Config of the event center (SPEC N3, N4): routes, mute windows, inhibit rules, rate limits, digest.

The models are Alertmanager-shaped (https://prometheus.io/docs/alerting/latest/configuration/) and
live under ``alerting:`` in the main config; :class:`EventCenterFields` is the base class of
``ftwatch.config.model.AlertingConfig`` that adds them. With none of them set, every alert goes to every
receiver at once, as before the event center existed.

Durations are seconds or a string such as ``30s``, ``5m``, ``4h``, ``1d``, ``1h30m``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ftwatch.config.yamlsource import dotted

_STRICT = ConfigDict(extra="forbid", populate_by_name=True)

#: The event types of the event center (SPEC N3): name -> when it is made
#: (``ftwatch.alerting.alerts.event_type_of`` derives it from a decision's action and trigger).
EVENT_TYPES: dict[str, str] = {
    "job_restart": "the whole job is restarted (action restart_job; not a hang)",
    "instance_restart": "one instance is restarted (restart_instance or restart_in_place)",
    "node_isolated": "a node is isolated and the job restarted elsewhere (isolate_node)",
    "job_failed": "the job is failed for good (fail_job)",
    "job_hang": "a hang (no output for job_hang_interval, or an exit hang) restarts the job",
    "straggler": "a straggler was found (action notify, failure class straggler)",
    "c4d_diagnosis": "a notify-only C4D slow/hang diagnosis (seed 000 --enable-c4d-hang-detection; "
                     "rule id c4d*); a C4D isolation is node_isolated with label c4d=true",
    "custom_message": "a message from the training code (SDK send_custom_message, seed 000)",
    "new_signature": "a new failure signature: a template that catch-all decisions printed reached "
                     "mining.new_signature_jobs jobs (ftwatch mine)",
    "notice": "any other notify decision",
    "job_finished": "the job ended without an action (action none, when such alerts are made)",
    "digest": "the daily digest of muted, inhibited and rate-limited alerts",
}
SEVERITIES = ("info", "warning", "critical")
LINK_FIELDS = ("job", "decision_id", "instance", "rank", "node", "event_type")
"""The placeholders an ``alerting.link_url`` template may use (``ftwatch.alerting.alerts.alert_link``)."""
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|[smhdw])")

# Default per-kind rate limits (messages, per seconds), from the vendors' documentation:
# DingTalk custom robot: "每个机器人每分钟最多发送20条消息到群里，如果超过20条，会限流10分钟"
#   (https://open.dingtalk.com/document/group/custom-robot-access, 消息发送频率限制);
# WeCom group robot: "每个机器人发送的消息不能超过20条/分钟"
#   (https://developer.work.weixin.qq.com/document/path/91770, 消息发送频率限制);
# Feishu custom bot: 100 requests a minute, 5 a second
#   (https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot, 频率控制).
DEFAULT_RATE_LIMITS: dict[str, tuple[int, float]] = {
    "dingtalk": (20, 60.0), "wecom": (20, 60.0), "feishu": (100, 60.0)}


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``90``, ``30s``, ``5m``, ``4h``, ``1d``, ``1h30m``.

    Raises:
        ValueError: not a duration, or negative.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
                raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 4h, 1d)") from None
            seconds = sum(float(n) * (0.001 if u == "ms" else _UNITS[u]) for n, u in parts)
    else:
        raise ValueError(f"not a duration: {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


def _clock_time(text: str) -> int:
    """Minutes since midnight of ``HH:MM`` (``24:00`` allowed). Raises ValueError."""
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", str(text).strip())
    if not m or int(m[1]) > 24 or int(m[2]) > 59 or (int(m[1]) == 24 and int(m[2])):
        raise ValueError(f"not a time of day: {text!r} (use HH:MM, 00:00 to 24:00)")
    return int(m[1]) * 60 + int(m[2])


def zone(name: str) -> ZoneInfo | None:
    """The time zone ``name`` (an IANA name, ``UTC``), or None for ``local``. Raises ValueError."""
    if name == "local":
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as Asia/Shanghai, UTC, or local)") from None


class MatchConfig(BaseModel):
    """What an alert must have; every given condition must hold (an empty one holds always)."""

    model_config = _STRICT
    event_type: list[str] = Field(default_factory=list, description="Any of these event types; empty: any.")
    severity: list[Literal["info", "warning", "critical"]] = Field(
        default_factory=list, description="Any of these severities; empty: any.")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Label -> value it must equal, or `~REGEX` it must fully match.")

    @field_validator("event_type")
    @classmethod
    def _known_events(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in EVENT_TYPES]
        if unknown:
            raise ValueError(f"unknown event types {unknown}; known: {', '.join(EVENT_TYPES)}")
        return value

    @field_validator("labels")
    @classmethod
    def _regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for key, pattern in value.items():
            if pattern.startswith("~"):
                try:
                    re.compile(pattern[1:])
                except re.error as exc:
                    raise ValueError(f"labels.{key}: bad regex {pattern[1:]!r}: {exc}") from None
        return value


class RouteConfig(BaseModel):
    """One node of the route tree. A child route takes its parent's value for every key it leaves
    unset (null); the root's unset values are the defaults named in each description."""

    model_config = _STRICT
    receivers: list[str] = Field(
        default_factory=list, description="Receiver names; empty: the parent's (at the root: every receiver).")
    match: MatchConfig = Field(default_factory=MatchConfig, description="What alerts this route takes.")
    group_by: list[str] | None = Field(
        None, description="Labels whose values make a group (`...`: all labels); root default []: one group.")
    group_wait: Duration | None = Field(
        None, description="Seconds a new group waits before its first notification; root default 0.")
    group_interval: Duration | None = Field(
        None, description="Least seconds between two notifications of a group; root default 0.")
    repeat_interval: Duration | None = Field(
        None, description="Seconds before the same alerts are sent again; 0: never; root default 0. "
        "Not shorter than group_interval.")
    continue_: bool = Field(False, alias="continue",
                            description="After this route matched, go on trying its next siblings.")
    mute_time_intervals: list[str] = Field(
        default_factory=list, description="Names of alerting.mute_time_intervals when this route is muted; "
        "empty: the parent's.")
    routes: list[RouteConfig] = Field(default_factory=list, description="Child routes, tried in order.")


class TimeRangeConfig(BaseModel):
    """A time of day range, ``start`` included, ``end`` excluded; start after end crosses midnight."""

    model_config = _STRICT
    start: str = Field(description="HH:MM.")
    end: str = Field(description="HH:MM (24:00: midnight at the end of the day).")

    @field_validator("start", "end")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        _clock_time(value)
        return value


class TimeIntervalConfig(BaseModel):
    """A named mute window: weekdays and times of day in a time zone."""

    model_config = _STRICT
    name: str = Field(description="The name routes refer to.")
    weekdays: list[str] = Field(
        default_factory=list, description="Days (`monday`, `saturday:sunday`, `mon:fri`); empty: every day.")
    times: list[TimeRangeConfig] = Field(default_factory=list, description="Times of day; empty: all day.")
    timezone: str = Field("local", description="IANA time zone (e.g. Asia/Shanghai), UTC, or local.")

    @field_validator("weekdays")
    @classmethod
    def _days(cls, value: list[str]) -> list[str]:
        for item in value:
            weekday_range(item)
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value


def weekday_range(text: str) -> set[int]:
    """The weekdays (0 = Monday) of ``monday``, ``mon``, ``mon:fri`` or ``friday:monday``.

    Raises:
        ValueError: an unknown day.
    """
    def day(word: str) -> int:
        word = word.strip().lower()
        hits = [i for i, d in enumerate(_WEEKDAYS) if len(word) >= 3 and d.startswith(word)]
        if len(hits) != 1:
            raise ValueError(f"unknown weekday {word!r}; use monday..sunday or mon..sun")
        return hits[0]
    first, _, last = text.partition(":")
    a, b = day(first), day(last or first)
    return {(a + i) % 7 for i in range((b - a) % 7 + 1)}


def clock_minutes(text: str) -> int:
    """Minutes since midnight of a validated ``HH:MM``."""
    return _clock_time(text)


class InhibitRuleConfig(BaseModel):
    """A firing source alert mutes target alerts that share the ``equal`` labels."""

    model_config = _STRICT
    source_match: MatchConfig = Field(description="What the inhibiting alert has.")
    target_match: MatchConfig = Field(description="What the inhibited alerts have.")
    equal: list[str] = Field(default_factory=lambda: ["job"],
                             description="Labels that must be equal in source and target.")
    duration: Duration = Field(3600.0, gt=0, description="Seconds a source alert inhibits after it fired.")


def default_inhibit_rules() -> list[InhibitRuleConfig]:
    """A node isolation suppresses the per-rank restart alerts of the same job (they are its fallout)."""
    return [InhibitRuleConfig(
        source_match=MatchConfig(event_type=["node_isolated"]),
        target_match=MatchConfig(event_type=["instance_restart", "job_restart", "job_hang"]),
        equal=["job"])]


class RateLimitConfig(BaseModel):
    """A sliding window: never more than ``messages`` sends in any ``per_seconds`` seconds, kept
    across restarts (``ftwatch.alerting.ratelimit``)."""

    model_config = _STRICT
    messages: int = Field(gt=0, description="Messages allowed per window.")
    per_seconds: Duration = Field(gt=0, description="The window in seconds.")


class DigestConfig(BaseModel):
    """Once a day, each receiver gets one message summarising what it did not get at once."""

    model_config = _STRICT
    enabled: bool = Field(True, description="Send the daily digest of muted, inhibited and rate-limited alerts.")
    at: str = Field("09:00", description="Time of day (HH:MM) it is due; a run not alive then sends it "
                    "at its next start or shutdown.")
    timezone: str = Field("local", description="Time zone of `at`: IANA name, UTC, or local.")

    @field_validator("at")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        if _clock_time(value) >= 24 * 60:
            raise ValueError("use 00:00 to 23:59")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value


class EventCenterFields(BaseModel):
    """The event-center keys of ``alerting:`` (a base class of AlertingConfig)."""

    model_config = _STRICT
    route: RouteConfig = Field(default_factory=RouteConfig,
                               description="The route tree (Alertmanager-like); default: every receiver, at once.")
    mute_time_intervals: list[TimeIntervalConfig] = Field(
        default_factory=list, description="Named mute windows that routes refer to.")
    inhibit_rules: list[InhibitRuleConfig] = Field(
        default_factory=default_inhibit_rules,
        description="Inhibit rules; default: node_isolated inhibits instance_restart, job_restart, job_hang "
        "of the same job.")
    rate_limits: dict[str, RateLimitConfig] = Field(
        default_factory=dict, description="Receiver name -> rate limit; default per kind: dingtalk and wecom "
        "20 per 60 s, feishu 100 per 60 s (vendor docs).")
    digest: DigestConfig = Field(default_factory=DigestConfig, description="The daily digest.")

    @model_validator(mode="after")
    def _references(self) -> EventCenterFields:
        """The cross-references hold (:func:`reference_problems`); a config file gets them from
        ``ftwatch.config.model.load_config``'s second pass instead, each at its own line."""
        raw = {"receivers": [{"name": r.name} for r in getattr(self, "receivers", [])],
               "route": self.route.model_dump(by_alias=True),
               "mute_time_intervals": [{"name": w.name} for w in self.mute_time_intervals],
               "rate_limits": dict.fromkeys(self.rate_limits, {})}
        problems = reference_problems(raw)
        if problems:
            text = "; ".join(f"{dotted(loc)}: {msg}" for loc, msg in problems)
            raise PydanticCustomError(CROSS_REFERENCE, "{problems}", {"problems": text})
        return self


CROSS_REFERENCE = "cross_reference"
"""The pydantic error type of :class:`EventCenterFields`' cross-reference check."""


def reference_problems(alerting: Any) -> list[tuple[tuple, str]]:
    """The cross-reference problems of an ``alerting:`` mapping, raw (as read from YAML) or dumped.

    Checks: receiver and mute window names are unique; every receiver and mute window a route
    names exists; ``repeat_interval`` is not shorter than ``group_interval`` in any route,
    inherited values included (reported at the route that sets the clashing value); every
    ``rate_limits`` key is a receiver. Values of the wrong shape are skipped (field validation
    reports them).

    Returns:
        [(path under ``alerting``, message)], the path naming the key or item at fault (e.g.
        ``("route", "routes", 0, "receivers", 1)``).
    """
    if not isinstance(alerting, dict):
        return []
    problems: list[tuple[tuple, str]] = []

    def names(key: str) -> list[str]:
        seen: list[str] = []
        items = alerting.get(key)
        for i, item in enumerate(items if isinstance(items, list) else []):
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str):
                if name in seen:
                    problems.append(((key, i, "name"), f"{key} names must be unique: {name!r} is used twice"))
                seen.append(name)
        return seen

    receivers, windows = names("receivers"), names("mute_time_intervals")

    def seconds(route: dict, key: str) -> float | None:
        try:
            return None if route.get(key) is None else parse_duration(route[key])
        except (ValueError, TypeError):
            return None

    def walk(route: Any, path: tuple, gi: float, ri: float) -> None:
        if not isinstance(route, dict):
            return
        for key, known, what in (("receivers", receivers, "receiver"), ("mute_time_intervals", windows, "interval")):
            items = route.get(key)
            for i, name in enumerate(items if isinstance(items, list) else []):
                if isinstance(name, str) and name not in known:
                    problems.append((path + (key, i), f"unknown {what} {name!r}; known: {', '.join(known) or 'none'}"))
        own_gi, own_ri = seconds(route, "group_interval"), seconds(route, "repeat_interval")
        gi = own_gi if own_gi is not None else gi
        ri = own_ri if own_ri is not None else ri
        if (own_gi is not None or own_ri is not None) and 0 < ri < gi:
            key = "repeat_interval" if own_ri is not None else "group_interval"
            problems.append((path + (key,), f"repeat_interval ({ri:g}s) is shorter than group_interval ({gi:g}s)"))
        children = route.get("routes")
        for i, child in enumerate(children if isinstance(children, list) else []):
            walk(child, path + ("routes", i), gi, ri)

    walk(alerting.get("route"), ("route",), 0.0, 0.0)
    limits = alerting.get("rate_limits")
    problems += [(("rate_limits", r), f"unknown receiver {r!r}; known: {', '.join(receivers) or 'none'}")
                 for r in (limits if isinstance(limits, dict) else {}) if r not in receivers]
    return problems
