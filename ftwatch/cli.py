"""The ``ftwatch`` command: run, watch, replay, explain, report, check, test-rules, es, dashboards.

AIMaster flags (SPEC M1) are accepted verbatim anywhere before ``--`` in ``run`` and
``replay``, as argv (``--enable-job-restart=True``) or as one string
(``--aimaster-args "--job-execution-mode=Sync --enable-job-restart=True"``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from ftwatch.errors import ConfigError

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script. Returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else EXIT_USAGE
    command, rest = argv[0], argv[1:]
    handler = _COMMANDS.get(command)
    if handler is None:
        print(f"ftwatch: unknown command {command!r}\n{_USAGE}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handler(rest)
    except ConfigError as exc:
        print("ftwatch: configuration error:", file=sys.stderr)
        for issue in exc.issues:
            print(f"  {issue}", file=sys.stderr)
        return EXIT_USAGE


# -- shared set-up ---------------------------------------------------------------------------

def _load_config(args: argparse.Namespace, flags: dict):
    from ftwatch.config import Config, load_config
    config = load_config(args.config) if getattr(args, "config", None) else Config()
    if getattr(args, "aimaster_args", None):
        from ftwatch.config import parse_aimaster_flags
        more, unknown = parse_aimaster_flags(args.aimaster_args)
        if unknown:
            raise ConfigError(f"--aimaster-args: unknown flags {' '.join(unknown)}")
        flags = {**more, **flags}
    if flags:
        config = config.with_policy(**flags)
    return config


def _split_flags(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """(AIMaster flags, other options, command after ``--``)."""
    from ftwatch.config import parse_aimaster_flags
    if "--" in argv:
        cut = argv.index("--")
        head, command = argv[:cut], argv[cut + 1:]
    else:
        head, command = argv, []
    # ``--aimaster-args`` takes the flags as one string; keep it away from the argv flag parser
    # (which would read "--job-execution-mode=Sync --enable-job-restart=True" as one flag's
    # value) and hand it to argparse as ``--aimaster-args=VALUE`` (a value starting with "-").
    kept: list[str] = []
    plain: list[str] = []
    i = 0
    while i < len(head):
        arg = head[i]
        if arg == "--aimaster-args" and i + 1 < len(head):
            kept.append(f"--aimaster-args={head[i + 1]}")
            i += 2
            continue
        (kept if arg.startswith("--aimaster-args=") else plain).append(arg)
        i += 1
    flags, rest = parse_aimaster_flags(plain)
    return flags, rest + kept, command


def _rules(config):
    from ftwatch.rules.loader import load_rules, rules_from_keywords
    rules = load_rules(config.rules.files, builtin=config.rules.builtin)
    if config.rules.retryable_errors:
        rules += rules_from_keywords(list(config.rules.retryable_errors))
    return rules


def _job_id(explicit: str | None, command: Sequence[str]) -> str:
    if explicit:
        return explicit
    if os.environ.get("FTWATCH_JOB_ID"):
        return os.environ["FTWATCH_JOB_ID"]
    digest = hashlib.sha1((os.getcwd() + "\0" + "\0".join(command)).encode()).hexdigest()[:8]
    return f"local-{digest}"


def _recorder(config, state_dir: Path, decisions_file: Path | None, out=None):
    from ftwatch.alerting.center import EventCenter
    from ftwatch.alerting.dispatcher import Dispatcher
    from ftwatch.alerting.notifiers import build_notifiers
    from ftwatch.clock import SystemClock
    from ftwatch.alerting.spool import Spool
    from ftwatch.alerting.rendering import TemplateRenderer
    from ftwatch.clistorage import build_store
    from ftwatch.pipeline.recorder import Recorder
    state_dir.mkdir(parents=True, exist_ok=True)
    store = build_store(config, state_dir)
    renderer = TemplateRenderer(config.alerting.language,
                                {k: Path(v) for k, v in config.alerting.templates.items()})
    recorder = Recorder(store, decisions_file, None, out=out, state_dir=state_dir,
                        resolve_after=_resolve_after(config),
                        output_bucket=config.storage.metrics.output_bucket)
    dispatcher = Dispatcher(build_notifiers(config.alerting.receivers, out=out), renderer,
                            Spool(state_dir / "spool"), on_result=recorder.delivery)
    recorder.dispatcher = EventCenter(config.alerting, dispatcher, SystemClock().time, state_dir)
    dispatcher.resend_pending()              # alerts spooled by an earlier run; results stored
    recorder.dispatcher.recover()            # alerts an earlier run left waiting in a group
    return recorder


def _resolve_after(config) -> float:
    """Seconds without a new incident before open alerts resolve: the smallest ``resolve_after``
    of the Alertmanager receivers, else the recorder's default (300)."""
    from ftwatch.pipeline.recorder import RESOLVE_AFTER
    values = [r.resolve_after for r in config.alerting.receivers if r.type == "alertmanager"]
    return min(values, default=RESOLVE_AFTER)


# -- run -------------------------------------------------------------------------------------

def _aimaster_epilog() -> str:
    """The AIMaster flags with their defaults, for ``--help`` (seed 000)."""
    from ftwatch.config import AIMASTER_FLAGS, PolicyConfig
    defaults = PolicyConfig()
    rows = [f"  {flag}={getattr(defaults, field)}" for flag, field in AIMASTER_FLAGS.items()]
    return "AIMaster flags (verbatim, before --; defaults shown):\n" + "\n".join(rows)


def cmd_run(argv: list[str]) -> int:
    flags, rest, command = _split_flags(argv)
    p = argparse.ArgumentParser(prog="ftwatch run", description="Supervise a training job on this machine.",
                                epilog=_aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--aimaster-args", help="AIMaster flags as one string")
    p.add_argument("--nproc-per-node", help="workers to start: N or MIN:MAX (default: config, else 1)")
    p.add_argument("--state-dir", help="where the SQLite store, budgets and spool live")
    p.add_argument("--decisions-file", type=Path, help="append each decision as a JSON line")
    p.add_argument("--job-id", help="job id (default: derived from the command and directory)")
    p.add_argument("--grace-period", type=float, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any free one)")
    from ftwatch.configmindcluster import add_run_flags, apply_run_flags
    add_run_flags(p)
    p.add_argument("--network-check", action="store_true", help="node check of the worker slots first (H2)")
    p.add_argument("--exclude-straggler", action="store_true", help="with --network-check: leave stragglers out")
    args = p.parse_args(rest)
    if not command:
        p.error("give the training command after --")
    config = apply_run_flags(_load_config(args, flags), args)
    if args.state_dir:
        config = config.model_copy(update={"storage": config.storage.model_copy(update={"state_dir": args.state_dir})})
    from ftwatch.metrics import start_metrics
    from ftwatch.pipeline.runner import JobRunner
    from ftwatch.rules.engine import Engine
    state_dir = Path(config.storage.state_dir)
    job = _job_id(args.job_id or config.job.id, command)
    if args.network_check or config.health.network_check:
        from ftwatch.healthcli import network_check
        status, config = network_check(config, job, args.exclude_straggler or config.health.exclude_straggler)
        if status:
            return status
    recorder = _recorder(config, state_dir, args.decisions_file)
    metrics = recorder.metrics = start_metrics(config.storage, args.metrics_port, state_dir, recorder.say)
    runner = JobRunner(config, command, Engine(_rules(config)), recorder, job)
    try:
        status = runner.run()
    finally:
        recorder.close()           # waiting alert groups sent (or spooled), then the store closed (ES flushed)
        if metrics is not None:
            metrics.close()
    _summary(runner, recorder, status, state_dir)
    return status


def _summary(runner, recorder, status: int, state_dir: Path) -> None:
    """The short summary printed when ``ftwatch run`` ends."""
    from ftwatch.events import Action
    stats = runner.engine.stats
    actions = [d.action.label for d in recorder.decisions]
    verdict = {0: "SUCCEEDED", 130: "INTERRUPTED"}.get(status, "FAILED")
    recorder.say("")
    recorder.say("ftwatch summary")
    recorder.say(f"  job        {runner.job}: {verdict} (exit {status})")
    recorder.say(f"  attempts   {runner.budgets.attempt + 1} (this job, across ftwatch restarts)")
    recorder.say(f"  decisions  {', '.join(actions) or 'none'}")
    recorder.say(f"  lines      {stats.lines} scanned, {recorder.finding_count} findings")
    recorder.say(f"  store      {recorder.store.path if recorder.store else '-'}")
    acted = [d for d in recorder.decisions if d.action is not Action.NONE] or recorder.decisions
    if acted:
        recorder.say(f"  explain    {recorder.link(acted[-1])}")


# -- watch ---------------------------------------------------------------------------------------

def cmd_watch(argv: list[str]) -> int:
    flags, rest, _ = _split_flags(argv)
    p = argparse.ArgumentParser(prog="ftwatch watch", description="Watch jobs ftwatch did not launch, "
                                "from shipped logs (fluent-bit Forward / HTTP, file tails, stdin).",
                                epilog=_aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config with a watch.sources list")
    p.add_argument("--aimaster-args", help="AIMaster flags as one string")
    p.add_argument("--state-dir", help="where the store, budgets, spool and offsets live")
    p.add_argument("--decisions-file", type=Path, help="append each decision as a JSON line")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any free one)")
    args = p.parse_args(rest)
    config = _load_config(args, flags)
    if args.state_dir:
        config = config.model_copy(update={"storage": config.storage.model_copy(update={"state_dir": args.state_dir})})
    if not config.watch.sources:
        raise ConfigError(f"{args.config}: watch.sources is empty: nothing to watch")
    import signal
    import threading
    from ftwatch.metrics import start_metrics
    from ftwatch.pipeline.actuator import build_actuator
    from ftwatch.pipeline.identity import Identity
    from ftwatch.pipeline.sources import build_source
    from ftwatch.pipeline.watcher import Watcher, tune_gc_for_ingest
    from ftwatch.rules.engine import Engine
    tune_gc_for_ingest()
    state_dir = Path(config.storage.state_dir)
    recorder = _recorder(config, state_dir, args.decisions_file)
    ident = config.watch.identity
    identity = Identity(job_label=ident.job_label, default_job=ident.default_job)
    from ftwatch.health.stragglers import StepTracker     # H3: stragglers from shipped step lines too
    steps = StepTracker(config.health.straggler) if config.health.straggler.enabled else None
    watcher = Watcher(config, Engine(_rules(config), steps=steps), recorder, identity.resolve,
                      build_actuator(config.watch.actuator),
                      flush_partials=lambda before: identity.joiners.flush(before))
    metrics = recorder.metrics = start_metrics(config.storage, args.metrics_port, state_dir, recorder.say)
    if metrics is not None:
        metrics.watch_queue(watcher.queue.qsize)
    sources = [build_source(s, watcher.queue, state_dir) for s in config.watch.sources]
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: watcher.stop())
    for source in sources:
        source.start()
        port = getattr(source, "port", None)
        recorder.say(f"ftwatch watch: source {source.name} started" + (f" on port {port}" if port else ""))
    stdin_only = all(s.type == "stdin" for s in config.watch.sources)

    def finished() -> bool:      # stdin sources end at EOF; listeners run until a signal
        return stdin_only and all(src.ended.is_set() for src in sources) and watcher.queue.empty()

    try:
        watcher.run(until=finished)
        if stdin_only:           # the input ended: decide what is still open, as replay does
            watcher.close()
    finally:
        for source in sources:
            source.stop()
        recorder.close()           # waiting alert groups sent (or spooled), then the store closed (ES flushed)
        if metrics is not None:
            metrics.close()
    recorder.say(f"ftwatch watch: {len(recorder.decisions)} decisions for {len(watcher.seen_jobs)} jobs; "
                 f"{watcher.engine.stats.lines} lines")
    return 0


# -- replay ----------------------------------------------------------------------------------

def cmd_replay(argv: list[str]) -> int:
    flags, rest, tail = _split_flags(argv)
    p = argparse.ArgumentParser(prog="ftwatch replay", description="Run recorded logs through the engine.",
                                epilog=_aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--config")
    p.add_argument("--aimaster-args")
    p.add_argument("--json", action="store_true", help="print decisions as JSON lines")
    p.add_argument("--job-id", default="replay")
    p.add_argument("--state-dir", help="keep budgets here (default: a temporary directory)")
    args = p.parse_args(rest + tail)
    if not args.files:
        p.error("give at least one log file")
    import tempfile
    from ftwatch.pipeline.replay import replay
    from ftwatch.rules.budgets import BudgetStore
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.policy import Policy
    config = _load_config(args, flags)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(args.state_dir or tmp)
        state.mkdir(parents=True, exist_ok=True)
        # Fault history and blame stay in memory: a replay must not count against the real jobs.
        policy = Policy(config.policy, BudgetStore(state / "budgets-replay.json", args.job_id), args.job_id,
                        modelarts=config.modelarts, recovery=config.recovery)
        engine = Engine(_rules(config))
        total = sum(f.stat().st_size for f in args.files)
        result = _with_progress(total, lambda cb: replay(args.files, engine, policy, args.job_id, cb))
    for note in result.notes:
        print(f"ftwatch replay: note: {note}", file=sys.stderr)
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


# -- explain / check / test-rules ------------------------------------------------------------

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


def cmd_report(argv: list[str]) -> int:
    from ftwatch.report.command import cmd_report as report
    return report(argv)


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


def cmd_es(argv: list[str]) -> int:
    from ftwatch.clistorage import cmd_es as es
    return es(argv)


def cmd_dashboards(argv: list[str]) -> int:
    from ftwatch.clistorage import cmd_dashboards as dashboards
    return dashboards(argv)


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
    config = _load_config(args, {})
    report = evaluate(load_corpus(args.corpus), _rules(config), config)
    print(json.dumps(report_json(report), ensure_ascii=False, indent=1) if args.json else format_report(report))
    failed = report.action_accuracy < args.min_accuracy or bool(report.unmarked_misses)
    if failed and not args.json:
        why = [f"action accuracy {report.action_accuracy:.1%} < {args.min_accuracy:.0%}"] \
            if report.action_accuracy < args.min_accuracy else []
        why += [f"{len(report.unmarked_misses)} unmarked miss(es)"] if report.unmarked_misses else []
        print(f"ftwatch evaluate: FAILED: {'; '.join(why)}", file=sys.stderr)
    return 1 if failed else 0


def cmd_bootcheck(argv: list[str]) -> int:
    from ftwatch.healthcli import cmd_bootcheck as bootcheck
    return bootcheck(argv)


def cmd_nodecheck(argv: list[str]) -> int:
    from ftwatch.healthcli import cmd_nodecheck as nodecheck
    return nodecheck(argv)


_COMMANDS = {
    "run": cmd_run,
    "replay": cmd_replay,
    "watch": cmd_watch,
    "explain": cmd_explain,
    "report": cmd_report,
    "check": cmd_check,
    "test-rules": cmd_test_rules,
    "es": cmd_es,
    "dashboards": cmd_dashboards,
    "evaluate": cmd_evaluate,
    "bootcheck": cmd_bootcheck,
    "nodecheck": cmd_nodecheck,
}

_USAGE = """usage: ftwatch COMMAND [options]

commands:
  run [AIMaster flags] [--config FILE] --nproc-per-node N|MIN:MAX [--recover-strategy S,...] [--keep-scene SECONDS]
      [--state-dir DIR] [--decisions-file PATH] [--metrics-port N] -- COMMAND...
  watch --config FILE [AIMaster flags] [--state-dir DIR] [--decisions-file PATH] [--metrics-port N]
  replay [AIMaster flags] [--json] FILE...
  explain [--state-dir DIR] [DECISION_ID]
  report [--state-dir DIR] [-o FILE] [--job JOB]
  check [CONFIG] [--rules FILE...]
  check --route EVENT.json [--config FILE] [--at TIME]
  test-rules [FILE...]
  bootcheck [--config FILE] [--state-dir DIR] [--path DIR...] [--nproc-per-node N] [--no-allreduce]
  nodecheck [--nnodes N|MIN:MAX] [--nproc-per-node N] [--exclude-straggler] [--state-dir DIR]
  evaluate [CORPUS] [--min-accuracy 0.9] [--json]
  es setup|flush [--config FILE] [--url URL]
  dashboards import --kibana-url URL [--space ID] [--api-key KEY | --username U --password P]"""


if __name__ == "__main__":
    sys.exit(main())
