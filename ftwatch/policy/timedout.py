"""An exit with status 124: the command was stopped by a timeout, not by an error of its own (R7).

GNU coreutils ``timeout(1)`` ("timeout invocation", Exit status): "124 if COMMAND times out, and
--preserve-status is not specified; 125 if the timeout command itself fails; 126 ... 127 ...;
137 if COMMAND (or timeout itself) is sent the KILL (9) signal". A job wrapped as
``timeout 4h torchrun ...`` (a CI step, a batch script's guard), and the progress watchdogs that
copy that convention when they end a job that made no progress ("terminating with exit code
124"), exit 124 after the program stopped finishing its work in the time it was given: the
program did not fail, it was stopped while it still ran - a hang, as far as the log can tell
(a program that only ran slowly is told apart by its progress lines, which the job-hang
interval reads, not by its exit).

The exit-code table (``packs/exit_codes.tsv``) does not list 124, so the exit would be a generic
one (user_code / fail_job, rule 1 of ``rootcause``: explained by the errors logged before it, and
the program's fault when there are none). :func:`timed_out` reads such an exit as a hang
(restart_job) instead; a real error logged before it still comes first in time and stays the
root cause. Only the code 124 is read: ``timeout -s KILL`` gives 137, which the table grades as
any SIGKILL, and ``--preserve-status`` passes the command's own status on.
"""

from __future__ import annotations

from dataclasses import replace

from ftwatch.events import Action, FailureClass, Finding

#: coreutils timeout(1): "124 if COMMAND times out, and --preserve-status is not specified"
TIMEOUT_EXIT_CODE = 124
SOURCE = ("GNU coreutils manual, 'timeout invocation' (Exit status: 124 if COMMAND times out, and "
          "--preserve-status is not specified): the command was stopped by a timeout while it still ran")


def timed_out(f: Finding) -> Finding:
    """``f`` read as a timeout's stop when it is an exit (or a reported exit) with status 124.

    Args:
        f: any finding.

    Returns:
        A copy of ``f`` with class HANG, action RESTART_JOB, no longer generic (it says why the
        job ended), its source naming coreutils; ``f`` itself when it is no exit 124 (a death by
        a signal included).
    """
    if (f.kind != "exit_code" or f.fields.get("exitcode") != TIMEOUT_EXIT_CODE
            or f.fields.get("signal") is not None):
        return f
    fields = {**f.fields, "generic": False, "meaning": "stopped by a timeout (coreutils timeout(1))"}
    return replace(f, failure_class=FailureClass.HANG, action=Action.RESTART_JOB, fields=fields,
                   source=f"{f.source}; {SOURCE}" if f.source else SOURCE)
