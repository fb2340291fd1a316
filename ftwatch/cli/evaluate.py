"""``ftwatch evaluate``: the evaluation corpus through the same engine and policy as replay (T4).

A corpus is a directory of cases, one sub-directory each (``tests/corpus/README.md``): a
``case.yaml`` (where the failure comes from, what its thread concluded, the expected action and
failure class) and the logs, one file per instance (``rank3.log``) or one combined log, exactly as
``ftwatch replay`` takes them. Each case runs through :func:`ftwatch.pipeline.replay.replay` (the
incident core every driver decides through) with a fresh Engine and Policy built as ``ftwatch
replay`` builds them (``ftwatch.pipeline.build``: the step tap, the config's ModelArts and recovery
settings, history and blame in memory) and a fresh budget store in its own temporary directory,
under the case's AIMaster flags (default :data:`DEFAULT_FLAGS`, the ``make run`` policy without
hang detection).

The decided failure class is the root cause's class; a decision whose root cause is only fallout
is read as ``retryable_infra`` (the policy's reading, SPEC D2/R7) and a decision without a root
cause (the job ended by itself) as ``none``. A case is correct when the decided action and failure
class both match (and the root-cause rule, where the case names one). A case marked
``known_miss`` is a failure the rules are known to get wrong; it counts against the accuracy but
does not fail the run on its own.

This module is a hub (tests/test_layering.py): it drives the pipeline's replay with the engine
and policy of ``ftwatch.pipeline.build``, as ``ftwatch.cli.replay`` does.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ftwatch.config.model import Config, parse_aimaster_flags
from ftwatch.errors import ConfigError, Issue
from ftwatch.events import Action, FailureClass
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.model import Rule
from ftwatch.config.yamlsource import dotted, line_index, parse_yaml
from ftwatch.cli.common import ArgumentParser

CASE_FILE = "case.yaml"
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
DEFAULT_FLAGS = ("--enable-job-restart=True", "--max-num-of-job-restart=3")
"""The policy a case runs under unless it names its own flags: ``make run``'s restart settings
(Sync, ExitCodeAndErrorMsg, restarts on, 3 of them); hang detection stays off, since most threads'
logs were cut from long silences (a case about a hang turns it on)."""
NONE_CLASS = "none"
CLASSES = tuple(c.value for c in FailureClass) + (NONE_CLASS,)


class Expected(BaseModel):
    """What the thread concluded, as ftwatch should decide it."""

    model_config = ConfigDict(extra="forbid")
    action: str = Field(description="the action the job should get: none, notify, restart_instance, "
                                    "restart_in_place, restart_job, isolate_node or fail_job")
    failure_class: str = Field(description="the root cause's failure class (SPEC vocabulary), or none")
    rule: str | None = Field(None, description="the root-cause rule id, where the case checks it")
    rank: int | None = Field(None, description="the root-cause rank, where the case checks it")


class CaseSpec(BaseModel):
    """One ``case.yaml``."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="the case id; equals its directory name")
    title: str = Field(description="one line: what failed")
    source: str = Field(description="the public thread the case is rebuilt from (URL)")
    software: str = Field(description="pytorch, nccl, deepspeed, megatron, ascend, hang, ...")
    conclusion: str = Field(description="what the thread concluded, in one sentence of our own words")
    expected: Expected = Field(description="the decision ftwatch should take")
    flags: list[str] | None = Field(None, description="AIMaster flags for this case (default DEFAULT_FLAGS)")
    known_miss: str | None = Field(None, description="why ftwatch still decides this case wrongly (kept on purpose)")
    notes: str | None = Field(None, description="anything else: how the log was rebuilt, what was changed")
    held_out: str | None = Field(None, description="the rule freeze (a date) this case was written after, without "
                                                   "changing a rule for it: its accuracy is reported apart")


@dataclass(frozen=True)
class Case:
    """A case read from disk: its spec, its directory and its log files (sorted)."""

    spec: CaseSpec
    path: Path
    logs: tuple[Path, ...]


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
    def action_ok(self) -> bool:
        return self.action == self.case.spec.expected.action

    @property
    def correct(self) -> bool:
        """Action and class match, and the rule and rank where the case names them."""
        exp = self.case.spec.expected
        return (self.error is None and self.action_ok and self.failure_class == exp.failure_class
                and (exp.rule is None or exp.rule == self.rule)
                and (exp.rank is None or exp.rank == self.rank))


@dataclass
class Report:
    """Every outcome, and the numbers ``format_report`` prints."""

    outcomes: list[Outcome]
    by_class: dict[str, tuple[int, int]] = field(default_factory=dict)   # class -> (correct, cases)
    confusion: Counter = field(default_factory=Counter)                  # (expected, decided) -> n

    @property
    def action_accuracy(self) -> float:
        return sum(o.action_ok for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    @property
    def accuracy(self) -> float:
        return sum(o.correct for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    @property
    def unmarked_misses(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.correct and not o.case.spec.known_miss]

    @property
    def fixed_misses(self) -> list[Outcome]:
        """Cases marked known_miss that ftwatch now gets right (unmark them)."""
        return [o for o in self.outcomes if o.correct and o.case.spec.known_miss]


def load_case(path: Path) -> Case:
    """Read one case directory.

    Raises:
        ConfigError: ``case.yaml`` is missing, not YAML, or breaks the schema (file:line), an
            action or class is unknown, the id is not the directory's name, or there is no log.
    """
    spec_file = path / CASE_FILE
    name = str(spec_file)
    try:
        text = spec_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Issue(name, 0, f"cannot read: {exc.strerror or exc}")]) from None
    data, issues = parse_yaml(text, name)          # never raises: syntax errors come as issues
    if issues:
        raise ConfigError(issues)
    try:
        spec = CaseSpec.model_validate(data)
    except ValidationError as exc:
        lines = line_index(data)
        raise ConfigError([Issue(name, lines.get(tuple(e["loc"]), lines.get(tuple(e["loc"][:-1]), 0)),
                                 f"{dotted(e['loc'])}: {e['msg']}") for e in exc.errors()]) from None
    problems = []
    try:
        Action.parse(spec.expected.action)
    except (KeyError, ValueError):
        problems.append(f"expected.action: unknown action {spec.expected.action!r}")
    if spec.expected.failure_class not in CLASSES:
        problems.append(f"expected.failure_class: unknown class {spec.expected.failure_class!r} "
                        f"(one of {', '.join(CLASSES)})")
    if spec.id != path.name:
        problems.append(f"id {spec.id!r} is not the directory's name {path.name!r}")
    logs = tuple(sorted(p for p in path.iterdir() if p.is_file() and p.suffix in LOG_SUFFIXES))
    if not logs:
        problems.append(f"no log file ({', '.join(LOG_SUFFIXES)}) beside it")
    if problems:
        raise ConfigError([Issue(name, 0, p) for p in problems])
    return Case(spec, path, logs)


def load_corpus(root: Path) -> list[Case]:
    """Every case under ``root`` (sub-directories holding a ``case.yaml``), by name.

    Raises:
        ConfigError: any case is bad; every bad case is reported at once.
    """
    cases, issues = [], []
    for sub in sorted(p for p in Path(root).iterdir() if (p / CASE_FILE).is_file()):
        try:
            cases.append(load_case(sub))
        except ConfigError as exc:
            issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
    if not cases:
        raise ConfigError([Issue(str(root), 0, f"no case (a directory with {CASE_FILE})")])
    return cases


def run_case(case: Case, rules: Sequence[Rule], base: Config | None = None) -> Outcome:
    """Replay one case with a fresh engine and budget store (in a temporary directory).

    Args:
        case: the case.
        rules: loaded rules (shared between cases; the engine compiles them per case).
        base: the config the case's flags apply to (default: the built-in ``Config()``).

    Returns:
        The outcome; a log that cannot be read gives an outcome with ``error`` set.

    Raises:
        ConfigError: the case's flags are unknown or invalid.
    """
    flags, unknown = parse_aimaster_flags(list(case.spec.flags if case.spec.flags is not None else DEFAULT_FLAGS))
    if unknown:
        raise ConfigError([Issue(str(case.path / CASE_FILE), 0, f"flags: unknown {' '.join(unknown)}")])
    config = (base or Config()).with_policy(**flags)
    job = case.spec.id
    with tempfile.TemporaryDirectory(prefix="ftwatch-eval-") as tmp:
        # as ``ftwatch replay`` builds them: history and blame in memory, the step tap on
        policy = build_policy(config, job, BudgetStore(Path(tmp) / "budgets.json", job), state_dir=Path(tmp),
                              in_memory=True)
        try:
            result = replay(list(case.logs), build_engine(config, rules), policy, job)
        except OSError as exc:
            return Outcome(case, "error", NONE_CLASS, None, None, "", error=str(exc))
    d = result.decision
    rc = d.root_cause
    if rc is None:
        cls = NONE_CLASS
    elif rc.failure_class is FailureClass.FALLOUT:
        cls = FailureClass.RETRYABLE_INFRA.value      # only fallout: the policy's reading
    else:
        cls = rc.failure_class.value
    return Outcome(case, d.action.label, cls, rc.rule_id if rc else None, rc.rank if rc else None, d.policy_clause)


def evaluate(cases: Sequence[Case], rules: Sequence[Rule], base: Config | None = None) -> Report:
    """Run every case; tally accuracy per expected failure class and the action confusion table."""
    report = Report([run_case(c, rules, base) for c in cases])
    for o in report.outcomes:
        cls = o.case.spec.expected.failure_class
        good, n = report.by_class.get(cls, (0, 0))
        report.by_class[cls] = (good + o.correct, n + 1)
        report.confusion[(o.case.spec.expected.action, o.action)] += 1
    return report


def _actions(report: Report) -> list[str]:
    seen = {a for pair in report.confusion for a in pair}
    order = [a.label for a in Action]
    return [a for a in order if a in seen] + sorted(seen - set(order))


def format_report(report: Report) -> str:
    """The report as text: per-class accuracy, the confusion table (rows expected, columns
    decided), the misses (known ones marked), and the two accuracy lines."""
    out = ["accuracy per failure class (action + class correct):"]
    for cls in sorted(report.by_class):
        good, n = report.by_class[cls]
        out.append(f"  {cls:<16} {good:>3}/{n:<3} {good / n:6.1%}")
    actions = _actions(report)
    width = max(len(a) for a in actions + ["expected \\ decided"]) + 1
    out += ["", "confusion of actions (rows: expected, columns: decided):",
            "  " + "expected \\ decided".ljust(width) + "".join(a.rjust(width) for a in actions)]
    for exp in actions:
        row = [report.confusion.get((exp, dec), 0) for dec in actions]
        if any(row):
            out.append("  " + exp.ljust(width) + "".join(str(n or ".").rjust(width) for n in row))
    misses = [o for o in report.outcomes if not o.correct]
    if misses:
        out += ["", "misses:"]
        for o in misses:
            exp = o.case.spec.expected
            mark = "known miss" if o.case.spec.known_miss else "MISS"
            got = o.error or f"{o.action} [{o.failure_class}] {o.rule or '-'} rank {o.rank}"
            out.append(f"  {mark:<10} {o.case.spec.id}: expected {exp.action} [{exp.failure_class}]"
                       f"{' ' + exp.rule if exp.rule else ''}, decided {got}")
            if o.case.spec.known_miss:
                out.append(f"             why: {o.case.spec.known_miss}")
    for o in report.fixed_misses:
        out.append(f"  note: {o.case.spec.id} is marked known_miss but is now decided correctly")
    n = len(report.outcomes)
    out += ["", f"{n} cases: actions correct {sum(o.action_ok for o in report.outcomes)}/{n} "
                f"({report.action_accuracy:.1%}); action + class correct "
                f"{sum(o.correct for o in report.outcomes)}/{n} ({report.accuracy:.1%}); "
                f"known misses {sum(1 for o in report.outcomes if o.case.spec.known_miss)}; "
                f"unmarked misses {len(report.unmarked_misses)}"]
    held = [o for o in report.outcomes if o.case.spec.held_out]
    if held:
        out.append(f"held-out cases (written after a rule freeze): action + class correct "
                   f"{sum(o.correct for o in held)}/{len(held)}")
    return "\n".join(out)


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (``ftwatch evaluate --json``)."""
    return {
        "cases": len(report.outcomes),
        "action_accuracy": report.action_accuracy,
        "accuracy": report.accuracy,
        "by_class": {c: {"correct": g, "cases": n} for c, (g, n) in sorted(report.by_class.items())},
        "confusion": [{"expected": e, "decided": d, "n": n} for (e, d), n in sorted(report.confusion.items())],
        "outcomes": [{"id": o.case.spec.id, "expected": o.case.spec.expected.model_dump(),
                      "decided": {"action": o.action, "failure_class": o.failure_class,
                                  "rule": o.rule, "rank": o.rank, "clause": o.clause},
                      "correct": o.correct, "known_miss": o.case.spec.known_miss, "error": o.error}
                     for o in report.outcomes],
    }


def cmd_evaluate(argv: list[str]) -> int:
    p = ArgumentParser(prog="ftwatch evaluate",
                       description="Run the evaluation corpus; print accuracy per failure class and "
                                   "a confusion table of actions (T4).")
    p.add_argument("corpus", nargs="?", type=Path, default=Path("tests/corpus"), help="corpus directory")
    p.add_argument("--config", help="YAML config file (rules, base policy); each case's flags apply on top")
    p.add_argument("--min-accuracy", type=float, default=0.9,
                   help="exit 1 when the share of correct actions is below this (default 0.9)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    from ftwatch.cli.common import EXIT_USAGE, load_config_from_args
    from ftwatch.pipeline.build import build_rules
    if not args.corpus.is_dir():
        print(f"ftwatch evaluate: no directory {args.corpus}", file=sys.stderr)
        return EXIT_USAGE
    config = load_config_from_args(args, {})
    report = evaluate(load_corpus(args.corpus), build_rules(config), config)
    print(json.dumps(report_json(report), ensure_ascii=False, indent=1) if args.json else format_report(report))
    failed = report.action_accuracy < args.min_accuracy or bool(report.unmarked_misses)
    if failed and not args.json:
        why = [f"action accuracy {report.action_accuracy:.1%} < {args.min_accuracy:.0%}"] \
            if report.action_accuracy < args.min_accuracy else []
        why += [f"{len(report.unmarked_misses)} unmarked miss(es)"] if report.unmarked_misses else []
        print(f"ftwatch evaluate: FAILED: {'; '.join(why)}", file=sys.stderr)
    return 1 if failed else 0
