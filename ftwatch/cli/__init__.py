"""The ``ftwatch`` command: one module per subcommand in this package, imported on use.

AIMaster flags (SPEC M1) are accepted verbatim anywhere before ``--`` in ``run``, ``watch`` and
``replay``, as argv (``--enable-job-restart=True``) or as one string
(``--aimaster-args "--job-execution-mode=Sync --enable-job-restart=True"``).
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from ftwatch.cli.common import EXIT_USAGE
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


_COMMANDS = {
    "run": "ftwatch.cli.run:cmd_run",
    "watch": "ftwatch.cli.watch:cmd_watch",
    "replay": "ftwatch.cli.replay:cmd_replay",
    "explain": "ftwatch.cli.explain:cmd_explain",
    "check": "ftwatch.cli.check:cmd_check",
    "test-rules": "ftwatch.cli.test_rules:cmd_test_rules",
    "evaluate": "ftwatch.cli.evaluate:cmd_evaluate",
    "report": "ftwatch.cli.report:cmd_report",
    "es": "ftwatch.cli.es:cmd_es",
    "dashboards": "ftwatch.cli.dashboards:cmd_dashboards",
    "bootcheck": "ftwatch.cli.health:cmd_bootcheck",
    "nodecheck": "ftwatch.cli.health:cmd_nodecheck",
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
