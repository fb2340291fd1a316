"""Exits read into findings for the incident core: a job's process exits and launcher summaries.

:class:`~ftwatch.pipeline.incidents.IncidentDesk` owns one :class:`ExitReader` and hands it what
it is told of ends: a reported exit (``run``), a torchelastic failure summary in the output
(``watch``: at once; ``replay``: at close; ``run``: when the launcher that printed it exits), and
the end of the input. The reader turns them into findings (``ftwatch.rules.exitcodes``,
``ftwatch.policy.lifecycle``) and marks the instances that failed or finished; the desk keeps
opening, holding, settling and deciding on them.

Exits the desk reads beyond the source's own (issue 12 items 3 and 6, ``ftwatch.policy.lifecycle``):
an exit 0 of an instance that printed an uncaught traceback this attempt (``run``) says the
traceback ended no program when the command reports its own status (``python``, ``torchrun``
...: Python exits 1 when an exception ends the main thread, ``sys.excepthook``; a launcher reads
its workers' statuses itself): the traceback is a notice (``survived``). Where the command may
run a pipe or a wrapper script (a shell, anything else), the exit is ``exit.hidden_by_pipe``
(seed 001: ``| tee`` without ``set -o pipefail``), decided by the traceback's class. A launcher's
"exited 0" line after tracebacks of its workers (:meth:`ExitReader.launcher_ok`) makes them
notices the same way. At close, a stream whose last line ends a traceback is
``exit.ended_in_traceback`` of that instance, a failed process without an exit line. A launcher's private exit codes count only under that launcher
(:attr:`ExitReader.launchers`, the desk's ``launchers``: its own lines in the output, and
``run``'s command).

Times: ``time``/``now`` are epoch seconds (the lines' clock).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Literal, Mapping

from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.parsers import fields as line_fields
from ftwatch.parsers.torchelastic import SummaryFailure, SummaryLines, summary_exits
from ftwatch.policy import lifecycle
from ftwatch.policy.triggers import is_error
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding

#: the last line of a C++ stack dump: c10's ``frame #3: ...`` (SPEC P1; ftwatch.parsers.multiline), and
#: glog's (google/glog src/utilities.cc DumpPCAndSymbol: ``"    @ %*p  %s"``, the stack its failure
#: handler prints after a FATAL message or a fatal signal, ``*** Check failure stack trace: ***``,
#: before the process aborts)
_CPP_FRAME = re.compile(r"\s*frame #\d+: |\s*@\s+0x[0-9a-fA-F]+\s")


def rank_origin(origin: Origin, failure: SummaryFailure) -> Origin:
    """The origin of a summary's exit read from a stream: that stream's rank ``failure.rank``."""
    return origin.with_rank(failure.rank)


class ExitReader:
    """One job's exits and launcher summaries, read into findings for its desk.

    The sets and maps below are the desk's own (held, never replaced: the desk clears them in
    place); the reader adds to ``failed``, ``ok`` and ``findings`` as the desk did.

    Args:
        engine: the rule engine (finding sequence numbers).
        exits: the source reports process exits (``run``): then they alone say who failed, and
            :meth:`unseen` reads no stream's last line.
        summaries: when torchelastic summaries count (``IncidentDesk``'s ``summaries``).
        exit_origin: the origin of a summary's exit, from the stream's origin and the failure.
        failed: the desk's instances with a failing exit ftwatch did not cause.
        ok: the desk's instances that exited 0.
        findings: the desk's evidence list (an ok exit's ``exited_ok`` finding joins it directly).
        evidence: the desk's evidence less notices, now (``IncidentDesk.evidence``).
        started_at: instance -> its latest start (epoch s).
        tails: stream -> its last non-empty line so far.
        survived: told the tracebacks an exit 0 says ended no program, with the exit's time and
            why (the desk makes them notices).

    Attributes:
        own_status: the job's command reports its program's own exit status or its launcher's
            reading of its workers' (``lifecycle.reports_own_status``; ``ftwatch run`` sets it):
            an exit 0 after a traceback then means the traceback ended nothing. False: a pipe
            may hide a failure (``exit.hidden_by_pipe``).
    """

    def __init__(self, engine: Engine, *, exits: bool, summaries: Literal["live", "close", "exit"] | None,
                 exit_origin: Callable[[Origin, SummaryFailure], Origin], failed: set[str], ok: set[str],
                 findings: list[Finding], evidence: Callable[[], list[Finding]], started_at: Mapping[str, float],
                 tails: Mapping[Origin, bytes],
                 survived: Callable[[list[Finding], float, str], None] = lambda found, time, why: None):
        self.engine = engine
        self.exits = exits
        self.summaries = summaries
        self.exit_origin = exit_origin
        self.exit_table = ExitCodeTable.load()
        self.failed = failed
        self.ok = ok
        self.findings = findings
        self.evidence = evidence
        self._started_at = started_at
        self._tails = tails
        self.summary_lines: dict[Origin, SummaryLines] = {}   # streams with a summary under way
        self.launchers: set[str] = set()       # the launchers the job runs under (lifecycle.launchers)
        self.own_status = False
        self._survived = survived

    def new_attempt(self) -> None:
        """The job restarts: summaries under way are forgotten (the launchers stay)."""
        self.summary_lines.clear()

    def summary(self, origin: Origin, data: bytes, time: float) -> list[Finding]:
        """Read ``data`` for a torchelastic summary; the findings of its exits once it closed
        (``summaries="live"``). Only streams with a summary under way keep a reader."""
        summary = self.summary_lines.pop(origin, None) or SummaryLines()
        found: list[Finding] = []
        if summary.take(data) and self.summaries == "live":
            found = self.deaths(summary_exits(summary.failures(), lambda f: self.exit_origin(origin, f), time))
        if summary.pending:
            self.summary_lines[origin] = summary
        return found

    def closed_summaries(self, now: float, step: float = 0.0) -> list[Finding]:
        """``summaries="close"``: the findings of every summary's exits at the end of the input
        (at ``now + step``, ``step`` apart)."""
        origins = {}
        failures = []
        for origin, summary in self.summary_lines.items():
            for failure in summary.failures():
                origins[id(failure)] = origin
                failures.append(failure)
        return self.deaths(summary_exits(
            failures, lambda f: self.exit_origin(origins[id(f)], f), now + step, step))

    def launcher_summary(self, exit: ProcessExit, expected: bool) -> list[Finding]:
        """``summaries="exit"``: findings of the ranks' exits in a summary ``exit``'s worker printed
        (evidence: they fail no instance of ours); none when ftwatch stopped it."""
        out: list[Finding] = []
        for origin in [o for o in self.summary_lines if o.key == exit.origin.key]:
            exits = summary_exits(self.summary_lines.pop(origin).failures(), lambda f: self.exit_origin(origin, f),
                                  exit.time)
            if not (exit.stopped_by_us or expected or exit.ok):
                out += [f for e in exits if not e.stopped_by_us and (f := exit_finding(
                    e, self.exit_table, self.engine.next_seq(), launchers=self.launchers)) is not None]
        return out

    def deaths(self, exits: Iterable[ProcessExit], expected: bool = False) -> list[Finding]:
        """The findings of exits: ok ones are noted (their instance's tracebacks ended nothing, or,
        where a pipe may hide a status, the last one says it was hidden), those ftwatch caused make
        none."""
        out = []
        for exit in exits:
            ours = exit.stopped_by_us or expected
            if exit.ok:
                since = self._started_at.get(exit.origin.instance, float("-inf"))
                tb = None if ours else lifecycle.last_uncaught(self.evidence(), exit.origin.instance, exit.time,
                                                               since=since)
                if tb is not None and self.own_status:     # Python exits 1 on an uncaught exception
                    self._survived(lifecycle.worker_tracebacks(self.evidence(), exit.origin.instance, exit.time,
                                                               since=since), exit.time,
                                   f"{exit.origin.instance} exited 0 after it: the traceback ended no program")
                    tb = None
                if tb is None:
                    self.ok.add(exit.origin.instance)
                    if not ours:                    # evidence: a rank that left first (rootcause.left_first)
                        self.findings.append(lifecycle.exited_ok(exit.origin, exit.time, self.engine.next_seq()))
                    continue
                self.failed.add(exit.origin.instance)
                out.append(self._hidden(exit.origin, exit.time, tb, f"{exit.origin.instance} exited 0"))
                continue
            if ours:
                continue
            self.failed.add(exit.origin.instance)
            finding = exit_finding(exit, self.exit_table, seq=self.engine.next_seq(), launchers=self.launchers)
            if finding is not None:
                out.append(finding)
        return out

    def _hidden(self, origin: Origin, time: float, tb: Finding, said: str) -> Finding:
        """``exit.hidden_by_pipe``: ``said`` (an exit 0) after the uncaught traceback ``tb``."""
        return lifecycle.derived_exit(origin, time, self.engine.next_seq(), tb, "exit.hidden_by_pipe", (
            f"{said} after an uncaught traceback of {tb.origin.instance} ({tb.line}): the failure's exit status "
            "was hidden, e.g. by a pipe without `set -o pipefail`"))

    def launcher_ok(self, ok: Finding) -> list[Finding]:
        """The tracebacks a launcher's "exited 0" line ``ok`` says ended no program: the launcher
        is the workers' parent and read their exit statuses itself, and Python exits 1 when an
        exception ends the main thread. torchelastic's finished line speaks for every local
        worker (the tracebacks of ``ok``'s stream: its ranks); a one-process line (DeepSpeed's
        ``Process N exits successfully``) for the last traceback of an instance that has not
        failed, when it is that instance's last."""
        order = [f for f in self.evidence() if f.origin.instance not in self.failed]
        if lifecycle.is_finished(ok):
            where = (ok.origin.job, ok.origin.node, ok.origin.stream)
            return lifecycle.worker_tracebacks([f for f in order if (f.origin.job, f.origin.node, f.origin.stream)
                                                == where], None, ok.time, ok.seq)
        tb = max((f for f in order if lifecycle.uncaught_traceback(f) and (f.time, f.seq) < (ok.time, ok.seq)),
                 key=lambda f: (f.time, f.seq), default=None)
        return [tb] if tb is not None and lifecycle.last_uncaught(order, tb.origin.instance, ok.time, ok.seq) is tb \
            else []

    def unseen(self, now: float) -> list[Finding]:
        """At the end of the input, the exits no source reported: a stream whose last line ends an
        error block or a C++ stack dump (c10's, glog's: a failed process without an exit line,
        issue 12 item 3).

        Not extended to a stream that merely ends on an error-level record no rule read (tried in
        knowledge round 18: it failed three no-action runs whose teardown printed an ERROR line
        after the work had succeeded in words no finish rule reads)."""
        out: list[Finding] = []
        order = sorted(self.evidence(), key=lambda f: (f.time, f.seq))
        if self.exits:
            return out                          # the source reports exits: they say who failed
        for stream, tail in self._tails.items():
            rank, text = line_fields.split_rank_prefix(line_fields.clean(tail))
            instance = stream.with_rank(rank).instance
            if instance in self.failed or instance in self.ok:
                continue
            last = max((f for f in order if f.origin.instance == instance and f.kind != "exit_code"),
                       key=lambda f: (f.time, f.seq), default=None)
            ends_block = last is not None and len(last.evidence) > 1 and last.evidence[-1].strip() == text.strip()
            if ends_block and is_error(last):
                continue                        # the error already stands for the exit (no exits here)
            if not ends_block and not _CPP_FRAME.match(text):
                continue
            cause = last if ends_block and last is not None else Finding(
                "", "keyword", FailureClass.INFO, Action.NONE, Severity.INFO, stream.with_rank(rank), text, now,
                evidence=(text,))
            self.failed.add(instance)
            out.append(lifecycle.derived_exit(cause.origin, cause.time, self.engine.next_seq(), cause,
                                              "exit.ended_in_traceback", (
                f"the output of {instance} ends inside an error block ({text.strip()[:200]}): the process "
                "died of it")))
        return out
