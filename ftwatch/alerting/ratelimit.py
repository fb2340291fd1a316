"""Per-receiver rate limits and the daily digest (SPEC N4).

:class:`RateLimiter` gives each receiver a token bucket: ``messages`` tokens, refilled evenly over
``per_seconds`` (so at most ``messages`` in any window of that length, bursts included). A
notification that finds no token is not dropped: the Dispatcher spools it and it is sent when a
token is back (``ftwatch.alerting.center`` asks :meth:`RateLimiter.ready`). Defaults per receiver
kind come from the vendors' documented limits (``ftwatch.configroutes.DEFAULT_RATE_LIMITS``:
DingTalk 20 messages a minute, WeCom 20 a minute, Feishu 100 a minute).

:class:`DigestBook` collects, per receiver, the alerts it did not get at once (muted, inhibited,
delayed by its rate limit) in ``<state>/digest.json`` and says when the daily digest is due: once
the configured time of day has passed since the oldest entry. A process not alive at that time
sends it at its next start, tick or shutdown, so a digest is late but never skipped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ftwatch.configroutes import DEFAULT_RATE_LIMITS, DigestConfig, clock_minutes, zone

log = logging.getLogger(__name__)

RATE_LIMITED = "rate limited"
"""The start of a spooled notification's error when its receiver's rate limit held it."""


class TokenBucket:
    """``capacity`` tokens, refilled at ``capacity / per_seconds`` a second; starts full.

    Raises:
        ValueError: capacity or per_seconds not positive.
    """

    def __init__(self, capacity: int, per_seconds: float, now: float):
        if capacity <= 0 or per_seconds <= 0:
            raise ValueError("a rate limit needs messages > 0 and per_seconds > 0")
        self.capacity = float(capacity)
        self.rate = capacity / per_seconds
        self.tokens = float(capacity)
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, now: float) -> bool:
        """Take one token at ``now`` (epoch seconds); False when there is none."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def ready_at(self, now: float) -> float:
        """When the next token is there (``now`` if one is)."""
        self._refill(now)
        return now if self.tokens >= 1.0 else now + (1.0 - self.tokens) / self.rate


class RateLimiter:
    """Token buckets by receiver name.

    Args:
        limits: receiver name -> (messages, per_seconds); receivers not named are not limited.
        now: the start time (epoch seconds) of the buckets.
    """

    def __init__(self, limits: Mapping[str, tuple[int, float]], now: float = 0.0):
        self.buckets = {name: TokenBucket(m, s, now) for name, (m, s) in limits.items()}
        self.held: set[str] = set()

    @classmethod
    def from_config(cls, rate_limits: Mapping[str, Any], receivers: Mapping[str, str],
                    now: float) -> RateLimiter:
        """Limits from ``alerting.rate_limits`` (name -> RateLimitConfig) over the per-kind defaults.

        Args:
            receivers: receiver name -> kind (``dingtalk``...).
        """
        limits = {name: DEFAULT_RATE_LIMITS[kind] for name, kind in receivers.items()
                  if kind in DEFAULT_RATE_LIMITS}
        limits.update({name: (c.messages, c.per_seconds) for name, c in rate_limits.items()})
        return cls(limits, now)

    def take(self, receiver: str, now: float) -> bool:
        """Take a token for one message to ``receiver``; False (and remembered as held) when none."""
        bucket = self.buckets.get(receiver)
        if bucket is None or bucket.take(now):
            return True
        self.held.add(receiver)
        return False

    def ready(self, now: float) -> list[str]:
        """Receivers with held messages that have a token again (they leave the held set)."""
        ready = [r for r in sorted(self.held) if self.buckets[r].ready_at(now) <= now]
        self.held.difference_update(ready)
        return ready

    def next_ready(self, now: float) -> float | None:
        """When the first held receiver gets a token back, or None when none is held."""
        return min((self.buckets[r].ready_at(now) for r in self.held), default=None)


@dataclass(frozen=True)
class DigestEntry:
    """One alert a receiver did not get at once: when, what, why (``muted: <window>``,
    ``inhibited ...``, ``rate limited``)."""

    receiver: str
    time: float
    alert_id: str
    event_type: str
    job: str
    summary: str
    reason: str


class DigestBook:
    """The undigested entries, kept in a JSON file, and the daily schedule.

    Args:
        path: the file (``<state>/digest.json``); None keeps them in memory only.
        config: ``alerting.digest``.
    """

    def __init__(self, path: Path | None, config: DigestConfig):
        self.path = path
        self.config = config
        self.entries: list[DigestEntry] = []
        if path is not None and path.exists():
            try:
                self.entries = [DigestEntry(**e) for e in json.loads(path.read_text(encoding="utf-8"))]
            except (OSError, ValueError, TypeError) as exc:
                log.error("digest file %s is unreadable (%s); starting a new one", path, exc)

    def add(self, receiver: str, alert: Any, reason: str, now: float) -> None:
        """Note that ``receiver`` did not get ``alert`` at once, because of ``reason``."""
        if not self.config.enabled:
            return
        self.entries.append(DigestEntry(receiver, now, alert.decision_id, alert.event_type,
                                        alert.labels.get("job", ""), alert.annotations.get("summary", ""),
                                        reason))
        self._save()

    def last_slot(self, now: float) -> float:
        """The latest daily digest time at or before ``now`` (epoch seconds)."""
        tz = zone(self.config.timezone)
        local = datetime.fromtimestamp(now, tz) if tz is not None else datetime.fromtimestamp(now)
        minutes = clock_minutes(self.config.at)
        slot = local.replace(hour=minutes // 60, minute=minutes % 60, second=0, microsecond=0)
        if slot > local:
            slot -= timedelta(days=1)
        return slot.timestamp()

    def due(self, now: float) -> dict[str, list[DigestEntry]]:
        """Receiver -> its entries, for receivers whose digest is due at ``now``: a daily time
        passed after their oldest entry."""
        if not self.config.enabled or not self.entries:
            return {}
        slot = self.last_slot(now)
        by: dict[str, list[DigestEntry]] = {}
        for e in self.entries:
            by.setdefault(e.receiver, []).append(e)
        return {r: es for r, es in by.items() if min(e.time for e in es) <= slot}

    def clear(self, receiver: str, upto: float) -> None:
        """Drop ``receiver``'s entries up to ``upto`` (they were digested)."""
        self.entries = [e for e in self.entries if not (e.receiver == receiver and e.time <= upto)]
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps([e.__dict__ for e in self.entries], ensure_ascii=False),
                           encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot write the digest file %s: %s", self.path, exc)


def digest_text(receiver: str, entries: list[DigestEntry], language: str = "en") -> tuple[str, str]:
    """(title, body) of a receiver's digest: counts by reason and event type, then one line each."""
    counts: dict[tuple[str, str], int] = {}
    for e in entries:
        reason = e.reason.split(":")[0].split(" by ")[0]
        counts[(reason, e.event_type)] = counts.get((reason, e.event_type), 0) + 1
    if language == "zh":
        title = f"【ftwatch】每日汇总：{len(entries)} 条告警未即时送达 {receiver}"
    else:
        title = f"[ftwatch] daily digest: {len(entries)} alerts not sent at once to {receiver}"
    lines = [title, ""]
    lines += [f"- {n} x {event} ({reason})" for (reason, event), n in sorted(counts.items())]
    lines.append("")
    for e in sorted(entries, key=lambda e: e.time):
        stamp = datetime.fromtimestamp(e.time).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"- {stamp} [{e.event_type}] {e.summary} ({e.reason})")
    return title, "\n".join(lines)
