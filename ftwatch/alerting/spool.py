"""The on-disk spool of notifications not yet delivered (SPEC N4).

Layout::

    <directory>/<id>.json        one pending notification (written atomically)
    <directory>/dead/<id>.json   dead letters: refused for good, or unreadable spool files

Each file holds the rendered notification, its alert and the full decision (floats kept
exactly, so the decision id survives the round trip), plus ``attempts``, ``last_error``,
``created`` and ``updated`` (epoch seconds). Writes go to a temporary file that is fsynced
and then ``os.replace``-d over the target, and the directory is fsynced, so a crash leaves
either the old file or the new one. ``ack`` deletes the file: an acked notification is
never pending again, so it is never resent.

Not safe for several processes on one directory; within one process its calls are serialised
by a lock (the sender's caller and its delivery workers write from different threads).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ftwatch.alerting.alerts import Alert, Notification
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class SpoolEntry:
    """One spooled notification.

    Attributes:
        notification: what to send.
        attempts: sends tried so far (before and after spooling).
        last_error: the last failure's message ("" when none).
        created, updated: epoch seconds of the first spooling and the last change.
    """

    notification: Notification
    attempts: int = 0
    last_error: str = ""
    created: float = 0.0
    updated: float = 0.0

    @property
    def id(self) -> str:
        return self.notification.id


class Spool:
    """A directory of pending notifications, one JSON file each.

    Args:
        directory: created if missing (with ``dead/`` inside).
        now: wall clock, epoch seconds (tests pass a fake one).

    Raises:
        OSError: when the directory cannot be created.
    """

    def __init__(self, directory: Path, now: Callable[[], float] = _time.time):
        self.directory = Path(directory)
        self.dead_dir = self.directory / "dead"
        self.dead_dir.mkdir(parents=True, exist_ok=True)
        self._now = now
        self._lock = threading.RLock()

    def path(self, notification_id: str) -> Path:
        """The file of a pending notification."""
        return self.directory / f"{notification_id}.json"

    def has(self, notification_id: str) -> bool:
        """True when the notification is pending."""
        return self.path(notification_id).exists()

    def put(self, notification: Notification, attempts: int = 0, error: str = "") -> SpoolEntry:
        """Store (or replace) a pending notification. Raises OSError when the disk fails."""
        with self._lock:
            return self._put(notification, attempts, error)

    def _put(self, notification: Notification, attempts: int, error: str) -> SpoolEntry:
        old = self._read(self.path(notification.id))
        now = self._now()
        entry = SpoolEntry(notification, attempts, error, old.created if old else now, now)
        self._write(self.path(notification.id), entry)
        return entry

    def record_attempt(self, notification_id: str, error: str) -> SpoolEntry | None:
        """Count one more failed attempt; returns the updated entry (None if not pending)."""
        with self._lock:
            entry = self._read(self.path(notification_id))
            if entry is None:
                return None
            entry = SpoolEntry(entry.notification, entry.attempts + 1, error, entry.created,
                               self._now())
            self._write(self.path(notification_id), entry)
            return entry

    def pending(self) -> list[SpoolEntry]:
        """Every pending notification, oldest first. Unreadable files are moved to ``dead/``."""
        entries = []
        with self._lock:
            for path in sorted(self.directory.glob("*.json")):
                entry = self._read(path)
                if entry is not None:
                    entries.append(entry)
        entries.sort(key=lambda e: (e.created, e.id))
        return entries

    def ack(self, notification_id: str) -> bool:
        """Delivered: delete the pending file. Returns False when it was not pending."""
        with self._lock:
            try:
                self.path(notification_id).unlink()
            except FileNotFoundError:
                return False
            _fsync_dir(self.directory)
            return True

    def dead(self, notification: Notification, attempts: int, error: str) -> Path:
        """Record a notification refused for good in ``dead/`` (and drop it from pending)."""
        with self._lock:
            now = self._now()
            target = self.dead_dir / f"{notification.id}.json"
            self._write(target, SpoolEntry(notification, attempts, error, now, now))
            self.ack(notification.id)
            return target

    def dead_letters(self) -> list[SpoolEntry]:
        """The readable dead letters, oldest first."""
        entries = [e for p in sorted(self.dead_dir.glob("*.json"))
                   if (e := self._read(p, quarantine=False)) is not None]
        return sorted(entries, key=lambda e: (e.created, e.id))

    # -- files ----------------------------------------------------------------------------

    def _write(self, path: Path, entry: SpoolEntry) -> None:
        data = json.dumps(entry_to_dict(entry), ensure_ascii=False, default=str)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    def _read(self, path: Path, quarantine: bool = True) -> SpoolEntry | None:
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            return entry_from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            log.error("spool file %s is unreadable (%s)", path, exc)
            if quarantine:
                try:
                    os.replace(path, self.dead_dir / f"{path.name}.corrupt")
                except OSError as move_exc:
                    log.error("cannot move %s to %s: %s", path, self.dead_dir, move_exc)
            return None


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- the codec: exact round trips of Finding, Decision, Alert, Notification ----------------

def finding_to_dict(f: Finding) -> dict[str, Any]:
    """A Finding as JSON-ready data with the epoch time kept (``to_dict`` keeps only ISO)."""
    o = f.origin
    return {"rule_id": f.rule_id, "kind": f.kind, "failure_class": f.failure_class.value,
            "action": f.action.label, "severity": f.severity.name.lower(),
            "origin": {"instance": o.instance, "rank": o.rank, "job": o.job, "node": o.node,
                       "stream": o.stream, "source": o.source},
            "line": f.line, "time": f.time, "seq": f.seq, "evidence": list(f.evidence),
            "fields": dict(f.fields), "source": f.source}


def finding_from_dict(d: dict[str, Any]) -> Finding:
    """Inverse of :func:`finding_to_dict`. Raises KeyError/ValueError on bad data."""
    return Finding(d["rule_id"], d["kind"], FailureClass(d["failure_class"]),
                   Action.parse(d["action"]), Severity.parse(d["severity"]),
                   Origin(**d["origin"]), d["line"], float(d["time"]), int(d.get("seq", 0)),
                   tuple(d.get("evidence", ())), dict(d.get("fields", {})), d.get("source", ""))


def decision_to_dict(dec: Decision) -> dict[str, Any]:
    """A Decision as JSON-ready data that :func:`decision_from_dict` restores exactly."""
    t = dec.target
    return {"time": dec.time, "action": dec.action.label,
            "target": {"job": t.job, "instance": t.instance, "rank": t.rank, "node": t.node},
            "root_cause": None if dec.root_cause is None else finding_to_dict(dec.root_cause),
            "policy_clause": dec.policy_clause, "restarts_used": dec.restarts_used,
            "restarts_left": dec.restarts_left,
            "findings": [finding_to_dict(f) for f in dec.findings], "attempt": dec.attempt}


def decision_from_dict(d: dict[str, Any]) -> Decision:
    """Inverse of :func:`decision_to_dict`."""
    rc = d.get("root_cause")
    return Decision(float(d["time"]), Action.parse(d["action"]), Target(**d["target"]),
                    None if rc is None else finding_from_dict(rc), d["policy_clause"],
                    int(d["restarts_used"]), int(d["restarts_left"]),
                    tuple(finding_from_dict(f) for f in d.get("findings", ())),
                    int(d.get("attempt", 0)))


def alert_to_dict(a: Alert) -> dict[str, Any]:
    """An Alert as JSON-ready data that :func:`alert_from_dict` restores exactly."""
    return {"labels": dict(a.labels), "annotations": dict(a.annotations),
            "status": a.status, "starts_at": a.starts_at, "ends_at": a.ends_at,
            "budgets": dict(a.budgets), "id": a.id,
            "decision": None if a.decision is None else decision_to_dict(a.decision)}


def alert_from_dict(a: dict[str, Any]) -> Alert:
    """Inverse of :func:`alert_to_dict`. Raises KeyError/ValueError/TypeError on bad data."""
    return Alert(dict(a["labels"]), dict(a["annotations"]), a["status"], float(a["starts_at"]),
                 None if a.get("ends_at") is None else float(a["ends_at"]),
                 None if a.get("decision") is None else decision_from_dict(a["decision"]),
                 dict(a.get("budgets", {})), str(a.get("id", "")))


def notification_to_dict(n: Notification) -> dict[str, Any]:
    return {"id": n.id, "receiver": n.receiver, "title": n.title, "body": n.body,
            "alert": alert_to_dict(n.alert)}


def notification_from_dict(d: dict[str, Any]) -> Notification:
    return Notification(d["receiver"], alert_from_dict(d["alert"]), d["title"], d["body"], d["id"])


def entry_to_dict(e: SpoolEntry) -> dict[str, Any]:
    return {"version": FORMAT_VERSION, "notification": notification_to_dict(e.notification),
            "attempts": e.attempts, "last_error": e.last_error, "created": e.created,
            "updated": e.updated}


def entry_from_dict(d: dict[str, Any]) -> SpoolEntry:
    if d.get("version") != FORMAT_VERSION:
        raise ValueError(f"unknown spool format version {d.get('version')!r}")
    return SpoolEntry(notification_from_dict(d["notification"]), int(d.get("attempts", 0)),
                      str(d.get("last_error", "")), float(d.get("created", 0.0)),
                      float(d.get("updated", 0.0)))
