"""``ftwatch watch``: watch jobs ftwatch did not launch, from shipped logs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ftwatch.cli.common import EXIT_FAILED, ArgumentParser, aimaster_epilog, load_config_from_args, split_flags
from ftwatch.errors import ConfigError, SourceError
from ftwatch.pipeline.build import build_engine, build_recorder, mine_catch_alls


def cmd_watch(argv: list[str]) -> int:
    """``ftwatch watch``: watch jobs from shipped logs until a signal (or stdin's end)."""
    flags, rest, _ = split_flags(argv)
    p = ArgumentParser(prog="ftwatch watch", description="Watch jobs ftwatch did not launch, "
                       "from shipped logs (fluent-bit Forward / HTTP, file tails, stdin).",
                       epilog=aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config with a watch.sources list")
    p.add_argument("--aimaster-args", help="AIMaster flags as one string")
    p.add_argument("--state-dir", help="where the store, budgets, spool and offsets live")
    p.add_argument("--decisions-file", type=Path, help="append each decision as a JSON line")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any free one)")
    p.add_argument("--monitor-token", metavar="NAMESPACE/JOB",
                   help="print the SDK token of this job (watch.monitor.secret_file) and exit")
    args = p.parse_args(rest)
    config = load_config_from_args(args, flags)
    if args.monitor_token:
        from ftwatch.pipeline.sources.monitor import job_token
        print(job_token(_monitor_secret(config, args.config), args.monitor_token))
        return 0
    if args.state_dir:
        config = config.model_copy(update={"storage": config.storage.model_copy(update={"state_dir": args.state_dir})})
    if not config.watch.sources:
        raise ConfigError(f"{args.config}: watch.sources is empty: nothing to watch")
    import signal
    import threading
    from ftwatch.telemetry import start_metrics
    from ftwatch.pipeline.actuators.exec import build_actuator
    from ftwatch.pipeline.sources.identity import Identity
    from ftwatch.pipeline.sources import build_source
    from ftwatch.pipeline.watch import Watcher, tune_gc_for_ingest
    tune_gc_for_ingest()
    state_dir = Path(config.storage.state_dir)
    recorder = build_recorder(config, state_dir, args.decisions_file)
    ident = config.watch.identity
    identity = Identity(job_label=ident.job_label, default_job=ident.default_job, default_node=ident.default_node,
                        host_tags=tuple(ident.host_tags), device_field=ident.device_field,
                        max_devices=config.limits.max_tracked_instances)
    monitor = None
    if config.watch.monitor.enabled:   # the SDK over HTTP (ftwatch.pipeline.sources.monitor)
        from ftwatch.pipeline.sources.monitor import MonitorServer
        from ftwatch.pipeline.sources.tls import server_context
        mon = config.watch.monitor
        try:
            tls = server_context(mon.tls_cert, mon.tls_key, "watch.monitor") if mon.tls_cert else None
        except SourceError as exc:
            recorder.close()
            print(f"ftwatch watch: {exc}", file=sys.stderr)
            return EXIT_FAILED
        try:
            monitor = MonitorServer(mon.host, mon.port, _monitor_secret(config, args.config), tls=tls).start()
        except OSError as exc:
            recorder.close()
            print(f"ftwatch watch: monitor endpoint {config.watch.monitor.host}:{config.watch.monitor.port}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
        recorder.say(f"ftwatch watch: SDK endpoint started on port {monitor.port}" + (" (TLS)" if tls else ""))
    said_as = {"kubernetes": "k8s"}.get(config.watch.actuator.type, config.watch.actuator.type)
    watcher = Watcher(config, mine_catch_alls(recorder, build_engine(config)), recorder, identity.resolve,  # H3 too
                      build_actuator(config.watch.actuator, slurm=config.slurm,
                                     log=lambda line: recorder.say(f"ftwatch: {said_as} {line}")),
                      flush_partials=lambda before: identity.joiners.flush(before), devices=identity.devices,
                      monitor=monitor)
    metrics = recorder.metrics = start_metrics(config.storage, args.metrics_port, state_dir, recorder.say)
    if metrics is not None:
        metrics.watch_queue(watcher.queue.qsize)
    count = metrics.count_connection if metrics is not None else None
    sources = []
    positions = recorder.store.positions() if hasattr(recorder.store, "positions") else {}   # stored with the last batches
    seen = getattr(recorder.store, "chunk_seen", None)   # Forward chunks handled before (issue 17)
    if hasattr(recorder.store, "open_blocks"):           # tracebacks a kill left open (issue 17)
        watcher.restore_blocks(recorder.store.open_blocks())
    repeated = metrics.count_repeated if metrics is not None else None
    try:                         # a source that cannot start (its port, its offsets): one line, status 1
        for s in config.watch.sources:
            sources.append(build_source(s, watcher.queue, state_dir, count, positions, seen, config.limits,
                                        repeated))
            sources[-1].start()
            port = getattr(sources[-1], "port", None)
            recorder.say(f"ftwatch watch: source {s.name} started" + (f" on port {port}" if port else ""))
    except SourceError as exc:
        for source in sources:
            source.stop()
        if monitor is not None:
            monitor.stop()
        recorder.close()
        if metrics is not None:
            metrics.close()
        print(f"ftwatch watch: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: watcher.stop())
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
        if monitor is not None:
            monitor.stop()
        recorder.close()           # waiting alert groups sent (or spooled), then the store closed (ES flushed)
        if metrics is not None:
            metrics.close()
    recorder.say(f"ftwatch watch: {recorder.decision_count} decisions for {watcher.jobs_met} jobs; "
                 f"{watcher.engine.stats.lines} lines")
    return 0


def _monitor_secret(config, path: str) -> bytes:
    """The secret of ``watch.monitor.secret_file`` (trailing whitespace dropped).

    Raises:
        ConfigError: no secret_file, or it cannot be read or is empty.
    """
    secret_file = config.watch.monitor.secret_file
    if secret_file is None:
        raise ConfigError(f"{path}: watch.monitor.secret_file is not set: the SDK endpoint needs a secret")
    try:
        secret = secret_file.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{path}: watch.monitor.secret_file {secret_file}: {exc.strerror or exc}") from exc
    if not secret:
        raise ConfigError(f"{path}: watch.monitor.secret_file {secret_file} is empty")
    return secret
