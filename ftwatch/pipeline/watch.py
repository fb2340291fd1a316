"""``ftwatch watch``: many jobs that ftwatch did not launch, from shipped logs.

Sources put ``list[Shipped]`` on one bounded queue. The loop takes the batches queued at once
together (``Watcher.next_batch``, up to ``MERGE_LINES`` lines: ``ftwatch.pipeline.sources.batches``,
which also groups a batch's lines per origin), unwraps envelopes, names each
line's job / node / instance (``ftwatch.pipeline.sources.identity``), groups the lines of one batch by
origin into chunks and hands each job's chunks, origins beside them, to its
:class:`ftwatch.pipeline.incidents.IncidentDesk` in one call (``output_many``)
(one per job, all feeding the one Engine: its state is keyed by origin, and origins carry the
job, so jobs never mix). The desk decides as for every driver (``ftwatch.policy.triggers``):

    first error (severity >= error, fallout included; there are no process exits here), C4D
    record at the log level, notify / isolate finding, or the exit a torchelastic summary
    reports -> wait ``settle`` s for the others' evidence -> policy.decide over that job's
    findings -> recorder (store, alerts) -> actuator -> ``cooldown`` s in which the job's new
    errors (the fallout of acting) open no incident (none after a ``notify``: nothing was done).

A job hang (every instance of the job silent for ``job_hang_interval``) decides at once. A
restart starts a new attempt of the job (its instances are met again by their output), a
``fail_job`` ends the job's desk (a job of that name later starts fresh). Shipped logs carry no
process exits: the one sign of a clean end is a launcher's "worker group successfully finished"
(``ftwatch.parsers.torchelastic.CLEAN_FINISH``), after which that launcher's workers are no
longer timed (their silence is no hang: ``IncidentDesk.finished``; the first such finish starts
the exit-hang timer, R5, for the launchers yet to finish), and the job, once let go
for silence (or at the end of stdin), ends as succeeded: a ``none`` decision, its run
``succeeded``, its budgets closed as ``run`` closes them (a job of that name later starts afresh).
A torchelastic agent starting in a pod whose agent finished, or in any pod once none runs, ends it
so at once: the job runs again (``pipeline.reruns``), a run of its own from there. A job that ended
otherwise is simply quiet.

Host evidence (issue 12 item 5, ``ftwatch.pipeline.sources.hostlog``): a node's kernel / driver
line names a node but no job. Each is handed, as output of ``host_origin(node, job)``, to the desk
of every job that has instances on that node (met by their output in the job's current attempt);
a line naming a device (``NVRM: Xid (PCI:0000:3b:00): 79``) goes only to the jobs with an
instance on that device, where the identity knows the instances' devices on that node (else to
every job on the node). In the job's incident it counts by its time (the line's own stamp, else
when it was shipped): a line older than the job's current attempt is not that attempt's evidence.
The lines no job takes are still scanned and their findings stored; they open nothing.

Bounded (issue 17 item 3, the ``limits`` section, ``ftwatch.config.limits``): a job silent for
``job_idle_seconds`` whose incident is not open and whose hang timer has nothing left to judge is
forgotten (desk, SDK handler and the retryable-error rules it added, phase, metrics series: a
job that this ends as succeeded keeps its series, its ``none`` decision among them, one more
``job_idle_seconds``, as a failed job does; kind ``job_idle``), and a new job beyond
``max_jobs`` forgets the job whose output is the oldest (kind ``job``); either starts fresh if it
speaks again. Open blocks past ``max_open_blocks`` / ``max_open_block_bytes`` are closed early,
oldest first, into their job's desk (kind ``open_block``). A forgotten or failed job's desk is
freed by a full collection at most every ``FORGOTTEN_GC_SECONDS`` (its parts refer back to it).
Hourly, the budget files of jobs it keeps no state for that were not written for
``limits.budget_retention`` are deleted (kind ``budget_file``).

The store has a run of a job from when ``watch`` meets it (``RunStart``), and one for each
attempt its restarts start; failing the job ends its run, so a job of the same name that the
cluster runs again later is a run of its own and ``explain`` keeps their findings apart
(``ftwatch.pipeline.sinks.runs``); a job let go for silence goes on with its run when it speaks,
unless a launcher had finished it cleanly (above).

Alerts resolve per job (SPEC N2): a job's restart/hang/isolate alerts resolve once
``resolve_after`` seconds pass with no new such incident of that job (and none settling), at
once when a launcher of the job logs that its worker group finished successfully
(``ftwatch.parsers.torchelastic.CLEAN_FINISH``), and as superseded when the job is failed.

Size: past 400 lines, one job (the loop over batches and the jobs' lifetimes); handing a batch
over per job (issue 16) needs the job state it orders against (new desks, host lines). What needs
none of it is beside it: taking a backlog and grouping its lines per origin
(``sources/batches.py``), which jobs a node's host lines go to (``hostlog.share_host_lines``).
"""

from __future__ import annotations

import gc
import itertools
import queue
import threading
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ftwatch.bounded import EVICTIONS
from ftwatch.clock import SystemClock
from ftwatch.events import Action, Decision, Origin
from ftwatch.parsers.torchelastic import finished_cleanly
from ftwatch.pipeline.sources.phases import PhaseTracker
from ftwatch.pipeline.actuators.exec import ActResult, Actuator, NoneActuator
from ftwatch.pipeline.actuators.outcome import record_outcome
from ftwatch.pipeline.build import build_policy
from ftwatch.policy.budgets import prune_budgets
from ftwatch.pipeline.incidents import BLOCK_FLUSH_SECONDS, POLL_SECONDS, IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.reruns import finishes_first, next_cut
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.batches import chunks_of, group_lines, positions_of, take_backlog
from ftwatch.pipeline.sources.control import ControlHandler, for_job
from ftwatch.pipeline.sources.hostlog import host_origin, is_host, share_host_lines
from ftwatch.rules.engine import Engine
from ftwatch.rules.timers import HangTracker

_NEW_ATTEMPT = (Action.RESTART_JOB, Action.ISOLATE_NODE, Action.RESTART_IN_PLACE)


def tune_gc_for_ingest() -> None:
    """Raise the collector's thresholds for a process that ingests shipped records.

    Records in flight (their metadata maps and Shipped objects) are many young objects that
    live until the engine takes them; with CPython's default threshold (700) a full queue
    triggered dozens of full collections per second, measured at half of ``bench_ingest``'s
    time. The young count is of tracked objects still alive (a freed one is taken off again),
    so the threshold stands above what is in flight: the records queued (~5 maps and lists
    each) and a backlog being gathered (its lines grouped per origin as taken: bytes, untracked,
    in one list per origin; ``sources.batches.GroupedBacklog``). At 50,000, ``bench_ingest``
    (1,000 pods, 8 batches queued) still ran 4 young collections of ~20 ms per 200,000 records,
    each finding nothing (~4 % of its CPU); at 200,000, none (issue 16), also with backlogs of
    ``MERGE_LINES`` = 49,152 lines (kept as ``(origin, line, time)`` tuples, which are tracked,
    they set off one collection of ~35 ms per 200,000 records). Only ``ftwatch watch`` (which
    owns its process) calls this.
    """
    gc.set_threshold(INGEST_GC_THRESHOLD, 20, 20)


INGEST_GC_THRESHOLD = 200_000   # young tracked objects alive before a collection (tune_gc_for_ingest)

FORGOTTEN_GC_SECONDS = 30.0
"""Seconds at least between two full collections that free forgotten jobs (``Watcher._collect``)."""

BUDGET_SWEEP_SECONDS = 3600.0
"""Seconds between two sweeps of stale budget files (``limits.budget_retention``)."""


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
        devices: (job, instance) -> the PCI bus ids of its devices (``Identity.devices``), read
            when a host line names a device; None: no device is known (node-wide).
        monitor: the SDK's HTTP endpoint (``ftwatch.pipeline.sources.monitor.MonitorServer``),
            drained at every tick: each request goes to its job's ``ControlHandler``.
    """

    def __init__(self, config, engine: Engine, recorder: Recorder,
                 resolve: Callable[[list[Shipped]], Iterable[tuple[Origin, bytes, float]]],
                 actuator: Actuator | None = None, clock: SystemClock | None = None,
                 flush_partials: Callable[[float], list[Shipped]] | None = None,
                 devices: Mapping[tuple[str, str], frozenset[str]] | None = None, monitor=None):
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.resolve = resolve
        self.actuator = actuator or NoneActuator()
        self.flush_partials = flush_partials
        self.clock = clock or SystemClock()
        self.queue: queue.Queue = queue.Queue(maxsize=config.watch.queue_batches)
        self.jobs: dict[str, IncidentDesk] = {}
        self.jobs_met = 0       # desks made: a job forgotten (limits) and met again counts again
        self.devices = devices if devices is not None else {}
        self.attempt_start: dict[str, float] = {}     # job -> when its current attempt started
        self.state_dir = Path(config.storage.state_dir)
        self.monitor = monitor
        self.controls: dict[str, ControlHandler] = {}   # job -> its SDK requests' handler
        self.phases: dict[str, PhaseTracker] = {}       # job -> its run's phase (config.phases)
        self._active: dict[str, float] = {}             # job -> its last output (mono s), oldest first
        self._ended_rules: list[str] = []               # SDK rules of forgotten jobs, removed before the next scan
        self._forgotten = 0                             # jobs forgotten since the last full collection
        self._collected = self.clock.mono()             # ... which ran then (mono s)
        self._budgets_swept = float("-inf")             # mono s of the last sweep of budget files
        self._stop = threading.Event()

    # -- public ---------------------------------------------------------------------------

    def stop(self) -> None:
        """End ``run`` at its next wake-up."""
        self._stop.set()

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Take batches until stopped (or ``until()`` is true after a wake-up)."""
        while not self._stop.is_set() and not (until and until()):
            batch = self.next_batch(POLL_SECONDS)
            if batch:
                self.ingest(batch)
            self.tick()

    def next_batch(self, timeout: float) -> list[Shipped] | None:
        """The next queued batch, waiting up to ``timeout`` seconds (None: none came), and with
        it the batches queued behind it, up to ``MERGE_LINES`` lines in all, as one
        ``GroupedBacklog`` (``sources.batches.take_backlog``): a monitor that fell behind takes its
        backlog in one go, so each origin's state, the scan and the step tap's verdicts cost once
        per backlog, not once per batch (1,000 pods: a batch holds about one line per pod).
        Taking what is queued already adds no wait, unless the queue was full (this loop fell
        behind): then it also waits briefly for the batches its sources send next, up to
        ``MERGE_LINES`` (``take_backlog``). A backlog's batches are resolved (``resolve``) and
        their lines grouped per origin as they are taken (a ``GroupedBacklog``), so their
        records' metadata maps are freed while the rest is gathered; ``ingest`` takes its
        groups as they are."""
        return take_backlog(self.queue, timeout, self.resolve)

    def ingest(self, batch: list[Shipped]) -> None:
        """Feed one batch: group lines per origin, scan every origin's chunk in one matcher call
        (``Engine.scan_many``), hand each job's chunks and their hits, origins beside them, to
        its desk in one call (``IncidentDesk.output_many``: a chunk no rule hit costs no engine
        or summary work). The ingest lag is observed once per batch (its most lagging origin),
        not once per origin."""
        now_mono, now = self.clock.mono(), self.clock.time()
        metrics = self.recorder.metrics
        grouped = getattr(batch, "groups", None)            # a backlog: resolved and grouped as taken
        groups = list((grouped if grouped is not None else group_lines(self.resolve(batch))).items())
        chunks = [b"" if is_host(origin) else b"\n".join(lines) + b"\n" for origin, (lines, _) in groups]
        self._drop_rules()
        scans = self.engine.scan_many(chunks)
        if metrics is not None and groups:          # once per batch: its most lagging origin's newest line
            metrics.observe_lag(now - min(t for _, (_, t) in groups))
        # the batch's effects and its sources' positions (a file tail's offsets) in one transaction:
        # a kill before the ack repeats nothing (issue 17, Recorder.storing)
        with self.recorder.storing(positions_of(batch), now, chunks_of(batch)):
            self._ingest_jobs(groups, chunks, scans, now, now_mono)
            self.recorder.blocks(self.engine.changed_blocks(), now)   # blocks still open: stored too
        ack = getattr(batch, "ack", None)
        if ack is not None:
            ack()                   # a file tail may now save its offsets, a Forward client get its ack

    def _ingest_jobs(self, groups: list, chunks: list[bytes], scans: list, now: float, mono: float) -> None:
        """One batch's chunks, grouped per job in input order: one ``output_many`` per job. Host
        lines, and a job's first chunk (its new desk may forget another job: ``max_jobs``), are
        handed over after every chunk before them; with ``phases`` on, each chunk is handed over
        alone and its phase read after it."""
        clean = any(map(finished_cleanly, chunks))   # no copy of the whole batch (its peak memory)
        phased = self.config.phases.enabled
        by_job: dict[str, list] = {}
        active = self._active
        for (origin, (lines, t)), data, hits in zip(groups, chunks, scans):
            if is_host(origin):
                self._feed_jobs(by_job, now, mono, clean)
                by_job = {}
                self._host(origin, lines, t, mono)
                continue
            job = origin.job
            parts = by_job.get(job)
            if parts is None:
                if job not in self.jobs:
                    self._feed_jobs(by_job, now, mono, clean)
                    by_job = {}
                    self._desk(job)
                parts = by_job[job] = []
            parts.append((origin, data, t, hits))
            active.pop(job, None)
            active[job] = mono
            if phased:
                self._feed_jobs(by_job, now, mono, clean)
                by_job = {}
                self._phase(self.jobs[job], data, t)
        self._feed_jobs(by_job, now, mono, clean)

    def _feed_jobs(self, by_job: dict[str, list], now: float, mono: float, clean: bool) -> None:
        """Each job's chunks to its desk; a launcher's clean finish resolves the job's alerts and
        is the desk's (``IncidentDesk.finished``). A job a launcher finished that runs again
        (``reruns.next_cut``) ends there: the lines before go to the finished run, the rest to
        the new one (``_run_again``); a chunk cut so is scanned again (its halves' hits)."""
        for job, parts in by_job.items():
            desk = self.jobs[job]
            if clean:
                parts = finishes_first(parts)
            cut = next_cut(desk, parts, clean) if clean or desk.finished_at is not None else None
            while cut is not None:
                k, at, again = cut
                origin, data, t, _ = parts[k]
                self._feed(desk, parts[:k] + ([(origin, data[:at], t, None)] if at else []), now, mono, clean)
                if again:
                    desk = self._run_again(desk, t, now, mono)
                parts = ([(origin, data[at:], t, None)] if at < len(data) else []) + parts[k + 1:]
                cut = next_cut(desk, parts, clean)
            self._feed(desk, parts, now, mono, clean)

    def _feed(self, desk: IncidentDesk, parts: list, now: float, mono: float, clean: bool) -> None:
        if not parts:
            return
        desk.output_many(parts, mono)
        if clean:
            for origin, data, t, _ in parts:
                if finished_cleanly(data):
                    desk.finished(origin, t)
                    self.recorder.resolve_open(now, f"the workers of {origin.instance} finished successfully",
                                               job=desk.job)

    def _run_again(self, desk: IncidentDesk, t: float, now: float, mono: float) -> IncidentDesk:
        """A job a launcher finished cleanly runs again from ``t`` (epoch s; ``reruns.runs_again``):
        its finished run ends as succeeded (``_end``, its open blocks closed into it first) and
        its state goes as a failed job's does; the new run is met now, a run of its own (fresh
        budgets, hang timers and phase) whose start was seen (host lines before ``t`` are not its
        evidence; its progress is known from the start). Returns the new run's desk."""
        job = desk.job
        self._close_blocks(desk, now, mono)
        self._end(desk)
        self._forget(job, None, now, mono)
        desk = self._desk(job)
        self.attempt_start[job] = t
        desk.progress.reset()
        return desk

    def tick(self) -> None:
        """Time passes: close stale blocks, check hangs, decide settled incidents, resolve the
        alerts of jobs quiet for ``resolve_after`` (``Recorder.resolve_due``)."""
        now, mono = self.clock.time(), self.clock.mono()
        if self.monitor is not None:
            self.monitor.drain(self.control)
        if self.flush_partials is not None:
            stale = self.flush_partials(now - BLOCK_FLUSH_SECONDS)
            if stale:
                self.ingest(stale)
        with self.recorder.storing():   # stale blocks' findings and their closing together (issue 17)
            self.recorder.findings(self.engine.flush_stale(now, BLOCK_FLUSH_SECONDS, job=""))  # no job's host lines
            self._bound(now, mono)
            due = [desk for desk in list(self.jobs.values()) if desk.tick(now, mono) is not None]
            self.recorder.blocks(self.engine.changed_blocks(), now)
        for desk in due:
            self._act(desk, desk.decide(None, now, mono))
        settling = {desk.job for desk in self.jobs.values() if desk.open is not None}
        self.recorder.resolve_due(now, hold=settling)   # per job: quiet for resolve_after
        self.recorder.resend_due(mono)     # spooled alerts, due alert groups, rate limits, digests
        readmit = getattr(self.actuator, "tick", None)  # the kubernetes actuator's readmission
        if readmit is not None:
            for node, result in readmit(now):
                self._acted("", "readmit_node", result, node=node)
        self._drop_rules()
        self.recorder.blocks(self.engine.changed_blocks(), now)   # blocks an action closed
        self._collect(mono)

    def close(self) -> None:
        """The input ended (stdin at EOF): flush open blocks, decide every open incident now and
        end the jobs a launcher finished cleanly (``_end``)."""
        now = self.clock.time()
        if self.flush_partials is not None:
            self.ingest(self.flush_partials(float("inf")) or [])
        for origin in self.engine.pending_origins():
            if is_host(origin) and not origin.job:  # host lines of no job: stored, open nothing
                self.recorder.findings(self.engine.flush(origin, now))
            else:
                self._desk(origin.job)              # a job whose desk ended still has blocks open
        for desk in list(self.jobs.values()):
            decision = desk.close(now)
            if decision is not None:
                self._act(desk, decision)
            elif desk.finished_at is not None:
                self._end(desk)
        self.recorder.blocks(self.engine.changed_blocks(), now)

    def restore_blocks(self, blocks: Iterable[tuple[Origin, bytes, float, frozenset[int]]]) -> None:
        """Open again the blocks the store kept (``SqliteStore.open_blocks``), give each job its
        desk (its ``tick`` closes them when stale), and from now on store the open blocks with
        every batch (``Engine.track_blocks``, issue 17)."""
        now = self.clock.time()
        self.engine.track_blocks()
        for origin, data, base, skip in blocks:
            self.engine.restore_block(origin, data, base, skip, now)
            if origin.job and origin.job not in self.jobs:
                self._desk(origin.job)

    def control(self, message: dict) -> dict:
        """One SDK request of a watched job (``message["job"]``, authenticated by the endpoint):
        answered by that job's ControlHandler on this thread. Its retryable errors hit that job's
        lines only (``control.for_job``: the rule engine is shared by every watched job)."""
        job = message.pop("job")
        handler = self.controls.get(job)
        if handler is None:
            from ftwatch.rules.loader import rules_from_keywords
            desk = self._desk(job)
            pol = self.config.policy
            hang = float(pol.job_hang_interval) if pol.enable_job_hang_detection else None
            handler = self.controls[job] = ControlHandler(
                self.engine, desk.tracker, self.recorder, job, for_job(rules_from_keywords, job), hang,
                hang_supported=hang is not None, clock=self.clock.time)
        return handler(message)

    # -- internals --------------------------------------------------------------------------

    def _phase(self, desk: IncidentDesk, data: bytes, t: float) -> None:
        """Phase detection (``ftwatch.pipeline.sources.phases``): a job's first output is initialization, a phase
        line or a step line changes the job's hang interval. An SDK ``reset_config`` or an open
        ``hang_detect`` scope of the job wins over the phases."""
        tracker = self.phases.get(desk.job)
        if tracker is None:
            pol = self.config.policy
            tracker = self.phases[desk.job] = PhaseTracker(
                self.config.phases, float(pol.job_hang_interval) if pol.enable_job_hang_detection else None)
        phase = tracker.follow(data, t, desk.tracker, self.controls.get(desk.job))
        if phase is not None:
            self.recorder.event(t, desk.job, "phase", phase=phase, job_hang_interval=tracker.interval())

    def _host(self, origin: Origin, lines: list[bytes], t: float, mono: float) -> None:
        """A node's host lines: to the desks of the jobs on that node (module doc,
        ``hostlog.share_host_lines``), the rest scanned and stored only."""
        node = origin.node
        on_node = {job: [o for o in desk.instances.values() if o.node == node]
                   for job, desk in self.jobs.items() if self.attempt_start.get(job, t) <= t}
        on_node = {job: origins for job, origins in on_node.items() if origins}
        taken, left = share_host_lines(lines, on_node, self.devices)
        for job, mine in taken.items():
            desk = self.jobs[job]
            desk.output(host_origin(node, job, origin.stream), b"\n".join(mine) + b"\n", t, mono)
        if left:
            self.recorder.findings(self.engine.feed(origin, b"\n".join(left) + b"\n", t))

    def _bound(self, now: float, mono: float) -> None:
        """The ``limits`` caps (module doc): open blocks past the caps are closed early, idle
        jobs are forgotten."""
        limits = self.config.limits
        for origin in self.engine.pending_over(limits.max_open_blocks, limits.max_open_block_bytes):
            found = self.engine.flush(origin, now)
            EVICTIONS.count("open_block")
            desk = self.jobs.get(origin.job) if origin.job else None
            if desk is not None:
                desk.add(found, mono)
            else:
                self.recorder.findings(found)
        idle = []
        for job, last in self._active.items():
            if mono - last < limits.job_idle_seconds:
                break                                   # oldest first: the rest spoke later
            idle.append(job)
        for job in idle:
            self._forget(job, "job_idle", now, mono)
        keep = limits.budget_retention
        if keep is not None and mono - self._budgets_swept >= BUDGET_SWEEP_SECONDS:
            self._budgets_swept = mono          # a file per job ever met: those of jobs gone long ago go
            EVICTIONS.count("budget_file", prune_budgets(self.state_dir, now - keep, self.jobs))

    def _forget(self, job: str, kind: str | None, now: float, mono: float) -> bool:
        """Drop a job's state; counted under ``kind``. A cap or idleness (``kind`` ``job`` /
        ``job_idle``) closes the job's open blocks into its desk first and keeps a job whose
        incident is open, or (idle) whose hang timer still judges its silence, and ends a job a
        launcher finished cleanly (``_end``); its metrics series go too, but those of a job that
        idleness ended so stay another ``job_idle_seconds`` (its ``none`` decision is scraped).
        ``kind`` None: the job failed (a ``fail_job`` decision, stored): its desk goes at once,
        its series stay until it has been idle ``job_idle_seconds`` (so the failing decision is
        scraped). Returns whether the job's state was dropped."""
        desk = self.jobs.get(job)
        if desk is not None and kind is not None:
            self._close_blocks(desk, now, mono)
            if desk.open is not None or (kind == "job_idle" and desk.tracker.hang_due):
                return False
            if desk.finished_at is not None:
                self._end(desk)
                if kind == "job_idle":          # as a failed job: its series go when idle again
                    self._active.pop(job, None)
                    self._active[job] = mono
                    kind = None
        if self.jobs.pop(job, None) is not None:
            self._forgotten += 1
        handler = self.controls.pop(job, None)
        if handler is not None:      # its set_retryable_errors rules leave the engine (_drop_rules)
            self._ended_rules += handler.rule_ids
        self.phases.pop(job, None)
        self.attempt_start.pop(job, None)
        if kind is not None:
            self._active.pop(job, None)
            self.recorder.metrics.forget_job(job)
            EVICTIONS.count(kind)
        return True

    def _close_blocks(self, desk: IncidentDesk, now: float, mono: float) -> None:
        """The job's open blocks closed into its desk (it is let go, or its run ended)."""
        for origin in self.engine.pending_origins():
            if origin.job == desk.job:
                desk.add(self.engine.flush(origin, now), mono)

    def _end(self, desk: IncidentDesk) -> None:
        """A job whose launcher finished cleanly, let go (or the input ended): it ended as
        succeeded at that finish, as ``run`` ends a job whose workers all exited 0: a ``none``
        decision (``Policy.finished``, which closes its budgets: a job of that name later starts
        afresh) and its run ends ``succeeded``."""
        at, desk.finished_at = desk.finished_at, None
        self.recorder.attempt = desk.attempt
        self.recorder.decision(desk.policy.finished(at, ok=True))
        self.recorder.run_ended(desk.job, desk.attempt, at, "succeeded")

    def _collect(self, mono: float) -> None:
        """Run a full collection when jobs were forgotten, at most every ``FORGOTTEN_GC_SECONDS``.
        A job's desk is held in reference cycles (its parts call back into it: the exits reader,
        the notices, the instances' eviction hook), so dropping it frees nothing until the
        collector runs, and under ``tune_gc_for_ingest``'s thresholds its full passes almost never
        do: a watch whose jobs came and went kept every forgotten job's desk and findings (soak
        part 5: the traced heap grew 0.6 MB/min, 2.6 -> 6.6 MB in 7 minutes). A full pass over
        ``watch`` with 10,000 rules (~70,000 tracked objects) takes ~10 ms."""
        if self._forgotten and mono - self._collected >= FORGOTTEN_GC_SECONDS:
            gc.collect()
            self._forgotten, self._collected = 0, mono

    def _drop_rules(self) -> None:
        """The ``set_retryable_errors`` rules of the jobs forgotten since the last call leave the
        engine, in one compile of the rules added at run time; never while a batch is fed (its scan's hits index the compiled
        rules), so a job forgotten mid-batch keeps them to the batch's end."""
        if self._ended_rules:
            self.engine.remove_rules(self._ended_rules)
            self._ended_rules = []

    def _desk(self, job: str) -> IncidentDesk:
        desk = self.jobs.get(job)
        if desk is None:
            if len(self.jobs) >= self.config.limits.max_jobs:
                now, mono = self.clock.time(), self.clock.mono()
                oldest = [j for j in itertools.islice(self._active, 64) if j in self.jobs]
                for old in oldest:                  # the oldest output first; an open incident stays
                    if self._forget(old, "job", now, mono):
                        break
            policy, limits = build_policy(self.config, job), self.config.limits
            tracker = HangTracker.from_policy(      # a launcher's clean finish is its workers' exit 0
                policy.policy, exits=True, max_instances=limits.max_instances_per_job)
            desk = IncidentDesk(job, self.engine, policy, self.recorder, exits=False, tracker=tracker,
                                settle=self.config.watch.settle, cooldown=self.config.watch.cooldown,
                                summaries="live", limits=limits)
            desk.new_attempt(self.clock.time())
            self.recorder.run_started(job, desk.attempt, self.clock.time(), [])   # met now (sinks.runs)
            self.attempt_start[job] = float("-inf")  # its first attempt began before ftwatch saw it
            desk.progress.reset(known=False)         # ... so whether it made progress is not known (R6)
            self.jobs_met += 1
            self._active.pop(job, None)
            self._active[job] = self.clock.mono()       # met now (by output, the SDK or close)
            self.jobs[job] = desk
        return desk

    def _acted(self, job: str, action: str, result: ActResult, instance: str | None = None,
               rank: int | None = None, decision_id: str = "", node: str | None = None) -> None:
        """Store what the actuator did as an ``actuator`` event of the decision (``explain`` shows
        it); a failure, a held or a dry-run action is also said and alerted (issue 13)."""
        record_outcome(self.recorder, self.clock.time(), job, action, result, instance=instance, rank=rank,
                       decision_id=decision_id, node=node)

    def _act(self, desk: IncidentDesk, decision: Decision) -> None:
        """Record a decision, act on it, and start the job's next attempt (or end it)."""
        self.recorder.attempt = decision.attempt
        self.recorder.decision(decision)
        result = self.actuator.act(decision)
        self._acted(desk.job, decision.action.label, result, decision.target.instance, decision.target.rank,
                    decision_id=decision.decision_id, node=decision.target.node)
        if result.status in ("held", "dry_run"):
            return                                  # nothing was done: no new attempt, the job goes on
        if decision.action in _NEW_ATTEMPT:
            desk.new_attempt(self.clock.time())     # a new attempt: instances start again
            if desk.attempt != decision.attempt:    # (the store's runs: one per attempt, sinks.runs)
                self.recorder.run_ended(desk.job, decision.attempt, self.clock.time(), "restarted")
                self.recorder.run_started(desk.job, desk.attempt, self.clock.time(), [])
            if desk.job in self.controls:
                self.controls[desk.job].new_attempt()   # its hang scopes end with its workers
            self.phases.pop(desk.job, None)             # the next output is initialization again
            self.attempt_start[desk.job] = self.clock.time()
        if decision.action is Action.FAIL_JOB:
            self.recorder.run_ended(desk.job, decision.attempt, self.clock.time(), "failed")
            self.recorder.resolve_open(self.clock.time(), "superseded: the job failed", job=desk.job)
            # ended (its decision is stored); a job of that name later starts fresh
            self._forget(desk.job, None, self.clock.time(), self.clock.mono())
