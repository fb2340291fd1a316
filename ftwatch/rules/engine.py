"""Stage 3: chunks of raw log lines in, Findings out.

The hot path (DESIGN.md "Speed on the hot path"): one multi-pattern database holds every
rule's patterns, the block starts (tracebacks, C++ stack dumps) and the fault-code
patterns; it scans a whole chunk at once and Python only touches the lines that hit.
A hit line becomes a Record (decoded, ANSI stripped, rank prefix and timestamp taken);
a block start collects the following lines of the same rank into one Record (P1), so
interleaved ranks never mix. A block that is still open at the end of a chunk is carried
over to the next feed of the same origin (or closed by ``flush``), with the lines after it
that closed blocks already took (so they are never judged twice) and the time of its first
line. ANSI escape sequences are removed from a chunk before it is scanned, so colours
never hide a pattern (a coloured ``KeyError`` of Python 3.13's tracebacks still hits).

Each Record yields at most one Finding: among the rules that hit it (and the fault codes
found in it) the highest ``priority`` wins, then the most drastic action. That is how a
traceback ending in a gloo "Connection closed by peer" is fallout and not user code.
A Finding keeps at most ``MAX_LINE_CHARS`` characters of each line (Q1): a 10 MB hit line
is cut in the middle, with a marker saying how much went.

A hit line without a timestamp is at the time its chunk was read (live), or, in a replay
(``feed``'s ``sim_step``), at the time of the last timestamped line before it in the chunk,
found by one backward search over the lines since the previous hit
(``ftwatch.parsers.fields.last_timestamp``). Over 400 lines on purpose: scanning, carrying
blocks and dating records share one feed's state (the carried part, the line count, the last
stamp found), which a split would pass between modules on every hit.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Origin, Record, Severity
from ftwatch.parsers import collective, fields, multiline
from ftwatch.rules import exceptions
from ftwatch.rules.exceptions import ExceptionCatalog, ExceptionGrade
from ftwatch.rules.faultcodes import FaultTables
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern, Rule, StepTap

MAX_BLOCK_LINES = 400          # a block longer than this is closed where it is
MAX_CARRY_BYTES = 1 << 20      # never carry more than 1 MiB into the next feed
EVIDENCE_HEAD, EVIDENCE_TAIL = 4, 12
MAX_LINE_CHARS = 4096          # the longest line a Finding keeps (``line``, each evidence entry)
_MARKER_ROOM = 40              # of those, kept free for the truncation marker (it takes 20 to 30)
FAULT_PRIORITY = 30            # fault codes are as specific as rules get
INFO_LINE = re.compile(r"\bNCCL INFO\b")
"""A line at NCCL's INFO level (``NCCL_DEBUG=INFO``). NCCL logs failures at WARN; its INFO lines
are informational by NCCL's own definition (docs, environment variables: ``NCCL_DEBUG=INFO``
"prints debug information"), so a keyword hit on one never makes a finding, unless the rule's
class is ``info`` (issue 12: ``NCCL INFO NET/Plugin : dlerror=libnccl-net.so: ... No such file or
directory`` is not a missing file of the user's). A rule-level ``when:`` may replace this later."""
EXCEPTION_PRIORITY = 10        # a traceback's final class that decides by itself (KeyError, ...)
EXCEPTION_FALLBACK_PRIORITY = -5   # a generic final class (RuntimeError): rules on its message win
BLOCK_START_PATTERNS = tuple(Pattern(text, regex=True) for text in multiline.BLOCK_START_REGEXES)
"""The Matcher patterns of multiline's block starts (parsers export plain regexes)."""

# ``fields.clean``'s ANSI escapes, on bytes and never across a line end (CSI, OSC/DCS/...
# up to BEL, ST or the line end, other ESC sequences, a lone ESC).
_ANSI_BYTES = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]"
    rb"|\x1b[\]PX^_][^\n]*?(?:\x07|\x1b\\|(?=\n)|\Z)"
    rb"|\x1b[ -/]*[0-~]"
    rb"|\x1b"
)


@dataclass(slots=True)
class EngineStats:
    """Counters: bytes fed, lines scanned, records built, findings made."""

    bytes: int = 0
    lines: int = 0
    records: int = 0
    findings: int = 0


@dataclass(slots=True)
class _Pending:
    """An open block carried to the next feed of its origin.

    Attributes:
        data: the bytes from the block's first line on (ANSI removed, newline-terminated).
        since: the time of the last feed that carried it (``flush_stale`` measures from it).
        base: the time of ``data``'s first line, for its lines without a timestamp.
        skip: offsets in ``data`` of lines that closed blocks already took.
    """

    data: bytes
    since: float
    base: float
    skip: frozenset[int] = frozenset()


class Engine:
    """Turns raw output chunks into Findings.

    Args:
        rules: keyword rules (``ftwatch.rules.loader.load_rules``).
        tables: the fault-code tables; None loads the built-in ones.
        year: the year for timestamps that carry none (glog); default: the year of the feed time.
        like: an engine whose compiled database (and, when ``tables`` is None, fault tables) this
            one shares instead of compiling its own: ``evaluate`` compiles once for all its cases
            (the compile is ~90 % of a case's time). Used only when its rules and step-tap
            patterns are these; otherwise ignored. Nothing else is shared: the new engine starts
            with no carried block, no counters, no findings.

    Not thread-safe: one engine is fed from one thread (the runner's loop); engines sharing a
    database through ``like`` share its Hyperscan scratch, so feed them from one thread too.
    """

    def __init__(self, rules: Sequence[Rule], tables: FaultTables | None = None, year: int | None = None,
                 steps: StepTap | None = None, *, like: "Engine | None" = None):
        rules = list(rules)
        if like is not None and not like._compiled_for(rules, steps):
            like = None
        self.steps = steps
        if tables is None and like is not None:
            tables = like.tables
        self.tables = tables if tables is not None else FaultTables.load()
        self.exceptions = ExceptionCatalog.load()
        self.year = year
        self.stats = EngineStats()
        self._seq = itertools.count(1)
        self._pending: dict[Origin, _Pending] = {}
        self._line_pos = self._line_no = 0
        self._carry_end, self._carry_time = 0, 0.0   # the carried part of the current feed
        self._stamped: tuple[int, tuple[int, float] | None] = (0, None)   # searched up to, found
        if like is None:
            self._compile(rules)
        else:                                        # the compiled parts are never mutated, only replaced
            self.rules, self.matcher, self._owner = like.rules, like.matcher, like._owner
            self._block_ids, self._fault_ids, self._step_ids = like._block_ids, like._fault_ids, like._step_ids

    # -- set-up ---------------------------------------------------------------------------

    def _compiled_for(self, rules: list[Rule], steps: StepTap | None) -> bool:
        """Whether this engine's database is the one ``rules`` and ``steps`` would compile."""
        return (tuple(steps.patterns if steps else ()) == tuple(self.steps.patterns if self.steps else ())
                and len(rules) == len(self.rules) and all(a is b or a == b for a, b in zip(rules, self.rules)))

    def _compile(self, rules: list[Rule]) -> None:
        self.rules = rules
        patterns, owner = [], []
        for index, rule in enumerate(rules):
            for pattern in rule.patterns:
                patterns.append(pattern)
                owner.append(index)
        self._block_ids = set(range(len(patterns), len(patterns) + len(BLOCK_START_PATTERNS)))
        patterns.extend(BLOCK_START_PATTERNS)
        owner.extend([-1] * len(BLOCK_START_PATTERNS))
        self._fault_ids = set(range(len(patterns), len(patterns) + len(FaultTables.PATTERNS)))
        patterns.extend(FaultTables.PATTERNS)
        owner.extend([-2] * len(FaultTables.PATTERNS))
        self._step_ids = {len(patterns) + j: j for j in range(len(self.steps.patterns if self.steps else ()))}
        patterns.extend(Pattern(text, regex=True) for text in (self.steps.patterns if self.steps else ()))
        owner.extend([-3] * len(self._step_ids))
        self._owner = owner
        self.matcher = Matcher(patterns)

    def add_rules(self, rules: Sequence[Rule]) -> None:
        """Add rules at run time (R2: ``set_retryable_errors``); recompiles the database."""
        known = {r.id for r in self.rules}
        self._compile(self.rules + [r for r in rules if r.id not in known])

    # -- feeding --------------------------------------------------------------------------

    def feed(self, origin: Origin, data: bytes, time: float, final: bool = False,
             sim_step: float = 0.0) -> list[Finding]:
        """Scan a chunk of complete lines from one origin.

        Args:
            origin: the stream it came from (a rank prefix in a line overrides its rank).
            data: complete lines (``b"\\n"``-separated); the last may lack its newline.
            time: epoch seconds the chunk was received (or the replay clock's time).
            final: the stream ended: close any open block instead of carrying it.
            sim_step: replay's simulated clock: a line without a timestamp takes the time of
                the last line with one before it in ``data``, plus ``sim_step`` seconds per line
                between them; with none before it, ``time`` plus ``sim_step`` per line from the
                chunk's start. 0 gives every such line ``time`` (live: the time it was read).

        Returns:
            The findings, in input order.
        """
        self.stats.bytes += len(data)
        if b"\x1b" in data:
            data = _ANSI_BYTES.sub(b"", data)
        now = time
        consumed: set[int] = set()
        self._carry_end, self._carry_time = 0, time
        self._stamped = (0, None)                   # the last stamp search of this feed
        pending = self._pending.pop(origin, None)
        if pending is not None:
            data = pending.data + data
            consumed.update(pending.skip)
            self._carry_end, self._carry_time = len(pending.data), pending.base
            if sim_step:
                time = pending.base                 # line numbers now count from the carried data
        if not data:
            return []
        hits = self.matcher.scan(data)
        if not hits:
            self._count(data, len(data))
            return []
        by_line: dict[int, set[int]] = {}
        for start, pid in hits:
            by_line.setdefault(start, set()).add(pid)
        starts = sorted(by_line)
        findings: list[Finding] = []
        end_of_work = len(data)
        self._line_pos, self._line_no = 0, 0     # incremental line numbering for sim_step
        for start in starts:
            if start in consumed:
                continue
            ids = by_line[start]
            if self._step_ids and not ids.isdisjoint(self._step_ids):
                findings += self._step(origin, data, start, ids, time, sim_step)
                ids = {i for i in ids if i not in self._step_ids}
                if not ids:
                    continue
            if ids & self._block_ids and self._starts_block(data, start):
                block = self._collect_block(data, start, origin, final)
                if block is None:                      # open block: carry it over
                    self._carry(origin, data, start, now, self._base_time(data, start, time, sim_step),
                                consumed)
                    end_of_work = start
                    break
                line_starts, texts, rank = block
                block_ids: set[int] = set()
                lines = []
                for s in line_starts:
                    consumed.add(s)
                    block_ids |= by_line.get(s, set())
                    lines.append((s, by_line.get(s, set())))
                first = line_starts[0]
                record = self._record(origin, rank, texts, data, first, time, sim_step)
            else:
                end = data.find(b"\n", start)
                raw = data[start:] if end < 0 else data[start:end]
                rank, text = fields.split_rank_prefix(fields.clean(raw))
                block_ids, lines = ids, [(start, ids)]
                record = self._record(origin, rank, [text], data, start, time, sim_step)
            finding = self._judge(record, block_ids, data, lines)
            if finding is not None:
                findings.append(finding)
        self._count(data, end_of_work)
        self.stats.findings += len(findings)
        return findings

    def _step(self, origin: Origin, data: bytes, start: int, ids: set[int], time: float,
              sim_step: float) -> list[Finding]:
        """Hand a step line to the tap (its own finding, if any; the line may also hit rules)."""
        rank, text = fields.split_rank_prefix(fields.clean(_line_at(data, start)))
        stamp = fields.parse_timestamp(text, self.year or fields.year_of(time))
        if stamp is None:
            stamp = self._base_time(data, start, time, sim_step)
        index = min(self._step_ids[i] for i in ids if i in self._step_ids)
        found = self.steps.observe(origin.with_rank(rank), index, text, stamp, next(self._seq))
        return [] if found is None else [found]

    def flush(self, origin: Origin, time: float) -> list[Finding]:
        """Close the open block of ``origin`` (its stream ended or went quiet)."""
        if origin not in self._pending:
            return []
        return self.feed(origin, b"", time, final=True)

    def flush_stale(self, now: float, timeout: float, job: str | None = None) -> list[Finding]:
        """Close every open block older than ``timeout`` seconds (P1 flush timeout); only those
        of ``job`` when given."""
        out: list[Finding] = []
        for origin in [o for o, p in self._pending.items()
                       if now - p.since >= timeout and (job is None or o.job == job)]:
            out.extend(self.flush(origin, now))
        return out

    def next_seq(self) -> int:
        """A sequence number after every record made so far (for findings made beside the engine,
        e.g. exits read from a stream, so that they sort after the lines that came before them)."""
        return next(self._seq)

    def pending_origins(self) -> list[Origin]:
        """Origins with an open block carried over."""
        return list(self._pending)

    # -- internals ------------------------------------------------------------------------

    def _count(self, data: bytes, end: int) -> None:
        self.stats.lines += data.count(b"\n", 0, end)
        if end == len(data) and data and not data.endswith(b"\n"):
            self.stats.lines += 1                   # a last line without its newline

    def _carry(self, origin: Origin, data: bytes, start: int, now: float, base: float,
               consumed: set[int]) -> None:
        """Keep ``data[start:]`` (an open block and what follows it) for the next feed."""
        rest = data[start:]
        if not rest.endswith(b"\n"):
            rest += b"\n"                          # the next feed starts a new line
        skip = frozenset(s - start for s in consumed if s > start)
        self._pending[origin] = _Pending(rest, now, base, skip)

    def _base_time(self, data: bytes, start: int, time: float, sim_step: float) -> float:
        """The time of the line at ``start`` when it carries no timestamp of its own (see
        ``feed``'s ``sim_step``). Hits come mostly in order, so each search for the stamp
        before a hit covers only the lines since the previous one."""
        if sim_step:
            searched, found = self._stamped
            year = self.year or fields.year_of(time)
            if start >= searched:
                found = fields.last_timestamp(data, searched, start, year) or found
                self._stamped = (start, found)
            else:                                   # a block's first line, before the last hit
                found = fields.last_timestamp(data, 0, start, year)
            if found is not None:
                return found[1] + data.count(b"\n", found[0], start) * sim_step
            return time + self._line_index(data, start) * sim_step
        return self._carry_time if start < self._carry_end else time

    @staticmethod
    def _starts_block(data: bytes, start: int) -> bool:
        return multiline.is_block_start(fields.split_rank_prefix(fields.clean(_line_at(data, start)))[1])

    def _collect_block(self, data: bytes, start: int, origin: Origin, final: bool):
        """The lines of the block starting at ``start``, same rank only; None if still open."""
        first_rank, first_text = fields.split_rank_prefix(fields.clean(_line_at(data, start)))
        line_starts, texts = [start], [first_text]
        pos = data.find(b"\n", start)
        truncated = False
        while pos >= 0 and pos + 1 < len(data):
            s = pos + 1
            pos = data.find(b"\n", s)
            raw = data[s:] if pos < 0 else data[s:pos]
            rank, text = fields.split_rank_prefix(fields.clean(raw))
            if rank != first_rank:
                continue
            line_starts.append(s)
            texts.append(text)
            end = multiline.block_end(texts, 0)
            if end is not None:
                return line_starts[: end + 1], texts[: end + 1], first_rank
            if len(texts) >= MAX_BLOCK_LINES:
                truncated = True
                break
        end = multiline.block_end(texts, 0)
        if end is not None:
            return line_starts[: end + 1], texts[: end + 1], first_rank
        if final or truncated or len(data) - start > MAX_CARRY_BYTES:
            return line_starts, texts, first_rank
        return None

    def _record(self, origin: Origin, rank: int | None, texts: list[str], data: bytes,
                start: int, time: float, sim_step: float) -> Record:
        year = self.year or fields.year_of(time)
        stamp = fields.parse_timestamp(texts[0], year)
        if stamp is None:
            stamp = self._base_time(data, start, time, sim_step)
        self.stats.records += 1
        return Record(origin.with_rank(rank), "\n".join(texts), stamp, next(self._seq))

    def _matching_line(self, lines: list[str], index: int) -> str | None:
        """The last line of a block that hits rule ``index`` (the exception line, usually)."""
        if len(lines) == 1:
            return lines[0]
        owner = self._owner
        for line in reversed(lines):
            if any(owner[i] == index for i in self.matcher.match_text(line)):
                return line
        return None

    def _line_index(self, data: bytes, start: int) -> int:
        """The 0-based line number of offset ``start``; hits come in order, so count forward only."""
        if start >= self._line_pos:
            self._line_no += data.count(b"\n", self._line_pos, start)
        else:                                   # a block's first line, before the last hit
            self._line_no -= data.count(b"\n", start, self._line_pos)
        self._line_pos = start
        return self._line_no

    def _judge(self, record: Record, ids: set[int], data: bytes,
               lines: list[tuple[int, set[int]]]) -> Finding | None:
        """Pick the one finding a record makes: highest priority, then most drastic action.

        In a Python traceback the final exception decides (``ftwatch.rules.exceptions``): at equal
        priority a rule that hits the final exception line (or the message lines after it) beats
        one that hits only a frame or an earlier exception of a chain, and the catalog grades the
        final class itself: a class that decides by itself (``KeyError``, ``ConnectionResetError``,
        ``torch.OutOfMemoryError``) at ``EXCEPTION_PRIORITY``, a generic one (``RuntimeError``)
        at ``EXCEPTION_FALLBACK_PRIORITY``, below every rule on its message and above only the
        ``python.uncaught_exception`` catch-all. The catalog refines a traceback that a rule read
        (the built-in catch-all reads them all); with no rule counting, the record makes nothing.

        On a tie a fault code wins over a keyword rule: same verdict, but it carries the
        code's fields (an Xid 79 line gives ``xid.79`` with ``xid`` and ``pci``, not the
        ``GPU has fallen off the bus`` keyword rule that also hits it). A rule with a
        condition (``when:``, SPEC P4) counts only when one of the record's lines that hit
        it passes its predicate (``lines``: each line's offset in ``data`` and pattern ids);
        the predicate runs only for a rule that would otherwise win.
        """
        best: tuple[int, int, int, int] | None = None
        finding: Finding | None = None
        texts = record.text.split("\n")
        final, grade, final_rules = self._final_exception(texts)
        rule_ids = sorted({self._owner[i] for i in ids if self._owner[i] >= 0})
        for index in rule_ids:
            rule = self.rules[index]
            if rule.failure_class is not FailureClass.INFO and self._only_info_lines(texts, index):
                continue
            key = (rule.priority, int(index in final_rules), int(rule.action), 0)
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
                   1, int(grade.action), 0)
            if best is None or key > best:
                best = key
                finding = self._exception_finding(record, texts, final, grade)
        if ids & self._fault_ids:
            for hit in self.tables.extract(record.text):
                entry = hit.entry or self.tables.grade_unknown(hit)
                action = entry.action if entry else Action.NOTIFY
                key = (FAULT_PRIORITY, 1, int(action), 1)
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
            if any(owner[i] == index for i in ids) and rule.predicate(_line_at(data, start), record.origin):
                return texts[k] if k < len(texts) else texts[-1]
        return None

    def _only_info_lines(self, lines: list[str], index: int) -> bool:
        """True when every line of the record that hits rule ``index`` is an NCCL INFO line."""
        if not any(INFO_LINE.search(line) for line in lines):
            return False
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
        return final, self.exceptions.grade(lines[final]), {self._owner[i] for i in hits if self._owner[i] >= 0}

    def _exception_finding(self, record: Record, lines: list[str], final: int,
                           grade: ExceptionGrade) -> Finding:
        severity = (Severity.ERROR if grade.action >= Action.RESTART_INSTANCE
                    else Severity.WARNING if grade.action == Action.NOTIFY else Severity.INFO)
        return Finding(f"python.exception.{grade.name}", "keyword", grade.failure_class, grade.action,
                       severity, record.origin, _cap(lines[final]), record.time, record.seq,
                       _evidence(lines), {"exception": grade.name}, grade.source)

    def _finding(self, record: Record, index: int, line: str | None = None) -> Finding:
        rule = self.rules[index]
        lines = record.text.split("\n")
        line = line or self._matching_line(lines, index) or lines[-1]
        return Finding(rule.id, "keyword", rule.failure_class, rule.action, rule.severity,
                       record.origin, _cap(line), record.time, record.seq, _evidence(lines),
                       collective.fields(record.text), rule.source)

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


def _line_at(data: bytes, start: int) -> bytes:
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

