"""The incident core: one job's output, exits and clock ticks in, triggers and decisions out.

``ftwatch run``, ``watch``, ``replay`` and ``evaluate`` decide through an :class:`IncidentDesk`
per job; they differ only in how input reaches it and what they do with a decision:

    output(origin, chunk, time)  -> engine.feed, hang tracker, recorder (counts, findings),
                                    torchelastic summary -> exits (watch: at once; replay: at close)
    exited(ProcessExit)          -> that instance's open blocks closed, exit finding (run)
    finished(origin, time)       -> a launcher's clean finish (watch): its workers' silence is no hang
    add(findings)                -> findings made beside the engine (a replayed hang, a Bootcheck)
    tick(now, mono)              -> stale blocks closed, hang check; returns a trigger that is due:
                                    a hang (at once) or an incident whose settle time ran out
    decide(trigger, now)         -> policy.decide(Incident) -> Decision (the driver records, acts)
    close(now)                   -> end of input: blocks flushed, summary exits, the open incident
                                    decided

Exits and torchelastic summaries become findings in ``ftwatch.pipeline.exits`` (an
:class:`~ftwatch.pipeline.exits.ExitReader` per desk: the exits no source reported, a launcher's
private codes under :attr:`IncidentDesk.launchers`); the desk takes them as any other findings.

What opens an incident, which finding triggers it and which instances failed is
``ftwatch.policy.triggers`` (one rule for every driver). An incident opens with its first
opening finding and settles for ``settle`` seconds, in which the others' evidence joins it; a
hang is due at once. Where the source reports exits (``run``) the settle clock starts at the
first error of the job in the ``settle`` seconds before the incident opened, if any (a worker's
fatal line, not its exit a moment later), and a driver that knows which instances still live
ends the settle early once each of them has reported an error of its own since then
(:meth:`IncidentDesk.settled`). After a decision that acted (not ``none`` / ``notify``) the job's new
findings are recorded but open nothing for ``cooldown`` seconds (``watch``: the fallout of its
own action); a hang that only notified re-arms once output resumes. The evidence is the
attempt's: :meth:`new_attempt` clears it (the driver calls it when the job restarts).

Errors the job outlives (issue 12 item 3, ``ftwatch.policy.progress``): where the source
reports no exits (``watch``, ``replay``), an error that a process may catch, log and go on from
(``ftwatch.policy.triggers.may_survive``) opens a *held* incident: due after ``settle`` as any
other when its instance printed nothing since (a dying process), but once that instance prints
again it is due only when ``progress.SURVIVE_SECONDS`` have passed, unless a fatal finding joins
it (an exit, a hang, a torchelastic death report, an isolate-level or sticky error: then ``settle``
from that finding on). When such an error becomes a notice (``ftwatch.pipeline.notices``) it
leaves the evidence, and an incident it alone held is dropped.

The output path (each chunk met, counted, read for progress and fed to the engine, alone or in a
batch) is ``ftwatch.pipeline.intake``; the notices ``ftwatch.pipeline.notices``. Opening, holding,
settling and deciding stay here: they share the open incident's state (openers, settle time, held
flag, cooldown).

Times: ``time``/``now`` are epoch seconds (the lines' clock), ``mono`` monotonic seconds (settle
and cooldown); a replay passes no ``mono`` and never ticks: it decides once, at :meth:`close`.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterable, Literal, Sequence

from ftwatch.bounded import BoundedDict, cap_two_tiers
from ftwatch.config.limits import LimitsConfig
from ftwatch.events import Action, Decision, Finding, Origin, ProcessExit, Severity
from ftwatch.parsers.torchelastic import SummaryFailure
from ftwatch.pipeline import intake, notices
from ftwatch.pipeline.exits import ExitReader, rank_origin
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sources.hostlog import is_host
from ftwatch.policy.catchsite import ended_program
from ftwatch.policy.plan import RunFacts, Verdict
from ftwatch.policy import initphase, lifecycle, progress
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.triggers import (HANG_KINDS, failed_instances, is_error, opens_incident,
                                    pick_trigger, fatal_rules, outside_rules, trim_openers)
from ftwatch.rules.engine import Engine
from ftwatch.rules.timers import HangTracker

POLL_SECONDS = 0.2         # how often a live loop wakes with nothing to read (the Tick period)
SETTLE_SECONDS = 1.0       # ``run``: after a failure, at most how long the others may show their own
                           # errors (the default of ``supervisor.settle_max``)
BLOCK_FLUSH_SECONDS = 2.0  # an open traceback with no new line for this long is closed (P1)

_RULE_SETS: tuple[list, frozenset[str], frozenset[str]] | None = None   # _rule_sets' last rules and sets


def _rule_sets(rules: list) -> tuple[frozenset[str], frozenset[str]]:
    """``(fatal_rules(rules), outside_rules(rules))`` (rule ids), made once per rules list.

    Every desk of a driver shares one engine, whose rules list is replaced when rules change,
    never changed in place (``Engine._compile``), so the sets of the list last asked for are
    kept with it: ``watch``'s desk per job does not read 10,000 rules again (issue 16: ~4 % of
    ``bench_ingest``'s CPU with 10 jobs). The list is held, so its ``id`` is not reused.
    """
    global _RULE_SETS
    held = _RULE_SETS
    if held is None or held[0] is not rules:
        held = _RULE_SETS = (rules, fatal_rules(rules), outside_rules(rules))
    return held[1], held[2]


def _relevant(f: Finding) -> bool:
    """A finding a capped evidence list drops last: a warning or worse, or an exit."""
    return f.severity >= Severity.WARNING or f.kind == "exit_code"


class IncidentDesk:
    """The incidents of one job.

    Args:
        job: the job id.
        engine: the rule engine (may be shared by many desks: its state is per origin).
        policy: the job's policy (``ftwatch.pipeline.build.build_policy``).
        recorder: findings and output counts go here (``ftwatch.pipeline.recorder.Recorder``).
        exits: the source reports process exits (``run``); without them an error opens an
            incident by itself and instances are met by their output.
        settle: seconds an incident collects evidence before it is due (``tick``).
        cooldown: seconds after an acting decision in which new findings open nothing.
        summaries: read torchelastic failure summaries from the output: ``"live"`` (their exits
            count as soon as a summary closes), ``"close"`` (at :meth:`close`, after every line:
            the end of a replayed log is the end of the job), ``"exit"`` (``run``: when the worker
            that printed it, a launcher, exits, its ranks' exits are evidence for that exit) or
            None (real exits only).
        exit_origin: the origin of a summary's exit, from the stream's origin and the failure.
        tracker: the hang tracker; default ``HangTracker.from_policy`` of the policy's flags.
        on_findings: called with every batch of new findings after they are recorded.
        survive: seconds in which an instance's progress outlives its error (0: never).
        limits: the caps on its evidence and instances (``ftwatch.config.limits``; default: the
            defaults): past ``max_info_findings_per_job`` info findings, or
            ``max_findings_per_job`` in all, the oldest info findings leave the evidence first;
            past ``max_instances_per_job`` the least recently active instance is forgotten;
            past ``max_notices_per_job`` the oldest notices are forgotten (``progress.Survival``).
    """

    def __init__(self, job: str, engine: Engine, policy: Policy, recorder: Recorder, *, exits: bool,
                 settle: float = 0.0, cooldown: float = 0.0,
                 summaries: Literal["live", "close", "exit"] | None = None,
                 exit_origin: Callable[[Origin, SummaryFailure], Origin] = rank_origin,
                 tracker: HangTracker | None = None,
                 on_findings: Callable[[list[Finding]], None] | None = None,
                 survive: float = progress.SURVIVE_SECONDS, limits: LimitsConfig | None = None):
        self.limits = limits = limits or LimitsConfig()
        cap = limits.max_instances_per_job
        self.job = job
        self.engine = engine
        self.policy = policy
        self.recorder = recorder
        self.exits = exits
        self.settle = settle
        self.cooldown = cooldown
        self.tracker = tracker or HangTracker.from_policy(policy.policy, exits=exits, max_instances=cap)
        self.on_findings = on_findings
        self.world_size: int | None = None     # the driver's count of instances (run), else counted
        self.findings: list[Finding] = []      # this attempt's evidence
        self._info = 0                         # how many of them are not _relevant
        self.failed: set[str] = set()          # instances with a failing exit ftwatch did not cause
        self.ok: set[str] = set()              # instances that exited 0
        self.finished_at: float | None = None  # a launcher's clean finish in this attempt (:meth:`finished`)
        self._started_at: dict[str, float] = {}   # instance -> its latest start (epoch s)
        self.instances: dict[str, Origin] = BoundedDict(    # least recently active first out
            cap, "instance", on_evict=lambda instance, _: self._started_at.pop(instance, None))
        self.ranks: set[int] = set()
        self.open: Finding | None = None       # the finding that opened the current incident
        self._openers: dict[int, Finding] = {}  # findings that could trigger it, by id, in arrival order
        self._settle_until = 0.0
        self._settle_from = 0.0                # mono: where the open incident's settle clock started
        self._errors: dict[str, tuple[float, float]] = {}   # instance -> mono of (first, latest) own error
        self._quiet_until = float("-inf")
        self._hang_notified = False
        self._tails: dict[Origin, bytes] = BoundedDict(cap)  # each stream's last non-empty line so far
        self._exits = ExitReader(engine, exits=exits, summaries=summaries, exit_origin=exit_origin,
                                 failed=self.failed, ok=self.ok, findings=self.findings, evidence=self.evidence,
                                 started_at=self._started_at, tails=self._tails, survived=partial(notices.survived, self))
        self.survival = progress.Survival(         # errors waiting for their instance's progress; notices
            survive, max_notices=limits.max_notices_per_job, max_instances=cap, on_drop=self._forget_notices,
            where=getattr(engine, "position", None))   # (an engine stand-in may lack it: chunks read whole)
        # sticky CUDA errors and the scheduler's verdicts; the latter alone (notices.ended)
        self._sticky, self._outside = _rule_sets(engine.rules)
        self.progress = initphase.FirstProgress(max_streams=cap)   # when the job first showed progress (R6)
        self._held = False                     # the open incident waits to be outlived ...
        self._alive = False                    # ... and its instance printed since it opened ...
        self._hold_until = 0.0                 # ... so it is due at the latest then (mono)

    @property
    def summaries(self) -> Literal["live", "close", "exit"] | None:
        """When torchelastic summaries count (the ``summaries`` argument)."""
        return self._exits.summaries

    @property
    def launchers(self) -> set[str]:
        """The launchers the job runs under (``lifecycle.launchers``; a driver may add its own)."""
        return self._exits.launchers

    @property
    def own_status(self) -> bool:
        """The command reports its program's own exit status (``ExitReader.own_status``; ``ftwatch
        run`` sets it from ``lifecycle.reports_own_status``)."""
        return self._exits.own_status

    @own_status.setter
    def own_status(self, value: bool) -> None:
        self._exits.own_status = value

    @property
    def attempt(self) -> int:
        """The job's attempt (0 for the first run), from its budgets."""
        return self.policy.budgets.attempt

    # -- input ---------------------------------------------------------------------------------

    def started(self, origin: Origin, time: float) -> None:
        """An instance started at ``time`` (its silence clock starts)."""
        self.instances[origin.instance] = origin
        self._started_at[origin.instance] = time
        if origin.rank is not None:
            self.ranks.add(origin.rank)
        self.tracker.started(origin, time)

    def output(self, origin: Origin, data: bytes, time: float, mono: float = 0.0, *, final: bool = False,
               sim_step: float = 0.0, hits: list[tuple[int, int]] | None = None) -> Finding | None:
        """A chunk of complete lines from ``origin`` (``ftwatch.pipeline.intake.output``: the
        arguments; ``final``: the stream ended). Returns the finding that opened an incident, or a
        failing exit a summary reported; else None."""
        return intake.output(self, origin, data, time, mono, final=final, sim_step=sim_step, hits=hits)

    def output_many(self, parts: Sequence[tuple[Origin, bytes, float, list[tuple[int, int]] | None]],
                    mono: float = 0.0) -> Finding | None:
        """Chunks of many origins of this job at once, ``(origin, data, time, hits)`` each, as
        :meth:`output` of each in order (``ftwatch.pipeline.intake.output_many``). Returns the first
        trigger :meth:`output` returned for one of them, else None."""
        return intake.output_many(self, parts, mono)

    def finished(self, origin: Origin, time: float) -> None:
        """A launcher said at ``time`` that its worker group finished successfully (``watch``): its
        workers leave the hang timers (``HangTracker.launcher_finished``); the attempt counts as
        finished from then (:attr:`finished_at`: ``watch`` ends the job as succeeded when it lets it go)."""
        self.tracker.launcher_finished(origin, time)
        self.finished_at = time if self.finished_at is None else max(self.finished_at, time)

    def exited(self, exit: ProcessExit, mono: float = 0.0, expected: bool = False) -> Finding | None:
        """A worker process ended: its open blocks close, then its exit is judged.

        Args:
            exit: the exit.
            mono: monotonic seconds now.
            expected: ftwatch caused it (besides ``exit.stopped_by_us``: a worker that ended while
                writing the last words ftwatch asked for).

        Returns:
            The exit's finding when it failed on its own (the driver acts on it), else the finding
            that opened an incident, if any.
        """
        for origin in self.engine.pending_origins():
            if origin.key == exit.origin.key:
                self.add(self.engine.flush(origin, exit.time), mono)
        self.tracker.exited(exit.origin, exit.ok, exit.time)
        if self.summaries == "exit":
            self.add(self._exits.launcher_summary(exit, expected), mono)
        return self.add(self._exits.deaths([exit], expected), mono)

    def add(self, findings: Sequence[Finding], mono: float = 0.0, record: bool = True) -> Finding | None:
        """Findings of this job: recorded (unless ``record`` is false: already stored), and
        evidence unless a cooldown runs.

        Returns:
            The finding that opened an incident, or a failing exit (a death always asks for a
            decision); else None.
        """
        if not findings:
            return None
        findings = list(findings)
        if record:
            self.recorder.attempt = self.attempt
            self.recorder.findings(findings)
        self.ranks.update(f.rank for f in findings if f.rank is not None)
        self.launchers.update(lifecycle.launchers(findings))
        if self.on_findings is not None:
            self.on_findings(findings)
        if mono < self._quiet_until:
            return None                             # the aftermath of our own action
        self.findings.extend(findings)
        self._info = cap_two_tiers(self.findings, findings, self._info, self.limits.max_info_findings_per_job,
                                   self.limits.max_findings_per_job, "finding", _relevant)
        trigger = None
        notices.ignored(self, findings)
        for f in findings:
            notices.ended(self, f)
            if self.survival.is_notice(f):
                continue
            if is_error(f) and f.kind not in HANG_KINDS and not is_host(f.origin):   # its own report (settled)
                first, last = self._errors.get(f.origin.instance, (mono, float("-inf")))
                self._errors[f.origin.instance] = (first if mono - last <= self.settle else mono, mono)
            survivable = notices.survivable(self, f)       # (never a traceback that ended the program)
            if not survivable and is_error(f) and ended_program(f):     # its process's earlier errors
                self.survival.program_ended(f)                          # can no longer be outlived
            if survivable and self.survival.repeat(f):      # caught where it was caught before
                notices.notice(self, f, f.time, "the same traceback, caught at the same frame, was outlived before")
                continue
            if survivable:
                self.survival.wait(f)
            if not opens_incident(f, self.policy.c4d, errors=not self.exits):
                continue
            self._openers[id(f)] = f
            if len(self._openers) > self.limits.max_findings_per_job:     # errors printed again and again
                kept = list(self._openers.values())
                trim_openers(kept, self.limits.max_findings_per_job, self._outside | notices.BOOT_RULES)
                self._openers = {id(g): g for g in kept}
            held = survivable and not self.exits
            wait = 0.0 if f.kind in HANG_KINDS else self.settle
            if self.open is None:
                self.open = f
                self._held, self._alive = held, False
                self._settle_from = mono if f.kind in HANG_KINDS or not self.exits else max(mono - self.settle, min(
                    [mono, *(first for first, last in self._errors.values() if last >= mono - self.settle)]))
                self._settle_until = self._settle_from + wait
                self._hold_until = mono + max(wait, self.survival.window)
                trigger = trigger or f
            else:
                if self._held and not held:         # a fatal finding decides the held incident:
                    self._held = False              # its peers' evidence joins for ``settle``
                    self._settle_until = max(self._settle_until, mono + wait) if self._alive else self._settle_until
                if f.kind == "exit_code":
                    trigger = trigger or f
        return trigger

    def tick(self, now: float, mono: float) -> Finding | None:
        """Time passes: close this job's stale blocks, check the hang timers.

        Returns:
            A trigger that is due now: a hang (at once), else the opener of an incident whose
            settle time ran out; None when nothing is due.
        """
        self.add(self.engine.flush_stale(now, BLOCK_FLUSH_SECONDS, job=self.job), mono)
        self.survival.expire(now)
        due = None
        for hang in self.tracker.check(now):
            self.add([hang], mono)
            if due is None and mono >= self._quiet_until:
                due = hang
        if due is None and self.open is not None and mono >= self._settle_until and not (
                self._held and self._alive and mono < self._hold_until):
            due = self.open
        return due

    def settle_left(self, mono: float) -> float:
        """Seconds the open incident still settles at ``mono``, at most; 0 when none is settling."""
        return 0.0 if self.open is None else max(0.0, self._settle_until - mono)

    def settled(self, mono: float, alive: Iterable[str]) -> bool:
        """True when the open incident need wait no longer at ``mono``: its settle time ran out,
        or each instance in ``alive`` (those still running; the others' exits are in) reported an
        error of its own since its settle window began (``settle`` s before its settle clock
        started). True when no incident is open."""
        if self.open is None or mono >= self._settle_until:
            return True
        since = self._settle_from - self.settle
        return all(self._errors.get(i, (0.0, float("-inf")))[1] >= since for i in alive)

    # -- deciding ------------------------------------------------------------------------------

    def decide(self, trigger: Finding | None, now: float, mono: float = 0.0) -> Decision:
        """Ask the policy about the open incident (the driver records the decision and acts).

        Args:
            trigger: the finding the driver acts on (``run``: the one it was handed); None: the
                incident's trigger by ``ftwatch.policy.triggers.pick_trigger``.
            now: epoch seconds, the decision's time.
            mono: monotonic seconds now (the cooldown starts here).

        Raises:
            ValueError: no trigger given and no incident open.
        """
        return self.verdict(trigger, now, mono).decision

    def verdict(self, trigger: Finding | None, now: float, mono: float = 0.0, facts: RunFacts | None = None) -> Verdict:
        """:meth:`decide` with the plan that carries the decision out (``Policy.verdict``);
        ``facts``: what a local run knows (``ftwatch run``), None elsewhere (the decision is
        then :meth:`decide`'s)."""
        trigger = trigger or pick_trigger(list(self._openers.values()))
        evidence = self.evidence()
        failed = failed_instances([f for f in evidence if not is_host(f.origin)], trigger, self.failed,
                                  exits_only=self.exits)
        world = self.world_size or len(self.ranks) or len(self.instances) or 1
        verdict = self.policy.verdict(Incident(trigger, tuple(evidence), world, failed, self.attempt, facts,
                                               self.progress.at, self.progress.progressed,
                                               tuple(self.notices)), now)
        self.forget_incident(mono, verdict.decision.action, trigger)
        return verdict

    def forget_incident(self, mono: float, action: Action, trigger: Finding | None = None) -> None:
        """The open incident was decided with ``action`` (here, or for the whole job by a
        multi-node leader, ``ftwatch.pipeline.cluster``): it closes, and an acting decision
        starts the cooldown; a ``trigger`` hang that only notified waits for output to resume."""
        self.open = None
        self._held = False
        self._openers.clear()
        self._errors.clear()
        if action not in (Action.NONE, Action.NOTIFY):
            self._quiet_until = mono + self.cooldown
        elif trigger is not None and trigger.kind in HANG_KINDS:
            self._hang_notified = True              # one finding per hang episode

    def close(self, now: float, step: float = 0.0) -> Decision | None:
        """The input ended: open blocks close, the summaries' exits count (``summaries="close"``:
        at ``now``, ``step`` apart), and the open incident is decided at ``now``.

        Returns:
            The decision, or None when no incident is open (the job ended by itself).
        """
        for origin in self.engine.pending_origins():
            if origin.job == self.job:
                self.add(self.engine.flush(origin, now))
        if self.summaries == "close":
            self.add(self._exits.closed_summaries(now, step))
        self.add(self._exits.unseen(now))
        notices.booted_before(self, now)
        return self.decide(None, now) if self.open is not None else None

    def new_attempt(self, now: float, world_size: int | None = None) -> None:
        """The job (re)starts at ``now``: the evidence, failed and finished instances, a clean
        finish (:attr:`finished_at`) and any open incident are forgotten; the hang timers re-arm
        (``world_size``: the driver's count of instances, None to count them)."""
        self.findings.clear()
        self._info = 0
        self._openers.clear()
        self._errors.clear()
        self.failed.clear()                         # in place: a driver may hold the set
        self._tails.clear()
        self._exits.new_attempt()
        self.ok.clear()
        self.finished_at = None
        self.open = None
        self._held = False
        self.survival.clear()
        self.progress.reset()
        self._hang_notified = False
        self.world_size = world_size
        if not self.exits:
            self.instances.clear()                  # met again by their output
        self.tracker.reset(now, forget=not self.exits)

    # -- internals -----------------------------------------------------------------------------

    @property
    def notices(self) -> list[Finding]:
        """This attempt's errors its instances outlived (or Python ignored), still in ``findings``."""
        return self.survival.notices

    def evidence(self) -> list[Finding]:
        """This attempt's findings less the notices."""
        return self.survival.evidence(self.findings)

    def _forget_notices(self, gone: list[Finding]) -> None:
        """Notices past ``limits.max_notices_per_job`` leave the evidence too (else they would
        count as errors again); their findings and ``notice`` events are stored."""
        ids = {id(f) for f in gone}
        kept = [f for f in self.findings if id(f) not in ids]
        self._info -= sum(1 for f in self.findings if id(f) in ids and not _relevant(f))
        self.findings[:] = kept
