"""Exit codes and signals -> findings (SPEC R4).

The table is data: ``ftwatch/rules/packs/exit_codes.tsv``, the ``exit_code`` rows of the research
table ``shared/data/fault-tables/error_strings.tsv`` (columns ``pattern pattern_type component class
recommended_action source classified_by meaning notes``; tab-separated, no quoting). Each row says
where its classification comes from (kubedl / kubeflow training-operator / DLRover).

Some codes are one launcher's private convention (DLRover's 14 = GPU InfoROM corrupted, 201, 202,
247): ``packs/launcher_exit_codes.tsv`` (columns ``code launcher source notes``) names them, and
they apply only when the job runs under that launcher (``exit_finding``'s ``launchers``: the
desk learns them from the launcher's own lines and from ``run``'s command, see
``ftwatch.policy.lifecycle``); elsewhere such a code is an unlisted one.

A line that reports an exit (a rule tagged ``exit_report``: a shell's ``Killed``, srun's ``task 0:
Exited with exit code 1``, ``Exit Code: 137``) is read by :func:`reported_exit` and graded here
like a process exit (``ftwatch.rules.judge``).

A death by signal N is looked up as code 128+N, the shell's convention (``bash(1)``, "EXIT STATUS":
"the exit status of a command that terminates on fatal signal N is 128+N"), whether the process
reports it as ``signal=N``, as Popen's ``returncode=-N``, or as a shell's ``128+N``.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import signal as _signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection

from ftwatch.errors import ConfigError, Issue
from ftwatch.events import Action, FailureClass, Finding, ProcessExit, Severity
from ftwatch.parsers import linefacts

_COLUMNS = ("pattern", "pattern_type", "component", "class", "recommended_action", "source",
            "classified_by", "meaning", "notes")
#: The highest signal number on Linux (SIGRTMAX); 128+1 .. 128+64 from a shell are signal deaths.
_MAX_SIGNAL = 64
#: The exit code every failing program uses: it says nothing about why (R7 treats it as generic).
GENERIC_EXIT_CODE = 1


@dataclass(frozen=True, slots=True)
class ExitCodeRow:
    """One classified exit code.

    Attributes:
        code: the exit status (signals as 128+N).
        failure_class, action: the verdict.
        meaning: a short paraphrase (``SIGKILL (also container OOM kill)``).
        source: where the code's meaning comes from; classified_by: whose retry decision it copies.
    """

    code: int
    failure_class: FailureClass
    action: Action
    meaning: str = ""
    source: str = ""
    classified_by: str = ""


@dataclass(frozen=True)
class ExitCodeTable:
    """Exit code -> classification.

    Attributes:
        rows: {code: row}.
        location: the file it came from (``""`` for an empty table).
    """

    rows: dict[int, ExitCodeRow] = field(default_factory=dict)
    location: str = ""
    private: dict[int, str] = field(default_factory=dict)

    def launcher_of(self, code: int) -> str | None:
        """The launcher whose private convention ``code`` is (``"dlrover"``), or None."""
        return self.private.get(code)

    @classmethod
    def load(cls, path: str | Path | None = None) -> "ExitCodeTable":
        """Load a table file; without ``path``, the packaged ``packs/exit_codes.tsv``.

        Rows whose ``pattern_type`` is not ``exit_code`` are skipped, so the research table
        ``error_strings.tsv`` loads as well. A missing packaged file gives an empty table (every
        non-zero code is then generic); a missing explicit ``path`` is an error.

        The packaged table is read once per process and shared (a table is not changed once
        loaded): every replay's exit tracker loads it, ~1 ms, ~1.5 s of an evaluate of the corpus.

        Raises:
            ConfigError: the file is unreadable, a header is missing, or a row is bad (file:line each).
        """
        return _packaged() if path is None else cls._load(path)

    @classmethod
    def _load(cls, path: str | Path | None) -> "ExitCodeTable":
        """:meth:`load`, read now."""
        packs = importlib.resources.files("ftwatch.rules").joinpath("packs")
        private = packs.joinpath(_PRIVATE)
        codes = parse_private(private.read_text(encoding="utf-8"), f"ftwatch/rules/packs/{_PRIVATE}") \
            if private.is_file() else {}
        if path is None:
            resource = packs.joinpath("exit_codes.tsv")
            if not resource.is_file():
                return cls(private=codes)
            table = cls.parse(resource.read_text(encoding="utf-8"), "ftwatch/rules/packs/exit_codes.tsv")
        else:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(Issue(str(path), 0, f"cannot read exit-code table: {exc}")) from None
            table = cls.parse(text, str(path))
        return cls(table.rows, table.location, codes)

    @classmethod
    def parse(cls, text: str, location: str = "<exit_codes>") -> "ExitCodeTable":
        """Parse TSV text (see the module docstring). Raises ConfigError with every bad row."""
        lines = text.splitlines()
        if not lines or tuple(lines[0].split("\t")[:len(_COLUMNS)]) != _COLUMNS:
            raise ConfigError(Issue(location, 1, f"header must be: {' '.join(_COLUMNS)}"))
        rows: dict[int, ExitCodeRow] = {}
        issues: list[Issue] = []
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            cells = dict(zip(_COLUMNS, line.split("\t")))
            if cells.get("pattern_type") != "exit_code":
                continue
            try:
                code = int(cells["pattern"])
                row = ExitCodeRow(code, FailureClass(cells.get("class", "")),
                                  Action.parse(cells.get("recommended_action", "")),
                                  cells.get("meaning", ""), cells.get("source", ""), cells.get("classified_by", ""))
            except ValueError as exc:
                issues.append(Issue(location, number, f"bad exit-code row: {exc}"))
                continue
            if code in rows:
                issues.append(Issue(location, number, f"exit code {code} is listed twice"))
            rows[code] = row
        if issues:
            raise ConfigError(issues)
        return cls(rows, location)

    def get(self, code: int) -> ExitCodeRow | None:
        """The row for ``code``, or None."""
        return self.rows.get(code)


_PRIVATE = "launcher_exit_codes.tsv"
_PRIVATE_COLUMNS = ("code", "launcher", "source", "notes")


def parse_private(text: str, location: str) -> dict[int, str]:
    """``launcher_exit_codes.tsv``: {code: launcher}. Raises ConfigError (file:line) on a bad row."""
    lines = text.splitlines()
    if not lines or tuple(lines[0].split("\t")[:len(_PRIVATE_COLUMNS)]) != _PRIVATE_COLUMNS:
        raise ConfigError(Issue(location, 1, f"header must be: {' '.join(_PRIVATE_COLUMNS)}"))
    out: dict[int, str] = {}
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if not line.strip():
            continue
        if len(cells) < 3 or not cells[0].strip().isdigit() or not cells[1].strip() or not cells[2].strip():
            raise ConfigError(Issue(location, number, "a row needs a code, a launcher and a source"))
        out[int(cells[0])] = cells[1].strip()
    return out


#: strsignal(3)'s text for a signal, as glibc (and signal(7)'s descriptions) give it: what a shell
#: (bash ``jobs.c``: ``line 18:  41 Killed  cmd``), srun (``task 0: Killed``) and friends print for a
#: process that a signal ended.
STRSIGNAL = {"Hangup": 1, "Interrupt": 2, "Quit": 3, "Illegal instruction": 4, "Trace/breakpoint trap": 5,
             "Aborted": 6, "Bus error": 7, "Floating point exception": 8, "Killed": 9,
             "User defined signal 1": 10, "Segmentation fault": 11, "User defined signal 2": 12,
             "Broken pipe": 13, "Alarm clock": 14, "Terminated": 15, "File size limit exceeded": 25,
             "Bad system call": 31}
_STRSIGNAL = re.compile(r"\b(" + "|".join(re.escape(t) for t in sorted(STRSIGNAL, key=len, reverse=True)) + r")\b")
#: zsh's own messages for the signals that end a job, which it prints instead of strsignal(3)'s
#: (zsh ``Src/signames2.awk``; ``Src/jobs.c`` printjob: ``zsh: segmentation fault  python x.py``).
ZSH_SIGNAL_MESSAGES = {"hangup": 1, "interrupt": 2, "quit": 3, "illegal hardware instruction": 4,
                       "trace trap": 5, "abort": 6, "bus error": 7, "floating point exception": 8,
                       "killed": 9, "segmentation fault": 11, "broken pipe": 13, "alarm": 14,
                       "terminated": 15}
_ZSH_REPORT = re.compile(r"^zsh: (" + "|".join(re.escape(t) for t in sorted(ZSH_SIGNAL_MESSAGES, key=len, reverse=True))
                         + r")\b")
_REPORTED_RANK = re.compile(r"\b(?:process rank|task|Process(?= \d+ exit with status code)) (\d+)\b")
#: a runtime's own report that it ends the process, by the rule that reads it (``rules/packs/kill_vocab.tsv``,
#: whose rows give each report's wording and source), and the exit it ends the process with ``(code, signal)``:
#: glog's and abseil's ``LOG(FATAL)`` / failed ``CHECK`` and glibc's heap and stack checks end in abort()
#: (SIGABRT); Go's runtime exits 2 after an unrecovered panic or a runtime throw; Rust's std exits 101 when
#: the main thread panics; Kaldi's job launchers and a program's MPI_Abort (the launcher exits with the
#: program's errorcode, read as the generic 1) exit 1; CPython's ``Py_FatalError`` calls abort().
CRASH_REPORTS: dict[str, tuple[int | None, int | None]] = {
    "process.glog_fatal_report": (None, 6),
    "process.glibc_abort_report": (None, 6),
    "process.python_fatal_error_report": (None, 6),
    "process.go_panic_report": (2, None),
    "process.rust_main_panic_report": (101, None),
    "kaldi.launcher_job_failed": (1, None),
    "r.execution_halted": (1, None),
    "mpi.abort_invoked": (1, None),
}
#: faulthandler's report of a fatal signal also says ``Fatal Python error: <the signal's name>``: the
#: signal decides, not Py_FatalError's abort (CPython Modules/faulthandler.c, ``faulthandler_fatal_error``)
_FAULTHANDLER_SIGNAL = re.compile(r"Fatal Python error: (?:Segmentation fault|Bus error|Illegal instruction"
                                  r"|Floating point exception|Aborted)\b")
#: deepspeed's launcher's ``return code = N``; SkyPilot's ``return code list: [0, 139]`` (its first non-zero code)
_RETURN_CODE = re.compile(r"\breturn code(?: = | list: ?\[(?:0, *)*)(-?\d{1,3})\b")


def reported_exit(text: str, rule_id: str | None = None) -> tuple[int | None, int | None, int | None]:
    """What a launcher's, shell's or orchestrator's exit report says: ``(returncode, signal, rank)``.

    A runtime's own crash report, read by the rule ``rule_id`` (:data:`CRASH_REPORTS`: glog's fatal
    line, a Go panic, a Rust main-thread panic, glibc's aborts, CPython's ``Py_FatalError``, MPI_Abort, a
    Kaldi launcher's ``job failed``, R's ``Execution halted``), is the exit that runtime or launcher ends the process with. Else the signal by name or number (``SIGKILL``, ``signal 9``, ``exitcode: -9``:
    ``ftwatch.parsers.linefacts.signal_of``) or by its strsignal text (``Killed``; zsh's own words,
    ``zsh: abort``, :data:`ZSH_SIGNAL_MESSAGES`); else the exit
    code (``Exit Code: 137``, ``exit code 1``, ``return code = 1``; a negative one is a signal); the rank when the report names one (mpirun's
    ``process rank 3``, srun's ``task 3``, Horovod's runner ``Process 3 exit with status code``; a range of tasks names none). Any part may be None.
    """
    if rule_id in CRASH_REPORTS and not _FAULTHANDLER_SIGNAL.search(text):    # the runtime's own crash report
        return (*CRASH_REPORTS[rule_id], None)
    sig = ZSH_SIGNAL_MESSAGES[m.group(1)] if (m := _ZSH_REPORT.search(text)) else linefacts.signal_of(text)
    if sig is None:
        m = _STRSIGNAL.search(text)
        sig = STRSIGNAL[m.group(1)] if m else None
    if sig == 0:
        sig = None                      # "signal 0" kills nothing (kill(2)): not a death
    code = linefacts.exit_code_of(text) if sig is None else None
    if sig is None and code is None and (m := _RETURN_CODE.search(text)):
        code = int(m.group(1))          # deepspeed's "return code = 1", SkyPilot's "return code list: [139]"
        if code < 0:
            sig, code = -code, None
    m = _REPORTED_RANK.search(text)
    return code, sig, int(m.group(1)) if m else None


def signal_name(number: int) -> str:
    """``9`` -> ``SIGKILL``; an unnamed number -> ``SIG<n>``."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def decode_exit(exit: ProcessExit) -> tuple[int, int | None]:
    """(code to look up, signal number or None) for an exit.

    ``signal=9``, ``returncode=-9`` and ``returncode=137`` all give ``(137, 9)``.
    """
    if exit.signal is not None:
        return 128 + exit.signal, exit.signal
    code = exit.returncode if exit.returncode is not None else 0
    if code < 0:
        return 128 - code, -code
    if 128 < code <= 128 + _MAX_SIGNAL:
        return code, code - 128
    return code, None


def exit_finding(exit: ProcessExit, table: ExitCodeTable, seq: int = 0,
                 launchers: Collection[str] = ()) -> Finding | None:
    """A finding for a worker's exit (R4), or None for a clean exit or one ftwatch caused.

    Rule ids: ``exit.sig<name>`` for a signal death (``exit.sigkill``), else ``exit.<code>``.
    A code the table does not list, and the generic code 1, get ``fields["generic"] = True`` and
    user_code / fail_job (R7 may reclassify a generic exit as fallout).

    Args:
        exit: the exit; ``stopped_by_us`` exits (the SIGTERM ftwatch sent) are never findings.
        table: the classification.
        seq: the ordering number for the finding.
        launchers: the launchers the job runs under (``{"dlrover"}``): a code private to another
            launcher is read as an unlisted code (``fields["private_to"]`` names the launcher).

    Returns:
        A Finding of kind ``exit_code`` with fields ``exitcode`` (the code looked up), ``signal``,
        ``signal_name``, ``returncode`` (as reported), ``meaning`` and ``generic``; or None.
    """
    if exit.stopped_by_us or exit.ok:
        return None
    code, sig = decode_exit(exit)
    if code == 0:
        return None
    row = table.get(code)
    private = table.launcher_of(code) if sig is None else None
    if private is not None and private not in launchers:
        row = None                      # another launcher's convention: says nothing here
    generic = sig is None and (row is None or code == GENERIC_EXIT_CODE)
    who = exit.origin.instance + (f" (rank {exit.origin.rank})" if exit.origin.rank is not None else "")
    name = signal_name(sig) if sig is not None else None
    if sig is not None:
        line = f"{who} was killed by signal {sig} ({name})"
        rule_id = f"exit.{name.lower()}"
    else:
        line = f"{who} exited with code {code}"
        rule_id = f"exit.{code}"
    if row is not None:
        failure_class, action, meaning = row.failure_class, row.action, row.meaning
        source = row.source + (f"; classified by {row.classified_by}" if row.classified_by else "")
    else:
        failure_class, action, meaning = FailureClass.USER_CODE, Action.FAIL_JOB, "not in the exit-code table"
        source = f"{table.location or 'no exit-code table'}: code not listed, user_code by default (R4)"
        if private is not None:
            meaning = f"{private}'s private code; this job does not run under {private}"
            source = f"ftwatch/rules/packs/{_PRIVATE}: code {code} is {private}'s only (R4)"
    return Finding(
        rule_id=rule_id, kind="exit_code", failure_class=failure_class, action=action,
        severity=Severity.ERROR, origin=exit.origin, line=line, time=exit.time, seq=seq,
        fields={"exitcode": code, "signal": sig, "signal_name": name, "returncode": exit.returncode,
                "meaning": meaning, "generic": generic, **({"private_to": private} if private else {})},
        source=source)


@functools.lru_cache(maxsize=1)
def _packaged() -> ExitCodeTable:
    """The packaged table (``ExitCodeTable.load()``), read once."""
    return ExitCodeTable._load(None)
