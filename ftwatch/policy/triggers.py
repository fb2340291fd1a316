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
"""

from __future__ import annotations

from typing import Collection, Iterable, Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity
from ftwatch.policy.c4d import LEVELS, C4DSettings, grade, is_c4d, parse_line
from ftwatch.policy.rootcause import analyse

HANG_KINDS = ("hang", "exit_hang")
_DEATHS = ("exit_code",) + HANG_KINDS


def is_error(f: Finding) -> bool:
    """Severity error or worse and a class other than ``info`` (fallout included)."""
    return f.severity >= Severity.ERROR and f.failure_class is not FailureClass.INFO


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
