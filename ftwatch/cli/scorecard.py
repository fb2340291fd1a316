"""The figures of an evaluation, tuning and held-out apart, as text and JSON.

Two sets (``tests/corpus/README.md``): the **tuning** set, the cases the rules were written and
tuned on, and the **held-out** set, cases written after a rule freeze (``held_out: <date>``)
without changing a rule for them. Each set gets the same figures (:class:`Tally`): cases,
correct actions, correct action + class, accuracy per expected failure class, a confusion table
of actions, and three counts of harmful mistakes:

- false restarts: a restart of any kind or an isolation where the expected action is ``none``,
  ``notify`` or ``fail_job``;
- false fails: ``fail_job`` where the expected action is anything else;
- no-action runs restarted or failed: expected ``none``, decided a restart, an isolation or
  ``fail_job`` (issue 12's goal is 0).

A held-out case's decision is never shown, in text or JSON, only whether it was right: reading it
to change a rule would make the case a tuning case.

The recorded baseline these figures are held to is ``ftwatch.cli.baseline``'s.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ftwatch.cli.corpus import Case
from ftwatch.events import Action

RESTARTS = frozenset({"restart_instance", "restart_in_place", "restart_job", "isolate_node"})
"""The decisions that restart something (an isolation restarts the job elsewhere)."""
ACTED = RESTARTS | {"fail_job"}
"""The decisions that act on a job; ``none`` and ``notify`` leave it running."""
SETS = ("tuning", "held_out")
TITLES = {"tuning": "TUNING", "held_out": "HELD-OUT"}
FIGURES = ("cases", "actions_correct", "correct", "false_restarts", "false_fails", "no_action_acted")
"""A set's counts, as JSON and the baseline name them."""
FOOTER = ("Held-out cases (held_out: <freeze date> in case.yaml) are never looked at to change a rule, so "
          "only their ids are listed: a held-out case that prompts a rule change moves to tuning (drop "
          "the mark) and a new held-out case replaces it (tests/corpus/README.md).")


@dataclass(frozen=True)
class Outcome:
    """What ftwatch decided for one case, beside what was expected."""

    case: Case
    action: str
    failure_class: str
    rule: str | None
    rank: int | None
    clause: str
    error: str | None = None

    @property
    def held_out(self) -> bool:
        """The case belongs to the held-out set."""
        return bool(self.case.spec.held_out)

    @property
    def action_ok(self) -> bool:
        return self.action == self.case.spec.expected.action

    @property
    def correct(self) -> bool:
        """Action and class match, and the rule and rank where the case names them."""
        exp = self.case.spec.expected
        return (self.error is None and self.action_ok and self.failure_class == exp.failure_class
                and (exp.rule is None or exp.rule == self.rule)
                and (exp.rank is None or exp.rank == self.rank))

    @property
    def false_restart(self) -> bool:
        """Restarted or isolated where the job should have been left alone or failed."""
        return self.action in RESTARTS and self.case.spec.expected.action not in RESTARTS

    @property
    def false_fail(self) -> bool:
        """Failed a job that should have been left alone, restarted or isolated."""
        return self.action == "fail_job" and self.case.spec.expected.action != "fail_job"

    @property
    def no_action_acted(self) -> bool:
        """A run that needed no action was restarted, isolated or failed."""
        return self.case.spec.expected.action == "none" and self.action in ACTED


@dataclass(frozen=True)
class Tally:
    """The figures of one set of outcomes."""

    outcomes: tuple[Outcome, ...]

    @property
    def cases(self) -> int:
        return len(self.outcomes)

    @property
    def actions_correct(self) -> int:
        return sum(o.action_ok for o in self.outcomes)

    @property
    def correct(self) -> int:
        """Action and class (and rule and rank where named) correct."""
        return sum(o.correct for o in self.outcomes)

    @property
    def action_accuracy(self) -> float | None:
        """Share of correct actions; None for an empty set."""
        return self.actions_correct / self.cases if self.cases else None

    @property
    def accuracy(self) -> float | None:
        """Share of correct action + class; None for an empty set."""
        return self.correct / self.cases if self.cases else None

    @property
    def false_restarts(self) -> int:
        return sum(o.false_restart for o in self.outcomes)

    @property
    def false_fails(self) -> int:
        return sum(o.false_fail for o in self.outcomes)

    @property
    def no_action_acted(self) -> int:
        return sum(o.no_action_acted for o in self.outcomes)

    @property
    def by_class(self) -> dict[str, tuple[int, int]]:
        """Expected failure class -> (correct action + class, cases)."""
        out: dict[str, tuple[int, int]] = {}
        for o in self.outcomes:
            good, n = out.get(o.case.spec.expected.failure_class, (0, 0))
            out[o.case.spec.expected.failure_class] = (good + o.correct, n + 1)
        return out

    @property
    def confusion(self) -> Counter:
        """(expected action, decided action) -> cases."""
        return Counter((o.case.spec.expected.action, o.action) for o in self.outcomes)

    @property
    def wrong_actions(self) -> list[str]:
        """The ids of the cases whose action is wrong, sorted."""
        return sorted(o.case.spec.id for o in self.outcomes if not o.action_ok)

    def figures(self) -> dict[str, Any]:
        """The counts and the two accuracies (None when empty), as JSON and the baseline hold them."""
        return {**{k: getattr(self, k) for k in FIGURES},
                "action_accuracy": self.action_accuracy, "accuracy": self.accuracy}


@dataclass
class Report:
    """Every outcome, and the figures of each set and of all cases together."""

    outcomes: list[Outcome]
    sets: dict[str, Tally] = field(init=False)

    def __post_init__(self) -> None:
        self.sets = {"tuning": Tally(tuple(o for o in self.outcomes if not o.held_out)),
                     "held_out": Tally(tuple(o for o in self.outcomes if o.held_out))}

    @property
    def tuning(self) -> Tally:
        return self.sets["tuning"]

    @property
    def held_out(self) -> Tally:
        return self.sets["held_out"]

    @property
    def all(self) -> Tally:
        return Tally(tuple(self.outcomes))

    @property
    def by_class(self) -> dict[str, tuple[int, int]]:
        """Over all cases: expected class -> (correct, cases)."""
        return self.all.by_class

    @property
    def confusion(self) -> Counter:
        """Over all cases: (expected, decided) -> cases."""
        return self.all.confusion

    @property
    def action_accuracy(self) -> float:
        return self.all.action_accuracy or 0.0

    @property
    def accuracy(self) -> float:
        return self.all.accuracy or 0.0

    @property
    def freezes(self) -> list[str]:
        """The rule-freeze dates the held-out cases were written after."""
        return sorted({o.case.spec.held_out for o in self.outcomes if o.case.spec.held_out})

    @property
    def unmarked_misses(self) -> list[Outcome]:
        """Wrong cases without a ``known_miss`` note (reported; they gate nothing)."""
        return [o for o in self.outcomes if not o.correct and not o.case.spec.known_miss]

    @property
    def fixed_misses(self) -> list[Outcome]:
        """Cases marked known_miss that ftwatch now gets right (unmark them)."""
        return [o for o in self.outcomes if o.correct and o.case.spec.known_miss]


# -- text -------------------------------------------------------------------------------------

_LABEL, _COLUMN = 34, 18


def _share(good: int, n: int) -> str:
    return f"{good}/{n} {good / n:6.1%}" if n else "-"


def _row(label: str, cells: list[str], tail: str = "") -> str:
    return (label.ljust(_LABEL) + "".join(c.rjust(_COLUMN) for c in cells) + tail).rstrip()


def _actions(confusion: Counter) -> list[str]:
    seen = {a for pair in confusion for a in pair}
    order = [a.label for a in Action]
    return [a for a in order if a in seen] + sorted(seen - set(order))


def _confusion_table(title: str, tally: Tally) -> list[str]:
    out = ["", f"confusion of actions, {title} (rows: expected, columns: decided):"]
    if not tally.cases:
        return out + ["  (no case)"]
    actions = _actions(tally.confusion)
    width = max(len(a) for a in actions + ["expected \\ decided"]) + 1
    out.append("  " + "expected \\ decided".ljust(width) + "".join(a.rjust(width) for a in actions))
    for exp in actions:
        row = [tally.confusion.get((exp, dec), 0) for dec in actions]
        if any(row):
            out.append("  " + exp.ljust(width) + "".join(str(n or ".").rjust(width) for n in row))
    return out


def _tuning_misses(report: Report) -> list[str]:
    out = []
    for o in report.tuning.outcomes:
        if o.correct:
            continue
        exp = o.case.spec.expected
        mark = "known miss" if o.case.spec.known_miss else "MISS"
        got = o.error or f"{o.action} [{o.failure_class}] {o.rule or '-'} rank {o.rank}"
        out.append(f"  {mark:<10} {o.case.spec.id}: expected {exp.action} [{exp.failure_class}]"
                   f"{' ' + exp.rule if exp.rule else ''}, decided {got}")
        if o.case.spec.known_miss:
            out.append(f"             why: {o.case.spec.known_miss}")
    return out


def format_report(report: Report) -> str:
    """The report as text: the two sets side by side (cases, accuracies, harmful mistakes, per
    expected failure class), a confusion table per set, the tuning misses in full and the
    held-out misses by id, one line over all cases, and the held-out discipline."""
    t, h = report.tuning, report.held_out
    out = [_row("", ["TUNING", "HELD-OUT"]),
           _row("cases", [str(t.cases), str(h.cases)]),
           _row("written after the rule freeze of", ["-", ", ".join(report.freezes) or "-"]),
           _row("actions correct", [_share(t.actions_correct, t.cases), _share(h.actions_correct, h.cases)]),
           _row("action + class correct", [_share(t.correct, t.cases), _share(h.correct, h.cases)]),
           _row("false restarts", [str(t.false_restarts), str(h.false_restarts)]),
           _row("false fails", [str(t.false_fails), str(h.false_fails)]),
           _row("no-action runs restarted/failed", [str(t.no_action_acted), str(h.no_action_acted)],
                "   (goal: 0)"),
           "", "per expected failure class (action + class correct / cases):"]
    tb, hb = t.by_class, h.by_class
    for cls in sorted(set(tb) | set(hb)):
        out.append(_row(f"  {cls}", [_share(*tb.get(cls, (0, 0))), _share(*hb.get(cls, (0, 0)))]))
    out += _confusion_table("TUNING", t) + _confusion_table("HELD-OUT", h)
    misses = _tuning_misses(report)
    if misses:
        out += ["", "tuning misses:"] + misses
    for o in report.fixed_misses:
        out.append(f"  note: {o.case.spec.id} is marked known_miss but is now decided correctly")
    held_wrong = [o.case.spec.id for o in h.outcomes if not o.correct]
    if held_wrong:
        out += ["", "held-out misses (ids only):"]
        out += textwrap.wrap(", ".join(held_wrong), 100, initial_indent="  ", subsequent_indent="  ",
                             break_on_hyphens=False)
    n = len(report.outcomes)
    out += ["", f"{n} cases: actions correct {report.all.actions_correct}/{n} "
                f"({report.action_accuracy:.1%}); action + class correct "
                f"{report.all.correct}/{n} ({report.accuracy:.1%}); "
                f"known misses {sum(1 for o in report.outcomes if o.case.spec.known_miss)}; "
                f"unmarked misses {len(report.unmarked_misses)}"]
    out += textwrap.wrap(FOOTER, 100)
    return "\n".join(out)


# -- JSON -------------------------------------------------------------------------------------

def _tally_json(tally: Tally) -> dict[str, Any]:
    return {**tally.figures(),
            "by_class": {c: {"correct": g, "cases": n} for c, (g, n) in sorted(tally.by_class.items())},
            "confusion": [{"expected": e, "decided": d, "n": n} for (e, d), n in sorted(tally.confusion.items())]}


def _outcome_json(o: Outcome) -> dict[str, Any]:
    if o.held_out:                                   # right or wrong, never what was decided
        return {"id": o.case.spec.id, "set": "held_out", "action_correct": o.action_ok, "correct": o.correct}
    return {"id": o.case.spec.id, "set": "tuning", "expected": o.case.spec.expected.model_dump(),
            "decided": {"action": o.action, "failure_class": o.failure_class,
                        "rule": o.rule, "rank": o.rank, "clause": o.clause},
            "action_correct": o.action_ok, "correct": o.correct, "known_miss": o.case.spec.known_miss,
            "error": o.error}


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (``ftwatch evaluate --json``): all cases' accuracy, per-class
    and confusion at the top (as before the sets), each set's figures under ``sets``, the misses
    per set (ids), and one entry per case (a held-out case's without its decision)."""
    everything = _tally_json(report.all)
    return {
        "cases": len(report.outcomes),
        "action_accuracy": report.action_accuracy,
        "accuracy": report.accuracy,
        "by_class": everything["by_class"],
        "confusion": everything["confusion"],
        "freezes": report.freezes,
        "sets": {name: _tally_json(tally) for name, tally in report.sets.items()},
        "misses": {name: [o.case.spec.id for o in tally.outcomes if not o.correct]
                   for name, tally in report.sets.items()},
        "outcomes": [_outcome_json(o) for o in report.outcomes],
    }
