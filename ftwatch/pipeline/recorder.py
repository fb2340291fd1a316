"""Where findings and decisions go once made: the store, the decisions file, the terminal, the alerts.

Shared by ``ftwatch run`` and ``ftwatch replay`` so both report a decision the same way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Collection, Iterable, TextIO

from ftwatch.events import Action, Decision, Finding, Origin, iso
from ftwatch.pipeline.sinks.outputcounts import OutputCounts

RESEND_SECONDS = 30.0   # how often spooled alerts are retried during a run
RESOLVE_AFTER = 300.0   # default seconds without a new incident before open alerts resolve
_RESTART_ACTIONS = frozenset(a.label for a in (Action.RESTART_JOB, Action.RESTART_INSTANCE,
                                               Action.RESTART_IN_PLACE, Action.ISOLATE_NODE))


class Recorder:
    """Fans a decision out to the SQLite store, the JSONL decisions file, the console and the alerts.

    Args:
        store: the SQLite store (``ftwatch.pipeline.sinks.sqlite.SqliteStore``) or None.
        decisions_file: append one JSON object per decision here (README "Decisions"), or None.
        dispatcher: the alert dispatcher (``ftwatch.alerting.center.EventCenter``, or a bare
            ``ftwatch.alerting.dispatcher.Dispatcher``) or None.
        out: where human-readable lines go (the terminal).
        state_dir: named (absolute) in the alert's ``ftwatch explain`` / ``ftwatch report`` link.
        link_url: ``alerting.link_url``: a URL template for the alerts' link instead of a command
            (``ftwatch.alerting.alerts.alert_link``), or None.
        resolve_after: seconds without a new incident after which the open alerts resolve
            (:meth:`resolve_due`); None: only :meth:`resolve_open` resolves them.
        metrics: ``ftwatch.telemetry.Metrics`` counting lines, findings, decisions and restarts,
            or None.
        output_bucket: seconds per bucket of the per-instance output counts (store ``output``).

    Resolution (SPEC N2, Alertmanager): the alerts of resolvable incidents (event types
    ``job_restart``, ``instance_restart``, ``job_hang``, ``node_isolated``;
    ``ftwatch.alerting.alerts.RESOLVABLE``) stay open until :meth:`resolve_open` is called
    (the job finished, successfully or not) or :meth:`resolve_due` finds ``resolve_after``
    seconds passed since the job's last such incident while it ran on. Each then goes to every
    receiver once more with status ``resolved`` and ``ends_at`` set. ``job_failed`` and
    notifications never resolve here. The bookkeeping is per job (label ``job``): one job's
    quiet period or end never resolves another job's alerts (``ftwatch watch`` sees many).
    """

    def __init__(self, store: Any = None, decisions_file: Path | None = None, dispatcher: Any = None,
                 out: TextIO | None = None, state_dir: Path | None = None, color: bool | None = None,
                 resolve_after: float | None = RESOLVE_AFTER, metrics: Any = None,
                 output_bucket: float = 5.0, link_url: str | None = None):
        self.store = store
        self.decisions_file = decisions_file
        self.dispatcher = dispatcher
        self.out = out or sys.stdout
        self.state_dir = state_dir
        self.link_url = link_url
        self.color = self.out.isatty() if color is None else color
        self.attempt = 0          # the runner sets the attempt findings belong to
        self.decisions: list[Decision] = []
        self._last_resend: float | None = None   # the start already resent (cli)
        self.finding_count = 0
        self.deliveries: list[Any] = []
        self.metrics = metrics
        self.output_counts = OutputCounts(output_bucket)
        self._origins: dict[tuple[str, str], Origin] = {}   # (job, instance) -> its latest origin
        self.resolve_after = resolve_after
        self.open_alerts: dict[tuple, Any] = {}    # labels (job included) -> the latest firing alert
        self._last_incident: dict[str, float] = {}  # job -> time of its latest resolvable incident
        self._closed = False
        if decisions_file is not None:
            decisions_file.parent.mkdir(parents=True, exist_ok=True)

    def output(self, origin: Origin, lines: int, nbytes: int, time: float) -> None:
        """Count output read from ``origin`` at ``time`` (epoch s): the metrics at once, the
        store's per-instance buckets once a later bucket starts (and at :meth:`flush_output`)."""
        if self.metrics is not None:
            self.metrics.count_output(origin.job, lines, nbytes)
        if self._origins.get(origin.key) is not origin:   # node and pod labels of the rows
            if len(self._origins) >= 65536:
                self._origins.clear()
            self._origins[origin.key] = origin
        if self.output_counts.add(origin.job, origin.instance, origin.rank, time, lines, nbytes):
            rows = self.output_counts.closed()
            if self.store is not None:
                self.store.add_output(rows, origins=self._origins)

    def flush_output(self) -> None:
        """Store every output bucket still open (the run or watch ends)."""
        rows = self.output_counts.drain()
        if self.store is not None:
            self.store.add_output(rows, origins=self._origins)

    def findings(self, findings: Iterable[Finding]) -> None:
        """Store findings (every one, fallout included: ``explain`` shows them)."""
        findings = list(findings)
        self.finding_count += len(findings)
        if self.metrics is not None:
            self.metrics.count_findings(findings)
        if findings and self.store is not None:
            self.store.add_findings(findings, attempt=self.attempt)

    def event(self, time: float, job: str, kind: str, instance: str | None = None,
              rank: int | None = None, **detail: Any) -> None:
        """Store a lifecycle event (start, exit, restart, stop).

        Restarts are counted in the metrics: ``job_restart`` (kind ``job``), ``instance_restart``
        (kind ``instance``) and an ``actuator`` event whose restart action was ``done``.
        """
        if self.metrics is not None:
            if kind in ("job_restart", "instance_restart"):
                self.metrics.count_restart(job, kind.split("_")[0])
            elif kind == "actuator" and detail.get("status") == "done" and \
                    detail.get("action") in _RESTART_ACTIONS:
                self.metrics.count_restart(job, detail["action"])
        if self.store is not None:
            self.store.add_event(time, job, kind, instance=instance, rank=rank, detail=detail)

    def run_started(self, job: str, attempt: int, time: float, command: list[str]) -> None:
        """An attempt of the job starts (the store's ``runs`` table and a ``job_start`` event)."""
        if self.store is not None:
            self.store.start_run(job, attempt, time, command)
        self.event(time, job, "job_start", attempt=attempt, command=command)

    def run_ended(self, job: str, attempt: int, time: float, status: str) -> None:
        """An attempt ended: ``succeeded``, ``failed``, ``restarted`` or ``stopped``."""
        if self.store is not None:
            self.store.end_run(job, attempt, time, status)

    def decision(self, decision: Decision) -> None:
        """Record a decision everywhere and send its alert (action none sends none)."""
        self.decisions.append(decision)
        if self.metrics is not None:
            self.metrics.count_decision(decision.target.job, decision.action.label)
        if self.store is not None:
            self.store.add_decision(decision)
        if self.decisions_file is not None:
            with self.decisions_file.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(decision.to_json(), ensure_ascii=False) + "\n")
        self.say(self._describe(decision))
        if self.dispatcher is not None and decision.action is not Action.NONE:
            from ftwatch.alerting.alerts import alert_from_decision
            from ftwatch.alerting.alerts import RESOLVABLE
            alert = self._linked(alert_from_decision(decision, ""))
            self._dispatch(alert)
            if alert.event_type in RESOLVABLE:
                self.open_alerts[tuple(sorted(alert.labels.items()))] = alert
                self._last_incident[alert.labels.get("job", "")] = decision.time

    def open_jobs(self) -> set[str]:
        """The jobs (label ``job``) that have open alerts."""
        return {alert.labels.get("job", "") for alert in self.open_alerts.values()}

    def resolve_open(self, time: float, reason: str = "", job: str | None = None) -> int:
        """Resolve the open alerts at ``time`` (epoch seconds): those of ``job``, or of every
        job when None. Each goes to the receivers as ``resolved`` and an ``alert_resolved``
        event is stored. Returns how many resolved."""
        alerts = [a for a in self.open_alerts.values() if job is None or a.labels.get("job", "") == job]
        if job is None:
            self.open_alerts, self._last_incident = {}, {}
        else:
            self.open_alerts = {k: a for k, a in self.open_alerts.items()
                                if a.labels.get("job", "") != job}
            self._last_incident.pop(job, None)
        for alert in alerts:
            self.event(time, alert.labels.get("job", ""), "alert_resolved",
                       alert.labels.get("instance") or None, decision_id=alert.decision_id,
                       reason=reason)
            if self.dispatcher is not None:
                self._dispatch(alert.resolve(time))
        if alerts:
            whose = f" of job {job}" if job is not None else ""
            self.say(f"ftwatch: {len(alerts)} alert(s){whose} resolved ({reason or 'no new incident'})")
        return len(alerts)

    def resolve_due(self, now: float, hold: Collection[str] = ()) -> int:
        """Resolve the open alerts of each job whose last resolvable incident is at least
        ``resolve_after`` seconds before ``now`` (epoch seconds; call it while jobs run).
        Jobs are judged one by one; those named in ``hold`` (an incident still settling) are
        left open. Returns how many resolved."""
        if self.resolve_after is None or not self.open_alerts:
            return 0
        count = 0
        for job in sorted(self.open_jobs()):
            last = self._last_incident.get(job)
            if job in hold or last is None or now - last < self.resolve_after:
                continue
            count += self.resolve_open(now, f"no new incident for {self.resolve_after:g}s", job=job)
        return count

    def _dispatch(self, alert: Any) -> None:
        self._record(self.dispatcher.dispatch(alert))

    def _record(self, results: Iterable[Any]) -> None:
        """Store the results a dispatcher call returned, except those already stored via its
        ``on_result`` and those only handed to a delivery worker (status ``queued``: the
        worker reports their outcome through ``on_result``, from its thread)."""
        from ftwatch.alerting.dispatcher import QUEUED
        for result in results:
            if result.status != QUEUED and not any(r is result for r in self.deliveries):
                self.delivery(result)

    def custom_message(self, time: float, job: str, content: str, instance: str | None = None,
                       rank: int | None = None, node: str | None = None,
                       budgets: tuple[int, int] | None = None) -> None:
        """A message from the training code (SDK ``send_custom_message``): printed, stored as a
        ``custom_message`` event and sent to every receiver as a ``notify`` alert."""
        who = f"rank {rank}" if rank is not None else (instance or "the job")
        self.say(self._style(f"ftwatch: custom message from {who}: {content}", "1;36"))
        self.event(time, job, "custom_message", instance, rank, content=content)
        if self.dispatcher is None:
            return
        from ftwatch.alerting.alerts import alert_from_custom_message
        used, left = budgets or (0, 0)
        alert = alert_from_custom_message(job, content, time, "", instance=instance,
                                          rank=rank, node=node, restarts_used=used,
                                          restarts_left=left, attempt=self.attempt)
        self._dispatch(self._linked(alert))

    def delivery(self, result: Any) -> None:
        """Record what became of one notification (a dispatcher's ``on_result``, so that the
        resends of spooled alerts reach the store too). Called from the delivery workers'
        threads as well: a list append and the store's own lock keep it thread-safe."""
        if self._closed:          # a worker's late outcome after shutdown: the spool has it
            return
        self.deliveries.append(result)
        if self.store is not None:
            self.store.add_delivery(result)

    def resend_due(self, mono: float, every: float = RESEND_SECONDS) -> int:
        """Resend spooled alerts if ``every`` seconds passed since the last try (N4: a receiver that
        comes back during a long run gets its alerts then, not at the next start). Returns how
        many were delivered (with background delivery: handed to the delivery workers)."""
        if self.dispatcher is None:
            return 0
        tick = getattr(self.dispatcher, "tick", None)
        if tick is not None:      # the event center: due groups, rate-limit releases, digests
            self._record(tick())
        if self._last_resend is None:
            self._last_resend = mono
        if mono - self._last_resend < every:
            return 0
        self._last_resend = mono
        return self.dispatcher.resend_pending()

    def close(self) -> None:
        """At shutdown: the event center sends what still waits in its groups (nothing is lost)
        and waits a bounded time for the delivery workers (what they did not deliver stays in
        the spool), then the store is closed (an Elasticsearch sink flushes its journal)."""
        close = getattr(self.dispatcher, "close", None)
        if close is not None:     # (the delivery workers get a bounded time to finish first)
            self._record(close())
        self.flush_output()
        self._closed = True
        if self.store is not None:
            self.store.close()

    def link(self, decision: Decision) -> str:
        """How to see more about a decision: the ``alerting.link_url`` URL, else the command
        that explains it (absolute, quoted ``--state-dir``)."""
        from ftwatch.alerting.alerts import alert_from_decision
        return self._linked(alert_from_decision(decision, "", include_none=True)).annotations["explain"]

    def _linked(self, alert: Any) -> Any:
        """``alert`` with its link (annotation ``explain``, ``ftwatch.alerting.alerts.alert_link``)."""
        import dataclasses

        from ftwatch.alerting.alerts import alert_link
        link = alert_link(alert, self.state_dir, self.link_url)
        return dataclasses.replace(alert, annotations={**alert.annotations, "explain": link})

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _describe(self, d: Decision) -> str:
        rc = d.root_cause
        head = f"ftwatch: decision {d.action.label}"
        if d.target.instance:
            head += f" -> {d.target.instance}"
        lines = [self._style(head, "1;33" if d.action is not Action.NONE else "1;32")]
        if rc is not None:
            where = f"rank {rc.rank}" if rc.rank is not None else rc.origin.instance
            lines.append(f"  root cause [{rc.failure_class.value}] {rc.rule_id} ({where}, {iso(rc.time)}):")
            lines.append(f"    {rc.line}")
        lines.append(f"  clause: {d.policy_clause}")
        lines.append(f"  restarts used {d.restarts_used}, left {d.restarts_left}")
        return "\n".join(lines)

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text
