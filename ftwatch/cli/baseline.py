"""The recorded baseline of ``ftwatch evaluate``: each set's figures at a run chosen on purpose,
and the check that holds a later run to them.

``--write-baseline FILE`` records, per set (tuning, held-out: ``ftwatch.cli.scorecard``), the
counts (cases, correct actions, correct action + class, false restarts, false fails, no-action
runs restarted or failed), the two accuracies, and the ids of the cases whose action is wrong.
``--check-baseline FILE`` (and ``make test``, through tests/test_evaluate.py) fails when a set's
correct actions or correct action + class fall below the recorded share, compared exactly (counts
cross-multiplied: the corpus is deterministic, so no tolerance), when its no-action runs
restarted or failed rise, or when a set has cases and the baseline none (or the other way round).
Better figures and a changed corpus are notes: re-record on purpose.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftwatch.cli.scorecard import FIGURES, SETS, TITLES, Report
from ftwatch.errors import ConfigError, Issue

BASELINE_FILE = "BASELINE.json"
"""The baseline's name in the corpus directory (``tests/corpus/BASELINE.json``)."""


def baseline_of(report: Report) -> dict[str, Any]:
    """The figures ``--write-baseline`` records: per set the counts, the accuracies and the ids
    of the cases whose action is wrong (to name what went wrong since)."""
    return {"about": "ftwatch evaluate's figures per set at the last recorded run; make test fails when a "
                     "set's accuracy falls below them or its no-action runs restarted/failed rise. Re-record "
                     "on purpose: ftwatch evaluate tests/corpus --write-baseline tests/corpus/BASELINE.json",
            **{name: {**tally.figures(), "wrong_actions": tally.wrong_actions}
               for name, tally in report.sets.items()}}


def write_baseline(report: Report, path: Path) -> None:
    """Record the report's figures in ``path`` (JSON). Raises OSError when it cannot be written."""
    Path(path).write_text(json.dumps(baseline_of(report), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def read_baseline(path: Path) -> dict[str, Any]:
    """A baseline written by :func:`write_baseline`.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or lacks a set or a count.
    """
    name = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([Issue(name, 0, f"cannot read the baseline: {exc.strerror or exc}")]) from None
    except ValueError as exc:
        raise ConfigError([Issue(name, 0, f"not JSON: {exc}")]) from None
    missing = [f"{s}.{k}" for s in SETS for k in FIGURES
               if not isinstance(data, dict) or not isinstance(data.get(s), dict)
               or not isinstance(data[s].get(k), int)]
    if missing:
        raise ConfigError([Issue(name, 0, f"not a baseline: no count {', '.join(missing)} "
                                          "(write one with ftwatch evaluate --write-baseline)")])
    return data


@dataclass(frozen=True)
class BaselineCheck:
    """What :func:`check_baseline` found: failures (the run is worse) and notes (better, or the
    corpus changed: re-record on purpose)."""

    failures: list[str]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.failures


def _pct(good: int, n: int) -> str:
    return f"{good}/{n} ({good / n:.1%})" if n else f"{good}/{n}"


def check_baseline(report: Report, recorded: dict[str, Any]) -> BaselineCheck:
    """Hold each set to its recorded figures.

    A set fails when its correct actions or correct action + class are a smaller share than
    recorded (``now * recorded_cases < recorded * cases``: exact, no tolerance), when its
    no-action runs restarted or failed are more than recorded, or when it has cases and the
    baseline none (or none and the baseline some). A failure names the cases whose action is
    wrong now and was right (or absent) then.

    Args:
        report: this run.
        recorded: :func:`read_baseline`'s data.
    """
    failures, notes = [], []
    for name in SETS:
        cur, rec, title = report.sets[name], recorded[name], TITLES[name].lower()
        n, was_n = cur.cases, rec["cases"]
        if bool(n) != bool(was_n):
            failures.append(f"{title}: {n} cases now, {was_n} recorded (record the corpus on purpose: "
                            "--write-baseline)")
            continue
        if not n:
            continue
        worse = []
        for key, label in (("actions_correct", "correct actions"), ("correct", "correct action + class")):
            now, was = getattr(cur, key), rec[key]
            if now * was_n < was * n:
                worse.append(f"{title} {label} {_pct(now, n)} < recorded {_pct(was, was_n)}")
            elif now * was_n > was * n:
                notes.append(f"{title} {label} rose to {_pct(now, n)} from {_pct(was, was_n)}: record it "
                             "(--write-baseline) so it cannot fall back")
        if cur.no_action_acted > rec["no_action_acted"]:
            worse.append(f"{title} no-action runs restarted/failed {cur.no_action_acted} > recorded "
                         f"{rec['no_action_acted']}")
        elif cur.no_action_acted < rec["no_action_acted"]:
            notes.append(f"{title} no-action runs restarted/failed fell to {cur.no_action_acted} from "
                         f"{rec['no_action_acted']}: record it (--write-baseline)")
        newly = sorted(set(cur.wrong_actions) - set(rec.get("wrong_actions", ())))
        if worse:
            failures += worse + ([f"{title} actions wrong now, right or absent then: {', '.join(newly)}"]
                                 if newly else [])
        elif newly:
            notes.append(f"{title} actions wrong now, right or absent then: {', '.join(newly)}")
        if n != was_n:
            notes.append(f"{title}: {n} cases now, {was_n} recorded: re-record when the corpus changed on "
                         "purpose (--write-baseline)")
    return BaselineCheck(failures, notes)
