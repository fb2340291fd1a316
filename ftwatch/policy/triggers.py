"""What opens an incident, which finding triggers it, and which instances failed (SPEC R8, R3, R5,
R7; seeds/000 C4D配置说明). The one rule ``run``, ``watch``, ``replay`` and ``evaluate`` share,
through ``ftwatch.pipeline.incidents.IncidentDesk``.

A finding opens an incident (:func:`opens_incident`) when it is

* a failing exit (kind ``exit_code``: a real one, or one a torchelastic summary reports) or a
  hang / exit hang;
* an error (severity >= error, class not ``info``, fallout included) where the source reports no
  process exits (``watch``, and ``replay`` without a summary): the error stands for the exit the
  source cannot see;
* a C4D record graded at or above ``--c4d-log-level`` (an Error isolates at once when C4D hang
  detection is on: AIMaster isolates the node named in the record directly; a Warn or Info asks a
  person: notify);
* a finding whose rule recommends ``notify`` (e.g. an NPU ``PreSeparateNPU`` code) or
  ``isolate_node`` (a chip or node that must go), unless its class is ``info``.

Of the findings that opened or joined an incident, :func:`pick_trigger` names the one the policy
is asked about, and :func:`failed_instances` the instances that failed on their own. A notify
decision stops nothing.

Fatal or survivable (issue 12 item 3): an error that opens an incident only because the source
reports no exits may be one the process catches, logs and outlives (:func:`may_survive`); the
desk then holds the incident until that instance's progress outlives it
(``ftwatch.policy.progress``) or its window ends. A :func:`fatal` finding is never held: a death
(exit, hang, exit hang, a torchelastic report of a dead worker), a critical line, a rule that asks
to isolate the node (the fault catalogs grade the chip or node out of service: Xid 79, ...), a
CUDA error the catalog marks sticky (``cuda_errors.tsv`` ``sticky = yes``: "the process must be
terminated and relaunched", CUDA Runtime API, cudaError), and a scheduler's or orchestrator's
verdict on the job (a rule tagged :data:`ENDED_FROM_OUTSIDE`: Slurm's ``CANCELLED ... DUE TO TIME
LIMIT``, a preemption, an eviction, ``OOMKilled``): the scheduler ends the job's processes whatever
they print after it (slurm.conf KillWait: "the interval, in seconds, given to a job's processes
between the SIGTERM and SIGKILL signals upon reaching its time limit"; Kubernetes' pod termination:
SIGTERM, then SIGKILL after terminationGracePeriodSeconds), so a program that ignores or bypasses
the SIGTERM and prints more progress has not outlived it (:func:`fatal_rules`).
"""

from __future__ import annotations

import csv
import importlib.resources
import io
from functools import lru_cache
from itertools import compress
from typing import Collection, Iterable, Sequence

from ftwatch.bounded import EVICTIONS
from ftwatch.events import Action, FailureClass, Finding, Severity, is_error
from ftwatch.policy.c4d import LEVELS, C4DSettings, grade, is_c4d, parse_line
from ftwatch.policy.catchsite import ended_program
from ftwatch.policy.rootcause import analyse

HANG_KINDS = ("hang", "exit_hang")
_DEATHS = ("exit_code",) + HANG_KINDS
#: torchelastic reporting a worker that died (torch/distributed/elastic/multiprocessing/api.py
#: "failed (exitcode: ...)", "Sending process ... closing signal"; errors/__init__.py
#: ChildFailedError and its "Root Cause (first observed failure)" summary): a death, never survived
DEATH_REPORTS = frozenset({
    "torch_elastic.child_failed", "torch_elastic.root_cause_summary", "torch_elastic.exitcode_sigabrt",
    "torch_elastic.exitcode_sigkill", "torch_elastic.exitcode_sigsegv", "torch_elastic.survivor_sigterm",
    "torch_elastic.agent_signal_exception"})
#: the CUDA catalog's grades whose rows are sticky errors (tools/catalogs.py GRADES)
STICKY_GRADES = frozenset({"sticky_program", "sticky_ambiguous"})
_LOGGED = ("keyword", "fault_code")


def opens_incident(f: Finding, c4d: C4DSettings, errors: bool = False) -> bool:
    """True when ``f`` opens an incident (see the module docstring).

    Args:
        f: a finding.
        c4d: ``--c4d-log-level`` and the C4D arithmetic (a Warn whose ``times`` reaches
            C4D_HANG_TIMES counts as an Error).
        errors: the source reports no process exits, so an error opens an incident by itself.
    """
    if f.kind in _DEATHS or (errors and is_error(f)):
        return True
    if is_c4d(f):
        rec = parse_line(f.line)
        if rec is None:
            return False
        level, _ = grade(rec, c4d)
        return LEVELS.index(level) >= LEVELS.index(c4d.log_level)
    if f.failure_class is FailureClass.INFO:
        return False
    return f.action in (Action.NOTIFY, Action.ISOLATE_NODE)


@lru_cache(maxsize=1)
def _catalog_sticky() -> frozenset[str]:
    """The older rule ids (``covered_by``) of the CUDA catalog's sticky rows."""
    text = importlib.resources.files("ftwatch.rules").joinpath("packs").joinpath("cuda_errors.tsv").read_text(
        encoding="utf-8")
    return frozenset(row["covered_by"] for row in csv.DictReader(io.StringIO(text), delimiter="\t")
                     if row.get("sticky") == "yes" and row.get("covered_by"))


#: rule tags whose lines are a scheduler's or orchestrator's verdict that ends the job's processes
#: (``rules/packs/scheduler.yaml``, ``infra.yaml``'s Slurm lines, the Kubernetes pod reasons)
ENDED_FROM_OUTSIDE = frozenset({"scheduler", "k8s"})


def outside_rules(rules: Iterable) -> frozenset[str]:
    """The rule ids among ``rules`` (``ftwatch.rules.model.Rule``) of the scheduler's verdicts
    (tagged :data:`ENDED_FROM_OUTSIDE`)."""
    return frozenset(r.id for r in rules if ENDED_FROM_OUTSIDE.intersection(r.tags))


def fatal_rules(rules: Iterable) -> frozenset[str]:
    """The rule ids among ``rules`` whose findings no process outlives beyond :func:`fatal`'s
    kinds: sticky CUDA errors (:func:`sticky_rules`) and the scheduler's verdicts
    (:func:`outside_rules`)."""
    return sticky_rules(rules) | outside_rules(rules)


def sticky_rules(rules: Iterable) -> frozenset[str]:
    """The rule ids of sticky CUDA errors among ``rules`` (``ftwatch.rules.model.Rule``): those
    tagged with a sticky grade (the catalog's generated rules) and the older rules the catalog's
    sticky rows name (``covered_by``)."""
    return frozenset(r.id for r in rules if STICKY_GRADES.intersection(r.tags)) | _catalog_sticky()


def fatal(f: Finding, sticky: Collection[str] = frozenset()) -> bool:
    """A finding no process outlives (see the module docstring); ``sticky``: :func:`fatal_rules`
    (or :func:`sticky_rules`)."""
    return (f.kind in _DEATHS or f.severity >= Severity.CRITICAL or f.action is Action.ISOLATE_NODE
            or f.rule_id in DEATH_REPORTS or f.rule_id in sticky)


def may_survive(f: Finding, sticky: Collection[str] = frozenset()) -> bool:
    """An error a process may catch, log and go on from: a logged error of its own (not fallout:
    that says another rank already failed, and R7 reads it beside that failure), not C4D, that is
    not :func:`fatal`, and not a traceback that unwound the main program
    (``catchsite.ended_program``: Python printed it as the program ended)."""
    return (f.kind in _LOGGED and is_error(f) and f.failure_class is not FailureClass.FALLOUT
            and not is_c4d(f) and not fatal(f, sticky) and not ended_program(f))


def _order(f: Finding) -> tuple[float, int]:
    return (f.time, f.seq)


def pick_trigger(openers: Sequence[Finding]) -> Finding:
    """The finding an incident is decided on, among those that opened it or could have.

    A hang when no real error (not fallout; a failing exit counts) came before it: live, the hang
    fired before anything failed. Else the earliest failing exit; else the earliest error; else
    the earliest opener. Earliest is by (time, seq), so the order findings arrived in (one file
    after another in a replay) does not matter.

    Raises:
        ValueError: ``openers`` is empty.
    """
    errors = [f for f in openers if is_error(f)]
    hang = min((f for f in errors if f.kind in HANG_KINDS), key=_order, default=None)
    if hang is not None and not any(_order(f) < _order(hang) for f in errors
                                    if f.kind not in HANG_KINDS and f.failure_class is not FailureClass.FALLOUT):
        return hang
    exits = [f for f in openers if f.kind == "exit_code"]
    if exits:
        return min(exits, key=_order)
    return min(errors or openers, key=_order)


def trim_openers(openers: list[Finding], cap: int, by_rule: Collection[str] = ()) -> int:
    """Bound an open incident's openers (``IncidentDesk``: the findings that could trigger it, in
    arrival order) once there are more than ``cap``: down to three quarters of it, in place.

    Kept: of each (instance, rule id, kind, class) the earliest by (time, seq), so that
    :func:`pick_trigger` names the same finding (it reads only the earliest error, exit and hang, and
    whether an error of another class came before the hang: each is the earliest of its key); every
    opener whose rule is in ``by_rule`` (the desk looks those up by rule: a boot the job outlived, a
    scheduler's verdict on a job that finished); then the newest up to the target (a quarter of it at
    least), the errors that may still wait for their instance's progress and be taken back as
    notices. An incident held open by errors printed again and again (a job that logs the same NCCL
    failure on every retry, a replay of its log) kept every one: memory and each notice's search
    grew with the input. One difference: a notice that takes back an earliest opener whose later
    peers were dropped falls back to a later one.

    Args:
        openers: oldest first; shortened in place.
        cap: the most it may hold (``limits.max_findings_per_job``, the bound of the evidence they are of).
        by_rule: rule ids whose openers all stay.

    Returns:
        How many were dropped (0 while ``len(openers) <= cap``).
    """
    if len(openers) <= cap:
        return 0
    earliest: dict[tuple, int] = {}
    keep = [False] * len(openers)
    for i, f in enumerate(openers):
        if f.rule_id in by_rule:
            keep[i] = True
            continue
        key = (f.origin.instance, f.rule_id, f.kind, f.failure_class)
        j = earliest.get(key)
        if j is None or _order(f) < _order(openers[j]):
            earliest[key] = i
    for i in earliest.values():
        keep[i] = True
    target = max(1, cap - cap // 4)
    room = max(target - keep.count(True), target // 4)     # the newest always have some
    for i in range(len(openers) - 1, -1, -1):
        if room <= 0:
            break
        if not keep[i]:
            keep[i] = True
            room -= 1
    kept = list(compress(openers, keep))
    dropped = len(openers) - len(kept)
    openers[:] = kept
    EVICTIONS.count("finding", dropped)
    return dropped


def failed_instances(findings: Iterable[Finding], trigger: Finding, exited: Collection[str],
                     exits_only: bool) -> frozenset[str]:
    """The instances that failed on their own.

    Args:
        findings: the incident's findings.
        trigger: its trigger (:func:`pick_trigger`).
        exited: the instances with a failing exit that ftwatch did not cause (an instance
            restarted since is no longer among them).
        exits_only: the source reports process exits, so only an exit fails an instance.

    Returns:
        ``exited``; where it is empty and the source reports no exits, the instances with a real
        error (not fallout, not a hang): the error stands for the exit; but not an instance whose
        every such error came after another instance's failure (R7 via
        ``ftwatch.policy.rootcause.analyse``: a peer's later prints are fallout). Without real
        exits, a hang that triggers an incident fails no instance (it fired before anything
        failed).
    """
    if exits_only:
        return frozenset(exited)
    if trigger.kind in HANG_KINDS:
        return frozenset()
    if exited:
        return frozenset(exited)
    findings = list(findings)
    own = [f for f in findings
           if is_error(f) and f.kind not in HANG_KINDS and f.failure_class is not FailureClass.FALLOUT]
    later = {id(f) for f in analyse(findings).peer_fallout}
    return frozenset(f.origin.instance for f in own if id(f) not in later)
