"""What the ``ftwatch`` subcommands share: config from args and AIMaster flags, the rules, the job
id, the recorder (store, event center, receivers). A hub: it wires every stage together."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
from typing import Sequence

from ftwatch.errors import ConfigError

EXIT_USAGE = 2


def load_config_from_args(args: argparse.Namespace, flags: dict):
    """The Config of ``args.config`` (or the defaults), with ``--aimaster-args`` and the argv
    AIMaster ``flags`` applied on top. Raises ConfigError (file:line) for bad config or flags."""
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
    from ftwatch.checks import check_step_patterns
    check_step_patterns(config, getattr(args, "config", None))     # before an engine is built from them
    return config


def split_flags(argv: list[str]) -> tuple[dict, list[str], list[str]]:
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


def build_rules(config):
    """The built-in packs (unless ``rules.builtin`` is off), the rule files, and the retryable
    keywords as rules. Raises RuleError naming file:line."""
    from ftwatch.rules.loader import load_rules, rules_from_keywords
    rules = load_rules(config.rules.files, builtin=config.rules.builtin)
    if config.rules.retryable_errors:
        rules += rules_from_keywords(list(config.rules.retryable_errors))
    return rules


def job_id_for(explicit: str | None, command: Sequence[str]) -> str:
    """The job id: ``explicit``, else $FTWATCH_JOB_ID, else ``local-`` + 8 hex digits of the
    directory and command (stable across ftwatch restarts, so budgets carry over)."""
    if explicit:
        return explicit
    if os.environ.get("FTWATCH_JOB_ID"):
        return os.environ["FTWATCH_JOB_ID"]
    digest = hashlib.sha1((os.getcwd() + "\0" + "\0".join(command)).encode()).hexdigest()[:8]
    return f"local-{digest}"


def build_recorder(config, state_dir: Path, decisions_file: Path | None, out=None):
    """The Recorder of a run or watch: the store (SQLite, plus Elasticsearch when configured),
    the event center over the receivers, and the spool; alerts an earlier run spooled or left
    waiting in a group are sent now."""
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
                        resolve_after=resolve_after_of(config),
                        output_bucket=config.storage.metrics.output_bucket,
                        link_url=config.alerting.link_url)
    dispatcher = Dispatcher(build_notifiers(config.alerting.receivers, out=out), renderer,
                            Spool(state_dir / "spool"), on_result=recorder.delivery,
                            background=True)   # deciding and acting never wait on a receiver (N4)
    recorder.dispatcher = EventCenter(config.alerting, dispatcher, SystemClock().time, state_dir)
    dispatcher.resend_pending()              # alerts spooled by an earlier run, to the workers
    recorder.dispatcher.recover()            # alerts an earlier run left waiting in a group
    return recorder


def resolve_after_of(config) -> float:
    """Seconds without a new incident before open alerts resolve: the smallest ``resolve_after``
    of the Alertmanager receivers, else the recorder's default (300)."""
    from ftwatch.pipeline.recorder import RESOLVE_AFTER
    values = [r.resolve_after for r in config.alerting.receivers if r.type == "alertmanager"]
    return min(values, default=RESOLVE_AFTER)


def aimaster_epilog() -> str:
    """The AIMaster flags with their defaults, for ``--help`` (seed 000)."""
    from ftwatch.config import AIMASTER_FLAGS, PolicyConfig
    defaults = PolicyConfig()
    rows = [f"  {flag}={getattr(defaults, field)}" for flag, field in AIMASTER_FLAGS.items()]
    return "AIMaster flags (verbatim, before --; defaults shown):\n" + "\n".join(rows)
