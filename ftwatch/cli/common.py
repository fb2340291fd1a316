"""What the ``ftwatch`` subcommands share: the config from a file, the AIMaster flags (argv or
``--aimaster-args``) on top, the job id, the exit statuses, an argument parser whose errors are one line."""

from __future__ import annotations

import argparse
import hashlib
import os
from typing import Sequence

from ftwatch.errors import ConfigError


EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_INTERRUPTED = 130
EXIT_STDOUT_CLOSED = 141

EXIT_STATUSES = {
    0: "success: the job succeeded (run); nothing wrong found (check, test-rules, evaluate); "
       "watch stopped by SIGINT or SIGTERM, its normal end",
    EXIT_FAILED: "failure: the policy failed the job (run); problems found (check, test-rules, evaluate); "
                 "a store, file, worker or service could not be used",
    EXIT_USAGE: "usage or configuration error: a bad option, a missing file, an invalid config or rule file",
    EXIT_CANNOT_EXECUTE: "run: the training command is not executable",
    EXIT_NOT_FOUND: "run: the training command is not found",
    EXIT_INTERRUPTED: "interrupted by Ctrl-C (run: SIGINT or SIGTERM, after the workers were stopped)",
    EXIT_STDOUT_CLOSED: "standard output was closed early (as by `| head`); the rest is not printed",
}
"""Every exit status of the ``ftwatch`` command and its meaning (``ftwatch --help``, README)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line on stderr (exit status 2) instead of the usage block."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def load_config_from_args(args: argparse.Namespace, flags: dict):
    """The Config of ``args.config`` (or the defaults), with ``--aimaster-args`` and the argv
    AIMaster ``flags`` applied on top. Raises ConfigError (file:line) for bad config or flags."""
    from ftwatch.config.model import Config, load_config
    config = load_config(args.config) if getattr(args, "config", None) else Config()
    if getattr(args, "aimaster_args", None):
        from ftwatch.config.model import parse_aimaster_flags
        more, unknown = parse_aimaster_flags(args.aimaster_args)
        if unknown:
            raise ConfigError(f"--aimaster-args: unknown flags {' '.join(unknown)}")
        flags = {**more, **flags}
    if flags:
        config = config.with_policy(**flags)
    from ftwatch.cli.check import check_step_patterns
    check_step_patterns(config, getattr(args, "config", None))     # before an engine is built from them
    return config

def with_rule_files(config, files: Sequence[str] = (), builtin: bool = True):
    """``config`` with ``files`` added to ``rules.files`` and the built-in packs off unless
    ``builtin`` (``replay --rules``, ``mine --rules --no-builtin``)."""
    if not files and builtin:
        return config
    return config.model_copy(update={"rules": config.rules.model_copy(update={
        "builtin": config.rules.builtin and builtin, "files": [*config.rules.files, *files]})})


def split_flags(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """(AIMaster flags, other options, command after ``--``)."""
    from ftwatch.config.model import parse_aimaster_flags
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

def job_id_for(explicit: str | None, command: Sequence[str]) -> str:
    """The job id: ``explicit``, else $FTWATCH_JOB_ID, else ``local-`` + 8 hex digits of the
    directory and command (stable across ftwatch restarts, so budgets carry over)."""
    if explicit:
        return explicit
    if os.environ.get("FTWATCH_JOB_ID"):
        return os.environ["FTWATCH_JOB_ID"]
    digest = hashlib.sha1((os.getcwd() + "\0" + "\0".join(command)).encode()).hexdigest()[:8]
    return f"local-{digest}"

def aimaster_epilog() -> str:
    """The AIMaster flags with their defaults, for ``--help`` (seed 000)."""
    from ftwatch.config.model import AIMASTER_FLAGS, PolicyConfig
    defaults = PolicyConfig()
    rows = [f"  {flag}={getattr(defaults, field)}" for flag, field in AIMASTER_FLAGS.items()]
    return "AIMaster flags (verbatim, before --; defaults shown):\n" + "\n".join(rows)
