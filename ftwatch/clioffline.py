"""The ``ftwatch`` subcommands that read files and stores rather than watch jobs: replay,
explain, check, test-rules, evaluate. A hub (``ftwatch.cli`` dispatches to them)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ftwatch.clisetup import EXIT_USAGE, aimaster_epilog, build_rules, load_config_from_args, split_flags
from ftwatch.errors import ConfigError


# -- replay ----------------------------------------------------------------------------------

def cmd_replay(argv: list[str]) -> int:
    flags, rest, tail = split_flags(argv)
    p = argparse.ArgumentParser(prog="ftwatch replay", description="Run recorded logs through the engine.",
                                epilog=aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--config")
    p.add_argument("--aimaster-args")
    p.add_argument("--json", action="store_true", help="print decisions as JSON lines")
    p.add_argument("--job-id", default="replay")
    p.add_argument("--state-dir", help="keep budgets here (default: a temporary directory); the chip-fault "
                                       "history and node blame always stay in memory, so a replay never "
                                       "counts against real jobs")
    args = p.parse_args(rest + tail)
    if not args.files:
        p.error("give at least one log file")
    import tempfile
    from ftwatch.pipeline.replay import replay
    from ftwatch.rules.budgets import BudgetStore
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.policy import Policy
    config = load_config_from_args(args, flags)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(args.state_dir or tmp)
        state.mkdir(parents=True, exist_ok=True)
        # Fault history and blame stay in memory: a replay must not count against the real jobs.
        policy = Policy(config.policy, BudgetStore(state / "budgets-replay.json", args.job_id), args.job_id,
                        modelarts=config.modelarts, recovery=config.recovery)
        from ftwatch.health.stragglers import StepTracker     # H3: stragglers in replayed logs too (like watch)
        steps = StepTracker(config.health.straggler) if config.health.straggler.enabled else None
        engine = Engine(build_rules(config), steps=steps)
        total = sum(f.stat().st_size for f in args.files)
        result = _with_progress(total, lambda cb: replay(args.files, engine, policy, args.job_id, cb))
    for note in result.notes:
        print(f"ftwatch replay: note: {note}", file=sys.stderr)
    for f in result.findings:            # H3: stragglers and slowdowns are notices, never the root cause
        if f.rule_id.startswith("straggler."):
            print(f"{f.kind}: {f.line}", file=sys.stderr if args.json else sys.stdout)
    d = result.decision
    if args.json:
        print(json.dumps(d.to_json(), ensure_ascii=False))
    else:
        print(f"{result.lines} lines, {len(result.findings)} findings")
        rc = d.root_cause
        print(f"decision: {d.action.label}  ({d.policy_clause})")
        if rc is not None:
            print(f"root cause: [{rc.failure_class.value}] {rc.rule_id} rank {rc.rank}: {rc.line}")
    return 0


def _with_progress(total: int, work):
    if total < (64 << 20) or not sys.stderr.isatty():
        return work(None)
    from rich.progress import Progress
    with Progress(transient=True) as progress:
        task = progress.add_task("replaying", total=total)
        return work(lambda n: progress.advance(task, n))


# -- explain / check / test-rules / evaluate ------------------------------------------------

def cmd_explain(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ftwatch explain", description="Explain a decision (the last one by default).")
    p.add_argument("decision_id", nargs="?")
    p.add_argument("--state-dir", default=".ftwatch-state")
    p.add_argument("--db", help="SQLite file (default: <state-dir>/ftwatch.db)")
    p.add_argument("--config", help="config file whose recovery.blame window/threshold the blame report uses")
    args = p.parse_args(argv)
    from ftwatch.alerting.explain import explain
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    db = Path(args.db) if args.db else Path(args.state_dir) / "ftwatch.db"
    if not db.exists():
        print(f"ftwatch explain: no store at {db}", file=sys.stderr)
        return 1
    try:
        print(explain(SqliteStore(db), args.decision_id))
    except LookupError as exc:
        print(f"ftwatch explain: {exc}", file=sys.stderr)
        return 1
    blame = Path(args.state_dir) / "blame" / "nodes.json"
    if blame.exists():                      # node blame across jobs (ftwatch.rules.blame)
        from ftwatch.config import load_config
        from ftwatch.rules.blame import BlameStore
        try:
            bc = load_config(args.config).recovery.blame if args.config else None
        except ConfigError as exc:
            print(f"ftwatch explain: {exc}", file=sys.stderr)
            return 1
        store = BlameStore(blame, **({"threshold": bc.threshold, "window": bc.window, "cooldown": bc.cooldown}
                                     if bc else {}))
        print("\n" + store.report(time.time()))
    return 0


def cmd_check(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ftwatch check", description="Validate config, rule files, tables and templates.")
    p.add_argument("config", nargs="?")
    p.add_argument("--rules", nargs="*", default=[], help="extra rule files to check")
    p.add_argument("--config", dest="config_opt", help="the config (same as the positional CONFIG)")
    p.add_argument("--route", metavar="EVENT.json",
                   help="show where a sample event would go: matched routes, receivers, group key, "
                   "muted, inhibited (a list of events: the earlier ones fired first)")
    p.add_argument("--at", help="with --route: the time to judge mute windows at (ISO 8601 or epoch "
                   "seconds; default now)")
    args = p.parse_args(argv)
    config = args.config or args.config_opt
    if args.route:
        from ftwatch.checks import explain_route
        print(explain_route(config, args.route, _parse_at(p, args.at)))
        return 0
    args.config = config
    from ftwatch.checks import run_checks
    issues, summary = run_checks(args.config, args.rules)
    for issue in issues:
        print(issue)
    print(summary if not issues else f"{len(issues)} problem(s) found")
    return 1 if issues else 0


def _parse_at(p: argparse.ArgumentParser, text: str | None) -> float | None:
    """``--at``: epoch seconds or ISO 8601 (no zone: local time)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import datetime
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        p.error(f"--at {text!r}: not ISO 8601 (2026-11-21T09:30+08:00) or epoch seconds")
    return None


def cmd_test_rules(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ftwatch test-rules", description="Run every rule's examples and counterexamples.")
    p.add_argument("files", nargs="*", help="rule files (default: the built-in packs only)")
    p.add_argument("--no-builtin", action="store_true")
    args = p.parse_args(argv)
    from ftwatch.rules.loader import load_rules
    from ftwatch.rules.testrules import format_report, run_rule_tests
    rules = load_rules(args.files, builtin=not args.no_builtin)
    failures = run_rule_tests(rules)
    print(format_report(failures, len(rules)))
    return 1 if failures else 0


def cmd_evaluate(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ftwatch evaluate",
                                description="Run the evaluation corpus; print accuracy per failure class and "
                                            "a confusion table of actions (T4).")
    p.add_argument("corpus", nargs="?", type=Path, default=Path("tests/corpus"), help="corpus directory")
    p.add_argument("--config", help="YAML config file (rules, base policy); each case's flags apply on top")
    p.add_argument("--min-accuracy", type=float, default=0.9,
                   help="exit 1 when the share of correct actions is below this (default 0.9)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    from ftwatch.evaluate import evaluate, format_report, load_corpus, report_json
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
