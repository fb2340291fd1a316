"""``ftwatch evaluate``: the evaluation corpus through the same engine and policy as replay (T4).

The corpus (``ftwatch.cli.corpus``, ``tests/corpus/README.md``) is a directory of cases, each a
``case.yaml`` and its logs. Each case runs through :func:`ftwatch.pipeline.replay.replay` (the
incident core every driver decides through) with an Engine and Policy built as ``ftwatch replay``
builds them (``ftwatch.pipeline.build``: the step tap, the config's ModelArts and recovery
settings, history and blame in memory) and a fresh budget store in its own temporary directory,
under the case's AIMaster flags (default :data:`DEFAULT_FLAGS`, the ``make run`` policy without
hang detection). The rules' database is compiled once for all cases (``Engine``'s ``like``): a
fresh engine per case, sharing the compiled matcher, so nothing a case feeds reaches the next.

The decided failure class is the root cause's class; a decision whose root cause is only fallout
is read as the policy reads it (SPEC D2/R7: ``hang`` when every rank reports only collective
timeouts, else ``retryable_infra``; ``Analysis.fallout_class``) and a decision without a root
cause (the job ended by itself) as ``none``. A case is correct when the decided action and failure
class both match (and the root-cause rule, where the case names one).

The figures, tuning and held-out apart, are ``ftwatch.cli.scorecard``'s, the recorded baseline
``ftwatch.cli.baseline``'s.
The command exits 1 when a gate fails: ``--check-baseline FILE`` (a set's accuracy below the
recorded one, or more no-action runs restarted or failed), ``--min-accuracy`` (the held-out set's
share of correct actions, or the tuning set's while there is no held-out case). ``known_miss`` is a
note for readers and gates nothing.

This module is a hub (tests/test_layering.py): it drives the pipeline's replay with the engine
and policy of ``ftwatch.pipeline.build``, as ``ftwatch.cli.replay`` does.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from ftwatch.cli.common import ArgumentParser
from ftwatch.cli.corpus import (CASE_FILE, CLASSES, LOG_SUFFIXES, NONE_CLASS, Case, CaseSpec, Expected,
                                load_case, load_corpus)
from ftwatch.cli.baseline import check_baseline, read_baseline, write_baseline
from ftwatch.cli.scorecard import Outcome, Report, format_report, report_json
from ftwatch.config.model import Config, parse_aimaster_flags
from ftwatch.errors import ConfigError, Issue
from ftwatch.events import FailureClass
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.model import Rule

__all__ = ["CASE_FILE", "CLASSES", "DEFAULT_FLAGS", "LOG_SUFFIXES", "NONE_CLASS", "Case", "CaseSpec", "Expected",
           "Outcome", "Report", "cmd_evaluate", "evaluate", "format_report", "load_case", "load_corpus",
           "report_json", "run_case"]
"""The corpus model and the figures are re-exported: the case schema has always been known as
``ftwatch.cli.evaluate.CaseSpec``."""

DEFAULT_FLAGS = ("--enable-job-restart=True", "--max-num-of-job-restart=3")
"""The policy a case runs under unless it names its own flags: ``make run``'s restart settings
(Sync, ExitCodeAndErrorMsg, restarts on, 3 of them); hang detection stays off, since most threads'
logs were cut from long silences (a case about a hang turns it on)."""
MIN_ACCURACY = 0.9
"""``--min-accuracy``'s default when no baseline is checked (issue 12: held-out >= 90 %)."""


def run_case(case: Case, rules: Sequence[Rule], base: Config | None = None, like: Engine | None = None) -> Outcome:
    """Replay one case with a fresh engine and budget store (in memory; its state directory a
    temporary one).

    Args:
        case: the case.
        rules: loaded rules (shared between cases).
        base: the config the case's flags apply to (default: the built-in ``Config()``).
        like: an engine whose compiled database the case's engine shares when the rules are the
            same (:func:`evaluate` passes its first case's); None compiles one.

    Returns:
        The outcome; a log that cannot be read gives an outcome with ``error`` set.

    Raises:
        ConfigError: the case's flags are unknown or invalid.
    """
    with tempfile.TemporaryDirectory(prefix="ftwatch-eval-") as tmp:
        return _run_case(case, rules, base, like, Path(tmp))[0]


def _run_case(case: Case, rules: Sequence[Rule], base: Config | None,
              like: Engine | None, state: Path) -> tuple[Outcome, Engine]:
    """:func:`run_case` with the state directory ``state`` (not created here: nothing a replay
    does writes there, the budgets and the fault history being in memory; anything that ever
    does creates it, a folder of its own per case), and the engine it used (for the next
    case's ``like``)."""
    flags, unknown = parse_aimaster_flags(list(case.spec.flags if case.spec.flags is not None else DEFAULT_FLAGS))
    if unknown:
        raise ConfigError([Issue(str(case.path / CASE_FILE), 0, f"flags: unknown {' '.join(unknown)}")])
    config = (base or Config()).with_policy(**flags)
    job = case.spec.id
    engine = build_engine(config, rules, like=like)
    # as ``ftwatch replay`` builds them: budgets, history and blame in memory, the step tap on
    policy = build_policy(config, job, BudgetStore(None, job), state_dir=state, in_memory=True)
    try:
        result = replay(list(case.logs), engine, policy, job)
    except OSError as exc:
        return Outcome(case, "error", NONE_CLASS, None, None, "", error=str(exc)), engine
    d = result.decision
    rc = d.root_cause
    if rc is None:
        cls = NONE_CLASS
    elif rc.failure_class is FailureClass.FALLOUT:
        cls = analyse(d.findings).fallout_class.value    # only fallout: the policy's reading
    else:
        cls = rc.failure_class.value
    outcome = Outcome(case, d.action.label, cls, rc.rule_id if rc else None, rc.rank if rc else None,
                      d.policy_clause)
    return outcome, engine


def evaluate(cases: Sequence[Case], rules: Sequence[Rule], base: Config | None = None) -> Report:
    """Run every case, the rules compiled once; the Report tallies tuning and held-out apart.
    Each case's state directory is a folder of one temporary directory, made only if written
    (a temporary directory made and removed per case was ~2 s of a 32 s run of the corpus)."""
    outcomes, like = [], None
    with tempfile.TemporaryDirectory(prefix="ftwatch-eval-") as tmp:
        for n, case in enumerate(cases):
            outcome, engine = _run_case(case, rules, base, like, Path(tmp) / str(n))
            outcomes.append(outcome)
            like = like or engine
    return Report(outcomes)


def _min_accuracy_failure(report: Report, bar: float) -> str | None:
    """Why the run is below ``bar``: the held-out set's share of correct actions, or the tuning
    set's while there is no held-out case; None when it is not."""
    name = "held_out" if report.held_out.cases else "tuning"
    tally = report.sets[name]
    if tally.cases and tally.actions_correct < bar * tally.cases:
        return f"{name.replace('_', '-')} action accuracy {tally.action_accuracy:.1%} < {bar:.0%}"
    return None


def cmd_evaluate(argv: list[str]) -> int:
    p = ArgumentParser(prog="ftwatch evaluate",
                       description="Run the evaluation corpus; print tuning and held-out accuracy apart, per "
                                   "failure class, with a confusion table of actions and the false-restart "
                                   "and false-fail counts (T4).")
    p.add_argument("corpus", nargs="?", type=Path, default=Path("tests/corpus"), help="corpus directory")
    p.add_argument("--config", help="YAML config file (rules, base policy); each case's flags apply on top")
    p.add_argument("--min-accuracy", type=float, default=None,
                   help="exit 1 when the share of correct actions of the held-out set (of the tuning set "
                        f"while there is no held-out case) is below this (default {MIN_ACCURACY}; none with "
                        "--check-baseline or --write-baseline, where the baseline is the gate)")
    base = p.add_mutually_exclusive_group()
    base.add_argument("--check-baseline", type=Path, metavar="FILE",
                      help="exit 1 when a set's accuracy falls below the figures recorded in FILE or its "
                           "no-action runs restarted/failed rise (exact counts)")
    base.add_argument("--write-baseline", type=Path, metavar="FILE",
                      help="record this run's figures in FILE (on purpose: cases added, rules improved); "
                           "checks nothing unless --min-accuracy is given")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    from ftwatch.cli.common import EXIT_USAGE, load_config_from_args
    from ftwatch.pipeline.build import build_rules
    if not args.corpus.is_dir():
        print(f"ftwatch evaluate: no directory {args.corpus}", file=sys.stderr)
        return EXIT_USAGE
    recorded = read_baseline(args.check_baseline) if args.check_baseline else None   # before the work
    config = load_config_from_args(args, {})
    report = evaluate(load_corpus(args.corpus), build_rules(config), config)
    failures: list[str] = []
    bar = args.min_accuracy
    if bar is None and recorded is None and not args.write_baseline:
        bar = MIN_ACCURACY                   # a baseline is the gate when one is checked or written
    if bar is not None and (why := _min_accuracy_failure(report, bar)):
        failures.append(why)
    data = report_json(report) if args.json else None
    notes: list[str] = []
    if recorded is not None:
        check = check_baseline(report, recorded)
        failures += [f"baseline {args.check_baseline}: {f}" for f in check.failures]
        notes = check.notes
        if data is not None:
            data["baseline"] = {"file": str(args.check_baseline), "failures": check.failures, "notes": check.notes}
    print(json.dumps(data, ensure_ascii=False, indent=1) if data is not None else format_report(report))
    for note in notes:
        print(f"ftwatch evaluate: baseline {args.check_baseline}: {note}", file=sys.stderr)
    if args.write_baseline:
        write_baseline(report, args.write_baseline)
        print(f"ftwatch evaluate: figures recorded in {args.write_baseline}", file=sys.stderr)
    for why in failures:                     # one line each
        print(f"ftwatch evaluate: FAILED: {why}", file=sys.stderr)
    return 1 if failures else 0
