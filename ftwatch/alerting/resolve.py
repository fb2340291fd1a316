"""Which alerts are open, per job, and when they are due to resolve (SPEC N2, Alertmanager).

The alerts of resolvable incidents (event types ``job_restart``, ``instance_restart``,
``job_hang``, ``node_isolated``: :data:`ftwatch.alerting.alerts.RESOLVABLE`) stay open until
the job ends (``Recorder.resolve_open``) or ``resolve_after`` seconds pass since the job's last
such incident while it runs on (:meth:`OpenAlerts.quiet_jobs`). ``job_failed`` and
notifications never resolve here. The bookkeeping is per job (label ``job``): one job's quiet
period or end never resolves another job's alerts (``ftwatch watch`` sees many).

This module only keeps the book; the recorder sends each taken alert's resolution
(``Alert.resolve``) through the alert path and stores an ``alert_resolved`` event.
"""

from __future__ import annotations

from typing import Collection

from ftwatch.alerting.alerts import RESOLVABLE, Alert


class OpenAlerts:
    """The firing alerts of resolvable incidents, by job.

    Args:
        resolve_after: seconds without a new resolvable incident of a job after which its
            alerts are due to resolve; None: never by time, only when taken.
    """

    def __init__(self, resolve_after: float | None):
        self.resolve_after = resolve_after
        self.alerts: dict[tuple, Alert] = {}        # labels (job included) -> the latest firing alert
        self._last_incident: dict[str, float] = {}  # job -> time of its latest resolvable incident

    def fired(self, alert: Alert, time: float) -> None:
        """Note ``alert`` sent at ``time`` (epoch s); kept when its event type resolves (an
        alert with the same labels replaces the one before)."""
        if alert.event_type in RESOLVABLE:
            self.alerts[tuple(sorted(alert.labels.items()))] = alert
            self._last_incident[alert.labels.get("job", "")] = time

    def jobs(self) -> set[str]:
        """The jobs (label ``job``) that have open alerts."""
        return {alert.labels.get("job", "") for alert in self.alerts.values()}

    def take(self, job: str | None = None) -> list[Alert]:
        """Remove and return the open alerts of ``job``, or of every job when None."""
        if job is None:
            taken = list(self.alerts.values())
            self.alerts, self._last_incident = {}, {}
            return taken
        taken = [a for a in self.alerts.values() if a.labels.get("job", "") == job]
        self.alerts = {k: a for k, a in self.alerts.items() if a.labels.get("job", "") != job}
        self._last_incident.pop(job, None)
        return taken

    def quiet_jobs(self, now: float, hold: Collection[str] = ()) -> list[str]:
        """The jobs, sorted, whose last resolvable incident is at least ``resolve_after``
        seconds before ``now`` (epoch s), except those in ``hold`` (an incident still settling)."""
        if self.resolve_after is None:
            return []
        return [job for job in sorted(self.jobs()) if job not in hold
                and job in self._last_incident and now - self._last_incident[job] >= self.resolve_after]
