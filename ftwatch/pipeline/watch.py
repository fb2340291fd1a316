"""``ftwatch watch``: many jobs that ftwatch did not launch, from shipped logs.

Sources put ``list[Shipped]`` on one bounded queue. The loop unwraps envelopes, names each
line's job / node / instance (``ftwatch.pipeline.sources.identity``), groups the lines of one batch by
origin into chunks and feeds the one Engine (its state is keyed by origin, and origins carry
the job, so jobs never mix). Each job has its own policy, budgets, hang tracker and incident:

    first error (severity >= error, fallout included), C4D record at the log level or notify /
    isolate finding (``ftwatch.policy.triggers``) -> wait ``settle`` s for the others'
    evidence -> policy.decide over that job's findings -> recorder (store, alerts) -> actuator
    -> ``cooldown`` s in which the job's new errors (the fallout of acting) open no incident
    (none after a ``notify``: nothing was done).

A job hang (every instance of the job silent for ``job_hang_interval``) decides at once.
There are no process exits here: a job that ended is simply quiet.

Alerts resolve per job (SPEC N2): a job's restart/hang/isolate alerts resolve once
``resolve_after`` seconds pass with no new such incident of that job (and none settling), at
once when a launcher of the job logs that its worker group finished successfully
(``ftwatch.parsers.torchelastic.CLEAN_FINISH``), and as superseded when the job is failed.
"""

from __future__ import annotations

import queue
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ftwatch.clock import SystemClock
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.parsers import fields
from ftwatch.parsers.torchelastic import finished_cleanly, parse_summary
from ftwatch.pipeline.actuators.exec import Actuator, NoneActuator
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.policy.triggers import opens_incident
from ftwatch.policy.policy import Incident, Policy
from ftwatch.rules.timers import HangTracker

POLL_SECONDS = 0.2
BLOCK_FLUSH_SECONDS = 2.0


@dataclass
class _Job:
    name: str
    policy: Policy
    budgets: BudgetStore
    tracker: HangTracker
    instances: dict[str, Origin] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    trigger: Finding | None = None
    opened: float = 0.0            # mono when the incident opened
    quiet_until: float = 0.0       # mono until which new errors open no incident
    decisions: list[Decision] = field(default_factory=list)


def tune_gc_for_ingest() -> None:
    """Raise the collector's thresholds for a process that ingests shipped records.

    Records in flight (their metadata maps and Shipped objects) are many young objects that
    live until the engine takes them; with CPython's default threshold (700) a full queue
    triggered dozens of full collections per second, measured at half of ``bench_ingest``'s
    time. Only ``ftwatch watch`` (which owns its process) calls this.
    """
    import gc
    gc.set_threshold(50_000, 20, 20)


def group_lines(resolved: Iterable[tuple[Origin, bytes, float]]) -> dict[Origin, tuple[list[bytes], float]]:
    """Groups ``(origin, line, time)`` triples per origin, in one pass: what :meth:`Watcher.ingest`
    feeds the engine (``bench/bench_ingest.py`` calls it too).

    Returns:
        origin -> (its lines in input order, its latest time), origins in order of first line.
    """
    # Lines are gathered per Origin *object* first (id() hashes in C; an Origin's own hash runs
    # Python code), and each new object is looked up once by value, so equal Origins that are
    # different objects still share one list and no line changes places.
    by_id: dict[int, list] = {}
    by_value: dict[Origin, list] = {}
    for origin, line, t in resolved:
        slot = by_id.get(id(origin))
        if slot is None:
            slot = by_value.get(origin)
            if slot is None:
                slot = by_value[origin] = [t, []]
            by_id[id(origin)] = slot
            slot.append(origin)      # holds the object, so its id is not reused meanwhile
        if not slot[0] > t:          # max(t, latest), as max() treats ties and NaN
            slot[0] = t
        slot[1].append(line)
    return {origin: (slot[1], slot[0]) for origin, slot in by_value.items()}


class Watcher:
    """The ``watch`` loop over shipped batches.

    Args:
        config: the validated Config (``policy``, ``watch``, ``storage``).
        engine: the rule engine shared by every job.
        recorder: decisions and findings go here.
        resolve: turns one Shipped batch into ``(origin, line, time)`` triples (envelopes
            unwrapped, identity applied).
        actuator: acts on decisions (default: observe only).
        flush_partials: hands out runtime-split lines whose first piece is older than the
            given time (``Joiners.flush``), so an unfinished CRI ``P`` line is not held forever.
    """

    def __init__(self, config, engine: Engine, recorder: Recorder,
                 resolve: Callable[[list[Shipped]], Iterable[tuple[Origin, bytes, float]]],
                 actuator: Actuator | None = None, clock: SystemClock | None = None,
                 flush_partials: Callable[[float], list[Shipped]] | None = None):
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.resolve = resolve
        self.actuator = actuator or NoneActuator()
        self.flush_partials = flush_partials
        self.clock = clock or SystemClock()
        self.queue: queue.Queue = queue.Queue(maxsize=config.watch.queue_batches)
        self.jobs: dict[str, _Job] = {}
        self.seen_jobs: set[str] = set()
        self._summaries: dict[Origin, list[str]] = {}
        self._exit_table = ExitCodeTable.load()
        self.state_dir = Path(config.storage.state_dir)
        self._stop = threading.Event()

    # -- public ---------------------------------------------------------------------------

    def stop(self) -> None:
        """End ``run`` at its next wake-up."""
        self._stop.set()

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Take batches until stopped (or ``until()`` is true after a wake-up)."""
        while not self._stop.is_set() and not (until and until()):
            try:
                batch = self.queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                batch = None
            if batch:
                self.ingest(batch)
            self.tick()

    def ingest(self, batch: list[Shipped]) -> None:
        """Feed one batch: group lines per origin, feed the engine, open incidents."""
        now_mono, now = self.clock.mono(), self.clock.time()
        metrics = self.recorder.metrics
        for origin, (lines, t) in group_lines(self.resolve(batch)).items():
            job = self._job(origin.job)
            if origin.instance not in job.instances:
                job.instances[origin.instance] = origin
                job.tracker.started(origin, t)
            job.tracker.output(origin.instance, t)
            data = b"\n".join(lines) + b"\n"
            self.recorder.output(origin, len(lines), len(data), t)
            if metrics is not None:
                metrics.observe_lag(now - t)        # the newest line of this origin in the batch
            findings = self.engine.feed(origin, data, t)
            findings += self._summary_exits(origin, data, t)
            self._add(job, findings, now_mono)
            if finished_cleanly(data):
                self.recorder.resolve_open(now, f"the workers of {origin.instance} finished successfully",
                                           job=job.name)
        ack = getattr(batch, "ack", None)
        if ack is not None:
            ack()                                   # a file tail may now save its offsets

    def tick(self) -> None:
        """Time passes: close stale blocks, check hangs, decide settled incidents, resolve the
        alerts of jobs quiet for ``resolve_after`` (``Recorder.resolve_due``)."""
        now, mono = self.clock.time(), self.clock.mono()
        if self.flush_partials is not None:
            stale = self.flush_partials(now - BLOCK_FLUSH_SECONDS)
            if stale:
                self.ingest(stale)
        for finding in self.engine.flush_stale(now, BLOCK_FLUSH_SECONDS):
            self._add(self._job(finding.origin.job), [finding], mono)
        for job in list(self.jobs.values()):
            for hang in job.tracker.check(now):
                self._add(job, [hang], mono)
                self._decide(job, hang)
            if job.trigger is not None and mono - job.opened >= self.config.watch.settle:
                self._decide(job, job.trigger)
        settling = {job.name for job in self.jobs.values() if job.trigger is not None}
        self.recorder.resolve_due(now, hold=settling)   # per job: quiet for resolve_after
        self.recorder.resend_due(mono)     # spooled alerts, due alert groups, rate limits, digests

    def _summary_exits(self, origin: Origin, data: bytes, t: float) -> list[Finding]:
        """Exit findings from a torchelastic failure summary in a stream (P3).

        A launcher pod (torchrun) prints which rank died with which exit code or signal; that
        is the exit a supervisor would have seen. Lines are collected per origin from the
        summary's start to its closing rule; a SIGTERM beside a real failure is the agent
        stopping the survivors and makes no finding (as in replay).
        """
        pending = self._summaries.get(origin)
        if pending is None:
            start = data.find(b"Failures:")
            if start < 0:
                start = data.find(b"Root Cause (first observed failure)")
            if start < 0:
                return []
            pending = self._summaries[origin] = []
            data = data[data.rfind(b"\n", 0, start) + 1:]
        text = [fields.clean(raw) for raw in data.split(b"\n")]
        pending.extend(text)
        closed = any(line.strip().startswith("=====") for line in text) or len(pending) > 2000
        if not closed:
            return []
        del self._summaries[origin]
        failures = parse_summary(pending)
        real = any(f.exitcode != -signal.SIGTERM for f in failures)
        out: list[Finding] = []
        for failure in failures:
            sig = -failure.exitcode if failure.exitcode < 0 else None
            if real and sig == signal.SIGTERM:
                continue
            rank_origin = origin.with_rank(failure.rank) if origin.rank != failure.rank else origin
            exit = ProcessExit(rank_origin, 0, None if sig else failure.exitcode, sig, t)
            finding = exit_finding(exit, self._exit_table, seq=self.engine.next_seq())
            if finding is not None:
                out.append(finding)
        return out

    def close(self) -> None:
        """The input ended (stdin at EOF): flush open blocks and decide every open incident now."""
        now, mono = self.clock.time(), self.clock.mono()
        if self.flush_partials is not None:
            self.ingest(self.flush_partials(float("inf")) or [])
        for origin in self.engine.pending_origins():
            self._add(self._job(origin.job), self.engine.flush(origin, now), mono)
        for job in list(self.jobs.values()):
            if job.trigger is not None:
                self._decide(job, job.trigger)

    # -- internals --------------------------------------------------------------------------

    def _job(self, name: str) -> _Job:
        job = self.jobs.get(name)
        if job is None:
            budgets = BudgetStore.for_job(self.state_dir, name)
            job = _Job(name, Policy.for_config(self.config, budgets, name), budgets, self._tracker())
            self.seen_jobs.add(name)
            self.jobs[name] = job
        return job

    def _tracker(self) -> HangTracker:
        """A job hang tracker (no exit hangs: shipped logs carry no exits)."""
        pol = self.config.policy
        on = pol.enable_job_hang_detection and pol.job_execution_mode == "Sync"
        tracker = HangTracker(float(pol.job_hang_interval) if on else None, None)
        tracker.reset(self.clock.time())
        return tracker

    def _add(self, job: _Job, findings: Sequence[Finding], mono: float) -> None:
        if not findings:
            return
        self.recorder.attempt = job.budgets.attempt
        self.recorder.findings(findings)
        if mono < job.quiet_until:
            return                                  # the aftermath of our own action
        job.findings.extend(findings)
        if job.trigger is None:
            for f in findings:
                if (f.severity >= Severity.ERROR and f.failure_class is not FailureClass.INFO) or \
                        opens_incident(f, job.policy.c4d):          # C4D records, notify / isolate (R8)
                    job.trigger, job.opened = f, mono
                    break

    def _decide(self, job: _Job, trigger: Finding) -> None:
        failed = frozenset(f.origin.instance for f in job.findings
                           if f.severity >= Severity.ERROR and f.failure_class not in
                           (FailureClass.FALLOUT, FailureClass.INFO))
        incident = Incident(trigger, tuple(job.findings), max(len(job.instances), 1), failed,
                            job.budgets.attempt)
        decision = job.policy.decide(incident, self.clock.time())
        job.decisions.append(decision)
        self.recorder.attempt = incident.attempt
        self.recorder.decision(decision)
        result = self.actuator.act(decision)
        self.recorder.event(self.clock.time(), job.name, "actuator", decision.target.instance,
                            decision.target.rank, action=decision.action.label, status=result.status,
                            returncode=result.returncode, output=result.output)
        job.findings.clear()
        job.trigger = None
        if decision.action not in (Action.NONE, Action.NOTIFY):     # a notify changed nothing: no aftermath
            job.quiet_until = self.clock.mono() + self.config.watch.cooldown
        if decision.action in (Action.RESTART_JOB, Action.ISOLATE_NODE, Action.RESTART_IN_PLACE):
            job.instances.clear()                   # a new attempt: instances start again
            job.tracker = self._tracker()
        if decision.action is Action.FAIL_JOB:
            self.recorder.resolve_open(self.clock.time(), "superseded: the job failed", job=job.name)
            del self.jobs[job.name]                 # ended; a job of that name later starts fresh
