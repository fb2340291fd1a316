"""Judging a Record: which one Finding it makes, if any (the engine's last step on a hit).

Among the rules that hit a Record (and the fault codes found in it) the highest ``priority``
wins, then the most drastic action; that is how a traceback ending in a gloo "Connection closed
by peer" is fallout and not user code. In a Python traceback the final exception decides
(``ftwatch.rules.exceptions``); a rule with a ``when:`` condition (SPEC P4) counts only when one
of its hit lines passes the predicate; a keyword hit on NCCL INFO lines only makes nothing; a
fault code wins ties; a rule tagged ``exit_report`` (a line that reports an exit: a shell's
``Killed``, srun's ``Exited with exit code 1``) makes the exit it reports, graded by the exit-code
table (``ftwatch.rules.exitcodes.reported_exit``). A Finding keeps at most ``MAX_LINE_CHARS`` characters of each line (Q1): a
10 MB hit line is cut in the middle, with a marker saying how much went.

Apart from ``ftwatch.rules.engine`` because it needs none of a feed's state: only the compiled
rules (their pattern ids), the matcher and the tables.
"""

from __future__ import annotations

import re
from typing import Sequence

from dataclasses import replace

from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Record, Severity
from ftwatch.parsers import collective, multiline
from ftwatch.rules import exceptions
from ftwatch.rules.exceptions import ExceptionCatalog, ExceptionGrade
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding, reported_exit
from ftwatch.rules.faultcodes import FaultTables
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Rule

EVIDENCE_HEAD, EVIDENCE_TAIL = 4, 12
MAX_LINE_CHARS = 4096          # the longest line a Finding keeps (``line``, each evidence entry)
_MARKER_ROOM = 40              # of those, kept free for the truncation marker (it takes 20 to 30)
JUDGED_MAX = 4096             # record texts whose judgement ``Judge.judge`` remembers, at most
JUDGED_CHARS = 1 << 22         # ... and at most this many characters of them (4 Mi)
FAULT_PRIORITY = 30            # fault codes are as specific as rules get
INFO_LINE = re.compile(r"NCCL INFO\b(?<=\bNCCL INFO)")
"""A line at NCCL's INFO level (``NCCL_DEBUG=INFO``). NCCL logs failures at WARN; its INFO lines
are informational by NCCL's own definition (docs, environment variables: ``NCCL_DEBUG=INFO``
"prints debug information"), so a keyword hit on one never makes a finding, unless the rule's
class is ``info`` (issue 12: ``NCCL INFO NET/Plugin : dlerror=libnccl-net.so: ... No such file or
directory`` is not a missing file of the user's). A rule-level ``when:`` may replace this later.

The words ``\bNCCL INFO\b``, written literal first (the leading ``\b`` checked behind it): ``re``
then looks for the literal in C, where a pattern that opens with ``\b`` is tried at every
position (issue 16: ~17 us a record, ~6 % of a bench replay; the same matches)."""
EXCEPTION_PRIORITY = 10        # a traceback's final class that decides by itself (KeyError, ...)
EXCEPTION_FALLBACK_PRIORITY = -5   # a generic final class (RuntimeError): rules on its message win
#: a rule tagged so reads an uncaught C++ exception's ``what()`` (``stacks_vocab.tsv``
#: ``cpp.uncaught_exception_what``: the program's own error, user_code); a message that is, or ends in,
#: the C library's text for an errno (a ``std::system_error``, whose ``what()`` is ``strerror(errno)``:
#: c10d's and gloo's sockets, ``Connection reset by peer``) names a failed system call, not whose
#: doing it was, so the rule makes no finding on it (:meth:`Judge._what_is_errno`): the bare abort after
#: it and the incident's other findings decide, as before the rule existed
CPP_WHAT_TAG = "cpp_what"
_WHAT = re.compile(r"what\(\): +(.*)|uncaught exception of type .+?: (.*)")


class Judge:
    """Picks the one Finding a Record makes.

    Args:
        rules: the compiled rules, in the engine's order.
        owner: pattern id -> the index of its rule in ``rules`` (negative: not a rule's pattern;
            -2: a fault-code candidate).
        matcher: the engine's matcher (to re-match single lines of a block).
        tables: the fault-code tables.
        exceptions: the Python exception catalog.
    """

    def __init__(self, rules: Sequence[Rule], owner: Sequence[int], matcher: Matcher, tables: FaultTables,
                 exceptions: ExceptionCatalog):
        self.rules = list(rules)
        self._owner = owner
        self.matcher = matcher
        self.tables = tables
        self.exceptions = exceptions
        self._fault_ids = frozenset(i for i, o in enumerate(owner) if o == -2)
        self._exit_table: ExitCodeTable | None = None     # loaded on the first exit report
        # pattern ids of the rules whose finding depends on more than the record's text: a ``when:``
        # predicate reads the raw line and the origin, an exit report takes its rank into the origin
        # (a predicate of keyword and regex terms alone reads only the raw lines: ``_by_lines``)
        self._by_lines = frozenset(i for i, o in enumerate(owner) if o >= 0 and rules[o].predicate is not None
                                   and getattr(rules[o].predicate, "texts_only", False)
                                   and "exit_report" not in rules[o].tags)
        self._per_record = frozenset(i for i, o in enumerate(owner) if o >= 0 and i not in self._by_lines and (
            rules[o].predicate is not None or "exit_report" in rules[o].tags))
        #: (record text, pattern ids) -> the finding it made (origin, time, seq: the first record's)
        #: or None; see :meth:`judge`
        self._judged: dict[tuple, Finding | None] = {}
        self._judged_chars = 0

    def _matching_line(self, lines: list[str], index: int) -> str | None:
        """The last line of a block that hits rule ``index`` (the exception line, usually)."""
        if len(lines) == 1:
            return lines[0]
        owner = self._owner
        for line in reversed(lines):
            if any(owner[i] == index for i in self.matcher.match_text(line)):
                return line
        return None

    def judge(self, record: Record, ids: set[int], data: bytes,
               lines: list[tuple[int, set[int]]]) -> Finding | None:
        """Pick the one finding a record makes: highest priority, then most drastic action.

        In a Python traceback the final exception decides (``ftwatch.rules.exceptions``): at equal
        priority a rule that hits the final exception line (or the message lines after it) beats
        one that hits only a frame or an earlier exception of a chain, and the catalog grades the
        final class itself: a class that decides by itself (``KeyError``, ``ConnectionResetError``,
        ``torch.OutOfMemoryError``) at ``EXCEPTION_PRIORITY``, a generic one (``RuntimeError``)
        at ``EXCEPTION_FALLBACK_PRIORITY``, below every rule on its message and above only the
        ``python.uncaught_exception`` catch-all. Within a priority the message's vocabulary
        outranks the class (:func:`_where`): a rule on the message beats the catalog's class grade
        and the rules that read only the class name (tag ``exception_class``: ``python.value_error``
        ...), whatever their actions, so a ``ValueError`` whose message says the Hub could not be
        reached is that, not a bad value of the program's. The catalog refines a traceback that a rule read
        (the built-in catch-all reads them all); with no rule counting, the record makes nothing.

        On a tie a fault code wins over a keyword rule: same verdict, but it carries the
        code's fields (an Xid 79 line gives ``xid.79`` with ``xid`` and ``pci``, not the
        ``GPU has fallen off the bus`` keyword rule that also hits it). A number the tables lack and
        :meth:`FaultTables.grade_unknown` does not grade (an error number of something else: macOS
        IOGPU's ``Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)``) says nothing
        of its own and counts only where no rule reads the record (then an info notice, as before). A rule with a
        condition (``when:``, SPEC P4) counts only when one of the record's lines that hit
        it passes its predicate (``lines``: each line's offset in ``data`` and pattern ids);
        the predicate runs only for a rule that would otherwise win.

        The same text hit by the same patterns is judged once (issue 16: every rank prints the
        same error, a job prints it every step; in the bench replay 83 % of the records are
        repeats): the finding is a function of the two, the record's origin, time and sequence
        number aside, which the remembered finding takes from each record. A record hit by a rule
        whose ``when:`` has keyword and regex terms only (``LinePredicate.texts_only``: the CUDA
        catalog's) is remembered with the raw lines that hit such a rule (the predicate reads them,
        rank prefix and all); not at all one hit by a rule whose predicate reads fields or the
        origin, or by an ``exit_report`` rule (it takes the line's rank into the origin). At
        most ``JUDGED_MAX`` texts of ``JUDGED_CHARS`` characters in all (raw lines counted) are
        remembered (then forgotten all at once).
        """
        if ids & self._per_record:
            return self._judge(record, ids, data, lines)
        key: tuple = (record.text, frozenset(ids))
        if ids & self._by_lines:                 # the raw lines such a predicate reads join the key
            by_lines = self._by_lines
            key += tuple(line_at(data, start) for start, hit in lines if not by_lines.isdisjoint(hit))
        try:
            known = self._judged[key]
        except KeyError:
            known = self._judge(record, ids, data, lines)
            size = len(record.text) + sum(map(len, key[2:]))
            self._judged_chars += size
            if len(self._judged) >= JUDGED_MAX or self._judged_chars > JUDGED_CHARS:
                self._judged.clear()
                self._judged_chars = size
            self._judged[key] = known
            return known
        if known is None:
            return None
        return Finding(known.rule_id, known.kind, known.failure_class, known.action, known.severity,
                       record.origin, known.line, record.time, record.seq, known.evidence,
                       dict(known.fields), known.source)

    def _judge(self, record: Record, ids: set[int], data: bytes,
               lines: list[tuple[int, set[int]]]) -> Finding | None:
        """:meth:`judge` without its memory."""
        best: tuple[int, int, int, int] | None = None
        finding: Finding | None = None
        texts = record.text.split("\n")
        final, grade, final_rules = self._final_exception(texts)
        rule_ids = sorted({self._owner[i] for i in ids if self._owner[i] >= 0})
        has_info = INFO_LINE.search(record.text) is not None   # once per record, not per rule
        for index in rule_ids:
            rule = self.rules[index]
            if (has_info and rule.failure_class is not FailureClass.INFO
                    and self._only_info_lines(texts, index)):
                continue
            key = (rule.priority, _where(rule, index, final, final_rules), int(rule.action), 0)
            if best is None or key > best:
                line = None
                if rule.predicate is not None:
                    line = self._passing_line(rule, index, record, data, lines)
                    if line is None:
                        continue
                best = key
                finding = self._finding(record, index, line)
        if grade is not None and best is not None:     # refines a traceback some rule read
            key = (EXCEPTION_PRIORITY if grade.decides_by_class else EXCEPTION_FALLBACK_PRIORITY,
                   ON_CLASS, int(grade.action), 0)
            if best is None or key > best:
                best = key
                finding = self._exception_finding(record, texts, final, grade)
        if ids & self._fault_ids:
            for hit in self.tables.extract(record.text):
                entry = hit.entry or self.tables.grade_unknown(hit)
                if entry is None and best is not None:
                    continue    # an ungraded number (``FaultTables.grade_unknown``) says less than a rule's reading
                action = entry.action if entry else Action.NOTIFY
                key = (FAULT_PRIORITY, ON_MESSAGE, int(action), 1)
                if best is None or key > best:
                    best = key
                    finding = self._fault_finding(record, hit)
        return finding

    def _passing_line(self, rule: Rule, index: int, record: Record, data: bytes,
                      lines: list[tuple[int, set[int]]]) -> str | None:
        """The last of ``lines`` that hits rule ``index`` and passes its predicate (its text), or None."""
        owner = self._owner
        texts = record.text.split("\n")
        for k in range(len(lines) - 1, -1, -1):
            start, ids = lines[k]
            if any(owner[i] == index for i in ids) and rule.predicate(line_at(data, start), record.origin):
                return texts[k] if k < len(texts) else texts[-1]
        return None

    def _only_info_lines(self, lines: list[str], index: int) -> bool:
        """True when every line of the record that hits rule ``index`` is an NCCL INFO line.

        The caller checks first that some line is one (``INFO_LINE`` over the whole record once:
        it cannot span a newline, and ``\\b`` reads a newline as a line's edge): per rule, that
        test cost ~0.02 s in 24k searches of a 0.8 s profiled replay at 1,000 rules (issue 16).
        """
        owner = self._owner
        return not any(not INFO_LINE.search(line) and any(owner[i] == index for i in self.matcher.match_text(line))
                       for line in lines)

    def _final_exception(self, lines: list[str]) -> tuple[int, ExceptionGrade | None, set[int]]:
        """A Python traceback's final exception line: (its index, its catalog grade, the rules
        that hit it or the message lines after it); (-1, None, set()) for any other record."""
        if not multiline.is_python_start(lines[0]):
            return -1, None, set()
        final = exceptions.exception_line(lines)
        if final is None:
            return -1, None, set()
        hits = self.matcher.match_text("\n".join(lines[final:]))
        return final, self.exceptions.grade_block(lines, final), {self._owner[i] for i in hits if self._owner[i] >= 0}

    def _exception_finding(self, record: Record, lines: list[str], final: int,
                           grade: ExceptionGrade) -> Finding:
        severity = (Severity.ERROR if grade.action >= Action.RESTART_INSTANCE
                    else Severity.WARNING if grade.action == Action.NOTIFY else Severity.INFO)
        return Finding(f"python.exception.{grade.name}", "keyword", grade.failure_class, grade.action,
                       severity, record.origin, _cap(lines[final]), record.time, record.seq,
                       _evidence(lines), {"exception": grade.name}, grade.source)

    def _finding(self, record: Record, index: int, line: str | None = None) -> Finding | None:
        rule = self.rules[index]
        lines = record.text.split("\n")
        line = line or self._matching_line(lines, index) or lines[-1]
        if "exit_report" in rule.tags:
            read, reported = self._reported_exit(record, rule, line, lines)
            if read:
                return reported
        if CPP_WHAT_TAG in rule.tags:
            if self._what_is_errno(line) or self._what_read_by_another(index, line, record.origin):
                return None
        return Finding(rule.id, "keyword", rule.failure_class, rule.action, rule.severity,
                       record.origin, _cap(line), record.time, record.seq, _evidence(lines),
                       collective.fields(record.text), rule.source)

    def _reported_exit(self, record: Record, rule: Rule, line: str,
                       lines: list[str]) -> tuple[bool, Finding | None]:
        """A line of a rule tagged ``exit_report`` (a shell's ``Killed``, srun's ``task 0: Exited
        with exit code 1``) read as the exit it reports, graded by the exit-code table as a
        process exit is (kind ``exit_code``: a generic one is a weak exit, R7).

        Returns:
            ``(True, finding)``, or ``(True, None)`` for a report of exit 0; ``(False, None)``
            when the line names no code or signal (the rule's own grade stands).
        """
        code, sig, rank = reported_exit(line, rule.id)
        if code is None and sig is None:
            return False, None
        if self._exit_table is None:
            self._exit_table = ExitCodeTable.load()
        origin = record.origin.with_rank(rank) if rank is not None and record.origin.rank is None else record.origin
        found = exit_finding(ProcessExit(origin, 0, code, sig, record.time), self._exit_table, record.seq)
        if found is None:                       # an exit 0 report: nothing failed
            return True, None
        return True, replace(found, rule_id=rule.id, line=_cap(line), evidence=_evidence(lines),
                             source=f"{rule.source}; {found.source}")

    def _what_read_by_another(self, index: int, line: str, origin: Origin) -> bool:
        """Says whether a rule not tagged :data:`CPP_WHAT_TAG` reads the ``what()`` line itself (one
        of its patterns hits it and its ``when:`` predicate, if any, passes there): the message is in
        a catalog, which grades it, even below this rule's priority (``CUDA error: driver shutting
        down``, cudaErrorCudartUnloading, is a shutdown status there, no error: CUDA Runtime API
        docs, enum cudaError). The ``what()`` rule reads only messages no catalog knows. (A rule
        whose keyword hits but whose condition does not hold reads nothing: the CUDA catalog's
        rules take the message as their keyword and its printed forms as their condition.)"""
        owner, rules = self._owner, self.rules
        raw = None
        for i in self.matcher.match_text(line):
            other = owner[i]
            if other < 0 or other == index or CPP_WHAT_TAG in rules[other].tags:
                continue
            predicate = rules[other].predicate
            if predicate is None:
                return True
            if raw is None:
                raw = line.encode("utf-8", "surrogateescape")
            if predicate(raw, origin):
                return True
        return False

    def _what_is_errno(self, line: str) -> bool:
        """Says whether the ``what()`` on ``line`` (:data:`CPP_WHAT_TAG`) is an errno's text by the
        exception catalog, read as ``RuntimeError: <what()>`` (pybind11 raises a ``std::exception``
        as ``RuntimeError`` with ``what()`` as its message: pybind11 docs, "Exceptions"), whose
        generic row leaves the grade to the errno the message names (``ExceptionCatalog.grade``)."""
        m = _WHAT.search(line)
        message = ((m.group(1) or m.group(2) or "") if m else "").strip()
        grade = self.exceptions.grade(f"RuntimeError: {message}") if message else None
        return grade is not None and grade.decides_by_class

    def _fault_finding(self, record: Record, hit) -> Finding:
        entry = hit.entry or self.tables.grade_unknown(hit)
        lines = record.text.split("\n")
        line = next((ln for ln in lines if hit.code.lower() in ln.lower()), lines[0])
        if entry is None:
            return Finding(f"{hit.kind}.{hit.code}", "fault_code", FailureClass.INFO, Action.NOTIFY,
                           Severity.WARNING, record.origin, _cap(line), record.time, record.seq,
                           _evidence(lines), {"code": hit.code, **hit.fields}, "unknown code")
        severity = Severity.CRITICAL if entry.action >= Action.ISOLATE_NODE else (
            Severity.ERROR if entry.action >= Action.RESTART_IN_PLACE else Severity.WARNING)
        return Finding(f"{hit.kind}.{entry.code}", "fault_code", entry.failure_class, entry.action,
                       severity, record.origin, _cap(line), record.time, record.seq, _evidence(lines),
                       {"code": hit.code, "level": entry.level, "meaning": entry.meaning, **hit.fields},
                       entry.source)


#: where a rule hits a record, the second part of a finding's key (``Judge.judge``): on the final
#: exception's message (or anywhere in a record that is no traceback), on its class only (the
#: catalog's grade, a rule tagged ``exception_class``), elsewhere (a frame, an earlier line)
ON_MESSAGE, ON_CLASS, ELSEWHERE = 2, 1, 0
EXCEPTION_CLASS_TAG = "exception_class"


def _where(rule: Rule, index: int, final: int, final_rules: set[int]) -> int:
    """Where rule ``index`` hits a record whose final exception line is ``final`` (-1: the record
    is no traceback) and whose final exception the rules ``final_rules`` hit."""
    if EXCEPTION_CLASS_TAG in rule.tags:
        return ON_CLASS
    return ON_MESSAGE if final < 0 or index in final_rules else ELSEWHERE


def line_at(data: bytes, start: int) -> bytes:
    """The line of ``data`` that starts at offset ``start``, without its newline."""
    end = data.find(b"\n", start)
    return data[start:] if end < 0 else data[start:end]


def _evidence(lines: list[str]) -> tuple[str, ...]:
    if len(lines) > EVIDENCE_HEAD + EVIDENCE_TAIL:
        lines = lines[:EVIDENCE_HEAD] + ["..."] + lines[-EVIDENCE_TAIL:]
    return tuple(_cap(line) for line in lines)


def _cap(line: str) -> str:
    """``line`` cut to at most ``MAX_LINE_CHARS`` characters, marker included (Q1).

    A Finding's lines go to SQLite, alerts and the decision JSON; a 10 MB line (a tensor
    printed whole, binary junk) must not. The middle goes: the head keeps the logger's
    prefix and the message's start, the tail the exception at its end, and the marker says
    how much went, in characters (decimal kB/MB; bytes for ASCII text), e.g.
    ``... …[truncated 10.5 MB]… ...``.
    """
    if len(line) <= MAX_LINE_CHARS:
        return line
    keep = MAX_LINE_CHARS - _MARKER_ROOM
    head = keep * 3 // 4
    marker = f" …[truncated {_size(len(line) - keep)}]… "
    return line[:head] + marker + line[len(line) - (keep - head):]



def _size(chars: int) -> str:
    """``812 B``, ``9.9 kB``, ``10.5 MB``: a count of characters in decimal units."""
    if chars >= 1_000_000:
        return f"{chars / 1e6:.1f} MB"
    if chars >= 1_000:
        return f"{chars / 1e3:.1f} kB"
    return f"{chars} B"

