"""The ``ftwatch`` command: one module per subcommand in this package, imported on use.

AIMaster flags (SPEC M1) are accepted verbatim anywhere before ``--`` in ``run``, ``watch`` and
``replay``, as argv (``--enable-job-restart=True``) or as one string
(``--aimaster-args "--job-execution-mode=Sync --enable-job-restart=True"``).

Errors end here, each as one line on stderr with its exit status (``common.EXIT_STATUSES``, README
"Exit status"): a configuration error (one line per issue), an error ftwatch raised on purpose, a
file the user named that cannot be opened. A closed stdout (``ftwatch explain | head -1``) and
Ctrl-C end quietly, after the command's own cleanup (its ``finally`` blocks) has run. Anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from typing import Sequence

from ftwatch.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STATUSES, EXIT_STDOUT_CLOSED, EXIT_USAGE
from ftwatch.errors import ConfigError, FtwatchError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script. Returns the process exit status (``EXIT_STATUSES``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    try:
        status = _dispatch(command, argv[1:])
        sys.stdout.flush()             # a closed stdout shows here, not at the interpreter's exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ConfigError as exc:
        for issue in exc.issues:
            _error(command, f"configuration error: {issue}")
        return EXIT_USAGE
    except FtwatchError as exc:        # a worker, source, sink or receiver that could not be used
        _error(command, str(exc))
        return EXIT_FAILED
    except OSError as exc:
        if exc.filename is None:       # not a file the user named: a bug, keep the traceback
            raise
        _error(command, f"{exc.filename}: {exc.strerror or exc}")
        return EXIT_FAILED


def _dispatch(command: str, rest: list[str]) -> int:
    if command in ("", "-h", "--help"):
        print(_USAGE)
        return 0 if command else EXIT_USAGE
    handler = _handler(command)
    if handler is None:
        print(f"ftwatch: unknown command {command!r} (see ftwatch --help)", file=sys.stderr)
        return EXIT_USAGE
    return handler(rest)


def _error(command: str, text: str) -> None:
    """One line on stderr, newlines in ``text`` folded (one mistake, one line)."""
    print(f"ftwatch {command}: " + " ".join(text.split("\n")), file=sys.stderr)


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): point stdout at /dev/null so that the
    interpreter's last flush cannot fail again, and end without a word."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):      # stdout is no file (replaced by a test, say): nothing to point
        pass
    return EXIT_STDOUT_CLOSED


_COMMANDS = {
    "run": "ftwatch.cli.run:cmd_run",
    "watch": "ftwatch.cli.watch:cmd_watch",
    "replay": "ftwatch.cli.replay:cmd_replay",
    "explain": "ftwatch.cli.explain:cmd_explain",
    "check": "ftwatch.cli.check:cmd_check",
    "test-rules": "ftwatch.cli.test_rules:cmd_test_rules",
    "evaluate": "ftwatch.cli.evaluate:cmd_evaluate",
    "mine": "ftwatch.cli.mine:cmd_mine",
    "report": "ftwatch.cli.report:cmd_report",
    "es": "ftwatch.cli.es:cmd_es",
    "dashboards": "ftwatch.cli.dashboards:cmd_dashboards",
    "bootcheck": "ftwatch.cli.health:cmd_bootcheck",
    "nodecheck": "ftwatch.cli.health:cmd_nodecheck",
    "nodes": "ftwatch.cli.nodes:cmd_nodes",
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
  replay [AIMaster flags] [--json] [--rules FILE]... FILE...
  explain [--state-dir DIR] [DECISION_ID]
  report [--state-dir DIR] [-o FILE] [--job JOB]
  check [CONFIG] [--rules FILE...]
  check --route EVENT.json [--config FILE] [--at TIME]
  test-rules [FILE...]
  bootcheck [--config FILE] [--state-dir DIR] [--path DIR...] [--nproc-per-node N] [--no-allreduce]
  nodecheck [--nnodes N|MIN:MAX] [--nproc-per-node N] [--exclude-straggler] [--state-dir DIR]
  mine [FILE... | --from-store [--es-url URL]] [--all-lines] [--no-builtin] [--rules FILE]... [--state-dir DIR] [--min-jobs N]
      [--draft DIR [--clean FILE]...] [--json]
  evaluate [CORPUS] [--check-baseline FILE | --write-baseline FILE] [--min-accuracy 0.9] [--json]
  nodes list|readmit NODE [--config FILE] [--kubeconfig FILE] [--context NAME] [--dry-run]
  es setup|flush [--config FILE] [--url URL]
  dashboards import --kibana-url URL [--space ID] [--api-key KEY | --username U --password P]

exit status:
""" + "\n".join(textwrap.fill(meaning, 100, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
                for code, meaning in EXIT_STATUSES.items())


if __name__ == "__main__":
    sys.exit(main())
