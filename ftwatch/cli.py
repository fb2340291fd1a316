"""The ``ftwatch`` command: run and watch here; the other subcommands live in ``clioffline``
(replay, explain, check, test-rules, evaluate), ``clistorage`` (es, dashboards),
``healthcli`` (bootcheck, nodecheck) and ``report.command`` (report), imported on use.

AIMaster flags (SPEC M1) are accepted verbatim anywhere before ``--`` in ``run`` and
``replay``, as argv (``--enable-job-restart=True``) or as one string
(``--aimaster-args "--job-execution-mode=Sync --enable-job-restart=True"``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Sequence

from ftwatch.clisetup import (EXIT_USAGE, aimaster_epilog, build_recorder, build_rules, job_id_for,
                              load_config_from_args, split_flags)
from ftwatch.errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script. Returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else EXIT_USAGE
    command, rest = argv[0], argv[1:]
    handler = _handler(command)
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


# -- run -------------------------------------------------------------------------------------

def cmd_run(argv: list[str]) -> int:
    """``ftwatch run``: supervise a training job on this machine (exit status: the job's outcome)."""
    flags, rest, command = split_flags(argv)
    p = argparse.ArgumentParser(prog="ftwatch run", description="Supervise a training job on this machine.",
                                epilog=aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
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
    config = apply_run_flags(load_config_from_args(args, flags), args)
    if args.state_dir:
        config = config.model_copy(update={"storage": config.storage.model_copy(update={"state_dir": args.state_dir})})
    from ftwatch.metrics import start_metrics
    from ftwatch.pipeline.runner import JobRunner
    from ftwatch.rules.engine import Engine
    state_dir = Path(config.storage.state_dir)
    job = job_id_for(args.job_id or config.job.id, command)
    if args.network_check or config.health.network_check:
        from ftwatch.healthcli import network_check
        status, config = network_check(config, job, args.exclude_straggler or config.health.exclude_straggler)
        if status:
            return status
    recorder = build_recorder(config, state_dir, args.decisions_file)
    metrics = recorder.metrics = start_metrics(config.storage, args.metrics_port, state_dir, recorder.say)
    runner = JobRunner(config, command, Engine(build_rules(config)), recorder, job)
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
    """``ftwatch watch``: watch jobs from shipped logs until a signal (or stdin's end)."""
    flags, rest, _ = split_flags(argv)
    p = argparse.ArgumentParser(prog="ftwatch watch", description="Watch jobs ftwatch did not launch, "
                                "from shipped logs (fluent-bit Forward / HTTP, file tails, stdin).",
                                epilog=aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config with a watch.sources list")
    p.add_argument("--aimaster-args", help="AIMaster flags as one string")
    p.add_argument("--state-dir", help="where the store, budgets, spool and offsets live")
    p.add_argument("--decisions-file", type=Path, help="append each decision as a JSON line")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any free one)")
    args = p.parse_args(rest)
    config = load_config_from_args(args, flags)
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
    recorder = build_recorder(config, state_dir, args.decisions_file)
    ident = config.watch.identity
    identity = Identity(job_label=ident.job_label, default_job=ident.default_job)
    from ftwatch.health.stragglers import StepTracker     # H3: stragglers from shipped step lines too
    steps = StepTracker(config.health.straggler) if config.health.straggler.enabled else None
    watcher = Watcher(config, Engine(build_rules(config), steps=steps), recorder, identity.resolve,
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


_COMMANDS = {
    "run": "ftwatch.cli:cmd_run",
    "watch": "ftwatch.cli:cmd_watch",
    "replay": "ftwatch.clioffline:cmd_replay",
    "explain": "ftwatch.clioffline:cmd_explain",
    "check": "ftwatch.clioffline:cmd_check",
    "test-rules": "ftwatch.clioffline:cmd_test_rules",
    "evaluate": "ftwatch.clioffline:cmd_evaluate",
    "report": "ftwatch.report.command:cmd_report",
    "es": "ftwatch.clistorage:cmd_es",
    "dashboards": "ftwatch.clistorage:cmd_dashboards",
    "bootcheck": "ftwatch.healthcli:cmd_bootcheck",
    "nodecheck": "ftwatch.healthcli:cmd_nodecheck",
}
"""Subcommand -> ``module:function`` (argv list -> exit status), imported only when used."""


def _handler(command: str):
    target = _COMMANDS.get(command)
    if target is None:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


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
