"""Where findings and decisions go once made: the sinks, the terminal, the metrics and the alerts.

Shared by ``ftwatch run`` and ``ftwatch watch`` so both report a decision the same way. Every
collaborator is there, a null object when not configured (``NULL_SINK``, ``NULL_METRICS``,
``NULL_ALERTS``), so no method asks whether it has one. Records go to one sink (a ``FanOut``
over the store, Elasticsearch and the decisions file); alerts go to one alert path (the event
center) and their delivery results come back on its queue, taken here in the pipeline's thread
(:meth:`Recorder.collect`), never by a call from a delivery thread.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Collection, Iterable, Iterator, Sequence, TextIO

from ftwatch.alerting.alerts import AlertMaker
from ftwatch.alerting.dispatch import NULL_ALERTS, AlertPath
from ftwatch.alerting.notify import QUEUED
from ftwatch.alerting.resolve import OpenAlerts
from ftwatch.bounded import BoundedDict, trim_oldest
from ftwatch.config.limits import MAX_TRACKED_INSTANCES
from ftwatch.events import Action, Decision, DeliveryResult, Finding, Origin, iso
from ftwatch.pipeline.sinks.base import (NULL_SINK, ChunksSeen, FindingBatch, LifecycleEvent, OpenBlocks,
                                         OutputBatch, Record, RunEnd, RunStart, Sink, SourcePosition)
from ftwatch.pipeline.sinks.fanout import FanOut
from ftwatch.pipeline.sinks.jsonl import DecisionsFile
from ftwatch.pipeline.sinks.outputcounts import OutputCounts
from ftwatch.telemetry import NULL_METRICS

RESEND_SECONDS = 30.0   # how often spooled alerts are retried during a run
RESOLVE_AFTER = 300.0   # default seconds without a new incident before open alerts resolve


class Recorder:
    """Fans a decision out to the sinks, the console, the metrics and the alerts.

    Args:
        store: the store: a ``SqliteStore`` (a sink and the reader ``explain`` and ``report``
            use), or a ``FanOut`` whose primary is one (Elasticsearch behind it), or None.
        decisions_file: append one JSON object per decision here (README "Decisions";
            ``ftwatch.pipeline.sinks.jsonl``), or None. Its write errors are logged, not raised.
        dispatcher: the alert path (``ftwatch.alerting.dispatch.EventCenter``, or a bare
            ``ftwatch.alerting.notify.Sender``) or None.
        out: where human-readable lines go (the terminal).
        state_dir: named (absolute) in the alert's ``ftwatch explain`` / ``ftwatch report`` link.
        color: ANSI colours on the terminal (default: when ``out`` is a tty).
        resolve_after: seconds without a new incident after which the open alerts resolve
            (:meth:`resolve_due`); None: only :meth:`resolve_open` resolves them.
        metrics: ``ftwatch.telemetry.Metrics`` counting lines, findings, decisions and restarts,
            or None.
        output_bucket: seconds per bucket of the per-instance output counts (store ``output``).
        link_url: ``alerting.link_url``: a URL template for the alerts' link instead of a command
            (``ftwatch.alerting.alerts.alert_link``), or None.
        max_kept: ``limits.max_kept_decisions``: the most decisions (and delivery results) kept
            in :attr:`decisions` (:attr:`deliveries`); past it the oldest go (kinds ``decision``,
            ``delivery``). The sinks get every one; :attr:`decision_count` counts them all.
        max_origins: ``limits.max_tracked_instances``: the instances whose latest origin (node
            and pod labels of the output rows) is kept; past it the one set longest ago goes
            (kind ``origin``).

    Resolution (SPEC N2): ``ftwatch.alerting.resolve.OpenAlerts`` keeps the open alerts per job;
    :meth:`resolve_open` (the job finished) and :meth:`resolve_due` (quiet for
    ``resolve_after``) send each to every receiver once more with status ``resolved``.
    """

    def __init__(self, store: Sink | None = None, decisions_file: Path | None = None,
                 dispatcher: AlertPath | None = None, out: TextIO | None = None,
                 state_dir: Path | None = None, color: bool | None = None,
                 resolve_after: float | None = RESOLVE_AFTER, metrics: Any = None,
                 output_bucket: float = 5.0, link_url: str | None = None, max_kept: int = 10000,
                 max_origins: int = MAX_TRACKED_INSTANCES):
        self.store = store.primary if isinstance(store, FanOut) else store   # the reading side
        sink: Sink = store if store is not None else NULL_SINK
        lines = [DecisionsFile(decisions_file)] if decisions_file else []
        self._lines: Sink = FanOut(NULL_SINK, lines)   # a decision's line (decided); errors logged
        self._stored: Sink = sink                      # its storage (published)
        self.sink: Sink = FanOut(sink, lines) if decisions_file else sink
        self.decisions_file = decisions_file
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.out = out or sys.stdout
        self.state_dir = state_dir
        self.link_url = link_url
        self.alerts = AlertMaker(state_dir, link_url)
        self.color = self.out.isatty() if color is None else color
        self.attempt = 0          # the runner sets the attempt findings belong to
        self.decisions: list[Decision] = []
        self.decision_count = 0
        self.max_kept = max_kept
        self._last_resend: float | None = None   # the start already resent (cli)
        self.finding_count = 0
        self.deliveries: list[DeliveryResult] = []
        self.output_counts = OutputCounts(output_bucket)
        self._origins: dict[tuple[str, str], Origin] = BoundedDict(max_origins, "origin")   # (job, instance) -> its latest
        self.open = OpenAlerts(resolve_after)
        self.miner: Any = None    # ftwatch.mining.miner.Miner: catch-all evidence -> signatures
        self._closed = False

    # -- the null objects stand in for what is not configured ---------------------------------

    @property
    def dispatcher(self) -> AlertPath:
        """The alert path (``NULL_ALERTS`` when alerting is off); assign None to turn it off."""
        return self._alerts

    @dispatcher.setter
    def dispatcher(self, value: AlertPath | None) -> None:
        self._alerts = NULL_ALERTS if value is None else value

    @property
    def metrics(self) -> Any:
        """The metrics (``NULL_METRICS`` when off); assign None to turn them off."""
        return self._metrics

    @metrics.setter
    def metrics(self, value: Any) -> None:
        self._metrics = NULL_METRICS if value is None else value

    @property
    def resolve_after(self) -> float | None:
        return self.open.resolve_after

    def _write(self, *records: Record) -> None:
        self.sink.write(records)

    # -- records ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def storing(self, positions: Sequence[Any] = (), time: float = 0.0,
                chunks: Sequence[Any] = ()) -> Iterator[None]:
        """Everything recorded inside goes to the store in one transaction, ``positions`` (shipped
        sources' ``Position`` s after the lines handled inside) and ``chunks`` (the Forward
        ``ChunkMark`` s of the requests handled inside) written last in it: the lines' effects
        and the sources' positions are stored together or not at all (``watch``, issue 17). The
        extra sinks (Elasticsearch, the decisions file) and the alert path get their records as
        they come. A store without transactions (none, or not SQLite) takes each record as it
        comes and no position.

        Raises:
            SinkError: the store failed; nothing recorded inside is stored, nor the positions.
        """
        batch = getattr(self.store, "batch", None)
        if batch is None:
            yield
            return
        with batch():
            yield
            if positions:
                self._stored.write([SourcePosition(p.key, p.seq, p.document, time) for p in positions])
            if chunks:
                self._stored.write([ChunksSeen([(c.source, c.chunk) for c in chunks], time,
                                               min(c.keep for c in chunks),
                                               min(c.keep_seconds for c in chunks))])

    def blocks(self, changed: Sequence[Any], time: float) -> None:
        """Store the open blocks that changed (``Engine.changed_blocks``) in the store alone: inside
        :meth:`storing`, in the batch's transaction (``watch``, issue 17). A store without
        transactions keeps none."""
        if changed and getattr(self.store, "batch", None) is not None:
            self._stored.write([OpenBlocks(changed, time)])

    def output(self, origin: Origin, lines: int, nbytes: int, time: float) -> None:
        """Count output read from ``origin`` at ``time`` (epoch s): the metrics at once, the
        store's per-instance buckets once a later bucket starts (and at :meth:`flush_output`)."""
        self.output_many(((origin, lines, nbytes, time),))

    def output_many(self, counts: Sequence[tuple[Origin, int, int, float]]) -> None:
        """:meth:`output` for many origins at once (``watch``: a batch's quiet origins of one
        desk): the metrics counted once per job, the store's buckets per origin as there.

        Args:
            counts: ``(origin, lines, bytes, time)`` per chunk, in input order.
        """
        per_job: dict[str, list[int]] = {}
        origins = self._origins
        add = self.output_counts.add
        for origin, lines, nbytes, time in counts:
            total = per_job.get(origin.job)
            if total is None:
                total = per_job[origin.job] = [0, 0]
            total[0] += lines
            total[1] += nbytes
            if origins.get(origin.key) is not origin:   # node and pod labels of the rows
                origins[origin.key] = origin
            if add(origin.job, origin.instance, origin.rank, time, lines, nbytes):
                self._write(OutputBatch(self.output_counts.closed(), origins))
        for job, (lines, nbytes) in per_job.items():
            self.metrics.count_output(job, lines, nbytes)

    def flush_output(self) -> None:
        """Store every output bucket still open (the run or watch ends)."""
        self._write(OutputBatch(self.output_counts.drain(), self._origins))

    def findings(self, findings: Iterable[Finding]) -> None:
        """Store findings (every one, fallout included: ``explain`` shows them)."""
        findings = list(findings)
        self.finding_count += len(findings)
        self.metrics.count_findings(findings)
        if findings:
            self._write(FindingBatch(findings, self.attempt))

    def event(self, time: float, job: str, kind: str, instance: str | None = None,
              rank: int | None = None, **detail: Any) -> None:
        """Store a lifecycle event (start, exit, restart, stop); the metrics count the restarts
        among them (``Metrics.count_event``)."""
        self.metrics.count_event(job, kind, detail)
        self._write(LifecycleEvent(time, job, kind, instance, rank, detail))

    def run_started(self, job: str, attempt: int, time: float, command: list[str]) -> None:
        """An attempt of the job starts (the store's ``runs`` table and a ``job_start`` event)."""
        self._write(RunStart(job, attempt, time, command))
        self.event(time, job, "job_start", attempt=attempt, command=command)

    def run_ended(self, job: str, attempt: int, time: float, status: str) -> None:
        """An attempt ended: ``succeeded``, ``failed``, ``restarted`` or ``stopped``."""
        self._write(RunEnd(job, attempt, time, status))

    def decision(self, decision: Decision) -> None:
        """Record a decision everywhere and send its alert (action none sends none):
        :meth:`decided`, then :meth:`published`."""
        self.decided(decision)
        self.published(decision)

    def decided(self, decision: Decision) -> None:
        """The fast half of :meth:`decision`, before acting on it (``ftwatch run``): counted,
        its line appended to the decisions file, said on the terminal."""
        self.decisions.append(decision)
        self.decision_count += 1
        trim_oldest(self.decisions, self.max_kept, "decision")
        self.metrics.count_decision(decision.target.job, decision.action.label)
        self._lines.write((decision,))
        self.say(self._describe(decision))

    def published(self, decision: Decision) -> None:
        """The rest of :meth:`decision`, after acting: the store (SQLite, Elasticsearch), the
        alert rendered and handed to the alert path, the miner."""
        self._stored.write((decision,))
        if decision.action is not Action.NONE:
            alert = self.alerts.for_decision(decision)
            self.dispatcher.dispatch(alert)
            self.open.fired(alert, decision.time)
            self.collect()
        if self.miner is not None:
            self.signatures(decision)

    def signatures(self, decision: Decision) -> None:
        """Mine a catch-all decision's evidence (``ftwatch.mining``); a signature that reaches
        ``mining.new_signature_jobs`` jobs with it is stored as a ``new_signature`` event (detail:
        signature, template, jobs, lines), said, and sent as a ``new_signature`` alert."""
        rc = decision.root_cause
        for sig in self.miner.decision(decision):
            self.event(decision.time, decision.target.job, "new_signature", signature=sig.id,
                       template=sig.template, jobs=len(sig.jobs), lines=sig.count)
            self.say(self._style(f"ftwatch: new failure signature in {len(sig.jobs)} jobs: {sig.template}", "1;35"))
            self.dispatcher.dispatch(self.alerts.for_signature(
                sig, decision.time, job=decision.target.job, node=rc.origin.node if rc else ""))
            self.collect()

    def custom_message(self, time: float, job: str, content: str, instance: str | None = None,
                       rank: int | None = None, node: str | None = None,
                       budgets: tuple[int, int] | None = None) -> None:
        """A message from the training code (SDK ``send_custom_message``): printed, stored as a
        ``custom_message`` event and sent to every receiver as a ``notify`` alert."""
        who = f"rank {rank}" if rank is not None else (instance or "the job")
        self.say(self._style(f"ftwatch: custom message from {who}: {content}", "1;36"))
        self.event(time, job, "custom_message", instance, rank, content=content)
        used, left = budgets or (0, 0)
        self.dispatcher.dispatch(self.alerts.for_custom_message(
            job, content, time, instance=instance, rank=rank, node=node, restarts_used=used,
            restarts_left=left, attempt=self.attempt))
        # (called from the SDK's channel thread: its results are taken at the pipeline's next tick)

    # -- resolution ---------------------------------------------------------------------------

    def open_jobs(self) -> set[str]:
        """The jobs (label ``job``) that have open alerts."""
        return self.open.jobs()

    def resolve_open(self, time: float, reason: str = "", job: str | None = None) -> int:
        """Resolve the open alerts at ``time`` (epoch seconds): those of ``job``, or of every
        job when None. Each goes to the receivers as ``resolved`` and an ``alert_resolved``
        event is stored. Returns how many resolved."""
        alerts = self.open.take(job)
        for alert in alerts:
            self.event(time, alert.labels.get("job", ""), "alert_resolved",
                       alert.labels.get("instance") or None, decision_id=alert.decision_id,
                       reason=reason)
            self.dispatcher.dispatch(alert.resolve(time))
        self.collect()
        if alerts:
            whose = f" of job {job}" if job is not None else ""
            self.say(f"ftwatch: {len(alerts)} alert(s){whose} resolved ({reason or 'no new incident'})")
        return len(alerts)

    def resolve_due(self, now: float, hold: Collection[str] = ()) -> int:
        """Resolve the open alerts of each job whose last resolvable incident is at least
        ``resolve_after`` seconds before ``now`` (epoch seconds; call it while jobs run).
        Jobs are judged one by one; those named in ``hold`` (an incident still settling) are
        left open. Returns how many resolved."""
        return sum(self.resolve_open(now, f"no new incident for {self.resolve_after:g}s", job=job)
                   for job in self.open.quiet_jobs(now, hold))

    # -- delivery results ---------------------------------------------------------------------

    def collect(self) -> int:
        """Take the delivery results waiting on the alert path's queue and store them (in the
        caller's thread: the pipeline's). Returns how many."""
        results = self.dispatcher.take_results()
        for result in results:
            self.delivery(result)
        return len(results)

    def delivery(self, result: DeliveryResult) -> None:
        """Record what became of one notification (``queued`` is not an outcome: the worker's
        result follows). After :meth:`close` nothing is recorded: the spool has it."""
        if self._closed or result.status == QUEUED:
            return
        self.deliveries.append(result)
        trim_oldest(self.deliveries, self.max_kept, "delivery")
        self._write(result)

    def resend_due(self, mono: float, every: float = RESEND_SECONDS) -> int:
        """The alert path's tick (due groups, rate-limit releases, digests) and its results;
        then resend spooled alerts if ``every`` seconds passed since the last try (N4: a receiver
        that comes back during a long run gets its alerts then, not at the next start). Returns
        how many were delivered (with background delivery: handed to the delivery workers)."""
        self.dispatcher.tick()
        self.collect()
        if self._last_resend is None:
            self._last_resend = mono
        if mono - self._last_resend < every:
            return 0
        self._last_resend = mono
        return self.dispatcher.resend_pending()

    def close(self) -> None:
        """At shutdown: the event center sends what still waits in its groups (nothing is lost)
        and waits a bounded time for the delivery workers (what they did not deliver stays in
        the spool); their results are stored, then the sinks are closed (an Elasticsearch sink
        flushes its journal)."""
        self.dispatcher.close()
        self.collect()
        self.flush_output()
        self._closed = True
        self.sink.close()

    # -- the terminal -------------------------------------------------------------------------

    def link(self, decision: Decision) -> str:
        """How to see more about a decision: the ``alerting.link_url`` URL, else the command
        that explains it (absolute, quoted ``--state-dir``)."""
        return self.alerts.for_decision(decision, include_none=True).annotations["explain"]

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
