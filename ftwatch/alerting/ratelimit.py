"""Per-receiver rate limits and the daily digest (SPEC N4).

:class:`RateLimiter` keeps, per receiver, a sliding-window log: the send times of its last
``messages`` messages. A message may go when fewer than ``messages`` were sent in the
``per_seconds`` before it, so there are never more than ``messages`` sends in any window of
``per_seconds`` seconds, bursts included (a token bucket that starts full lets nearly twice that
through in its first window). The log is kept in ``<state>/ratelimit.json``, so a restarted (or
crash-looping) ftwatch does not start with a fresh allowance. A notification that may not go
now is not dropped: the sender (``ftwatch.alerting.notify``) spools it and sends it when the
window has room again (``Sender.release`` asks :meth:`RateLimiter.ready`). Defaults per receiver
kind come from the vendors' documented limits (``ftwatch.config.routes.DEFAULT_RATE_LIMITS``: DingTalk 20
messages a minute, and a robot that exceeds it is throttled for 10 minutes; WeCom 20 a minute;
Feishu 100 a minute).

:class:`DigestBook` collects, per receiver, the alerts it did not get at once (muted, inhibited,
delayed by its rate limit) in ``<state>/digest.json`` and says when the daily digest is due: once
the configured time of day has passed since the oldest entry. A process not alive at that time
sends it at its next start, tick or shutdown, so a digest is late but never skipped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ftwatch.config.routes import DEFAULT_RATE_LIMITS, DigestConfig, clock_minutes, zone

log = logging.getLogger(__name__)

RATE_LIMITED = "rate limited"
"""The start of a spooled notification's error when its receiver's rate limit held it."""


class SlidingWindow:
    """At most ``messages`` sends in any ``per_seconds`` window: the log of the last sends.

    A send at ``t`` leaves the window at ``t + per_seconds`` (windows are half-open,
    ``[t, t + per_seconds)``).

    Args:
        messages: sends allowed per window.
        per_seconds: the window length in seconds.
        sent: earlier send times (epoch seconds), e.g. from a previous process.

    Raises:
        ValueError: messages or per_seconds not positive.
    """

    def __init__(self, messages: int, per_seconds: float, sent: Iterable[float] = ()):
        if messages <= 0 or per_seconds <= 0:
            raise ValueError("a rate limit needs messages > 0 and per_seconds > 0")
        self.messages = int(messages)
        self.per_seconds = float(per_seconds)
        self.sent: deque[float] = deque(sorted(float(t) for t in sent)[-self.messages:],
                                        maxlen=self.messages)

    def _expire(self, now: float) -> None:
        while self.sent and self.sent[0] <= now - self.per_seconds:
            self.sent.popleft()

    def take(self, now: float) -> bool:
        """Record a send at ``now`` (epoch seconds) if the window has room; False when it has none."""
        self._expire(now)
        if len(self.sent) < self.messages:
            self.sent.append(now)
            return True
        return False

    def ready_at(self, now: float) -> float:
        """When the next send may go (``now`` if it may now)."""
        self._expire(now)
        return now if len(self.sent) < self.messages else self.sent[0] + self.per_seconds


class RateLimiter:
    """Sliding windows by receiver name, kept in a JSON file. Thread-safe.

    Args:
        limits: receiver name -> (messages, per_seconds); receivers not named are not limited.
        now: unused (kept for callers that pass the start time).
        path: the log file (``<state>/ratelimit.json``): receiver -> send times; None keeps the
            log in memory only. An unreadable file is logged and treated as empty.
    """

    def __init__(self, limits: Mapping[str, tuple[int, float]], now: float = 0.0,
                 path: Path | None = None):
        self.path = path
        sent = self._load()
        self.windows = {name: SlidingWindow(m, s, sent.get(name, ())) for name, (m, s) in limits.items()}
        self.held: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, rate_limits: Mapping[str, Any], receivers: Mapping[str, str],
                    now: float, path: Path | None = None) -> RateLimiter:
        """Limits from ``alerting.rate_limits`` (name -> RateLimitConfig) over the per-kind defaults.

        Args:
            receivers: receiver name -> kind (``dingtalk``...).
            path: the log file, see the class.
        """
        limits = {name: DEFAULT_RATE_LIMITS[kind] for name, kind in receivers.items()
                  if kind in DEFAULT_RATE_LIMITS}
        limits.update({name: (c.messages, c.per_seconds) for name, c in rate_limits.items()})
        return cls(limits, now, path)

    def take(self, receiver: str, now: float) -> bool:
        """Count one message to ``receiver`` sent at ``now``; False (and remembered as held) when
        its window is full."""
        with self._lock:
            window = self.windows.get(receiver)
            if window is None:
                return True
            if window.take(now):
                self._save()
                return True
            self.held.add(receiver)
            return False

    def ready(self, now: float) -> list[str]:
        """Receivers with held messages whose window has room again (they leave the held set)."""
        with self._lock:
            ready = [r for r in sorted(self.held) if self.windows[r].ready_at(now) <= now]
            self.held.difference_update(ready)
            return ready

    def next_ready(self, now: float) -> float | None:
        """When the first held receiver's window has room, or None when none is held."""
        with self._lock:
            return min((self.windows[r].ready_at(now) for r in self.held), default=None)

    def _load(self) -> dict[str, list[float]]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {str(k): [float(t) for t in v] for k, v in raw.items()}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.error("rate-limit log %s is unreadable (%s); starting a new one", self.path, exc)
            return {}

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({r: list(w.sent) for r, w in self.windows.items()}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot write the rate-limit log %s: %s", self.path, exc)


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
