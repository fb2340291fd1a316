"""Stage 3: chunks of raw log lines in, Findings out.

The hot path (DESIGN.md "Speed on the hot path"): one multi-pattern database holds every
rule's patterns, the block starts (tracebacks, C++ stack dumps) and the fault-code
patterns; it scans a whole chunk at once and Python only touches the lines that hit.
A hit line becomes a Record (decoded, ANSI stripped, rank prefix and timestamp taken), except a
line that only a fault-code candidate pattern hit and that holds no code (``FaultTables.extract``
finds none: it would make no finding);
a block start collects the following lines of the same rank into one Record (P1), so
interleaved ranks never mix. A block that is still open at the end of a chunk is carried
over to the next feed of the same origin (or closed by ``flush``), with the lines after it
that closed blocks already took (so they are never judged twice) and the time of its first
line. ANSI escape sequences are removed from a chunk before it is scanned, so colours
never hide a pattern (a coloured ``KeyError`` of Python 3.13's tracebacks still hits).

Each Record yields at most one Finding, chosen by ``ftwatch.rules.judge`` (priority, the
traceback's final exception, ``when:`` conditions, NCCL INFO lines, fault codes).

A hit line without a timestamp is at the time its chunk was read (live), or, in a replay
(``feed``'s ``sim_step``), at the time of the last timestamped line before it in the chunk,
found by one backward search over the lines since the previous hit
(``ftwatch.parsers.chunks.last_timestamp``). Scanning and dating records share one feed's state
(the carried part, the line count, the last stamp found), so they stay here; judging a finished
Record needs none of it and lives in ``ftwatch.rules.judge``. A block's lines and the table of
open blocks carried between feeds (with what ``watch`` stores of them) are
``ftwatch.rules.blocks``; a batch of many streams' chunks (one scan, the step-only chunks in one
step-tap call) is ``ftwatch.rules.batches``; the time of a line the step tap asks for,
``ftwatch.rules.lineclock``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ftwatch.errors import Issue, RuleError
from ftwatch.events import Finding, Origin, Record
from ftwatch.parsers import chunks, fields, multiline
from ftwatch.rules import added_rules, batches
from ftwatch.rules.batches import ScanHits
from ftwatch.rules.blocks import (MAX_BLOCK_LINES, MAX_CARRY_BYTES, OpenBlocks, RankLines, collect_block,
                                  starts_block)
from ftwatch.rules.exceptions import ExceptionCatalog
from ftwatch.rules.faultcodes import FaultTables
from ftwatch.rules.judge import Judge
from ftwatch.rules.lineclock import LineClock
from ftwatch.rules.matcher import Matcher, PatternError
from ftwatch.rules.model import Pattern, Rule, StepTap

__all__ = ["BLOCK_START_PATTERNS", "MAX_BLOCK_LINES", "MAX_CARRY_BYTES", "Engine", "EngineStats"]

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


_NO_IDS: frozenset[int] = frozenset()   # the pattern ids of a block line that hit none


@dataclass(slots=True)
class EngineStats:
    """Counters: bytes fed, lines scanned, records built, findings made."""

    bytes: int = 0
    lines: int = 0
    records: int = 0
    findings: int = 0


def _rule_error(exc: PatternError, rules: Sequence[Rule], owner: Sequence[int]) -> Exception:
    """The matcher's refusal of one of the engine's patterns as a ``RuleError`` at the ``file:line``
    of the rule that pattern is one of (a built-in pack's patterns are checked on Hyperscan only
    here, ``ftwatch.rules.loader.rules_from_text``); ``exc`` itself for a pattern of no rule (a
    block start, a fault-code candidate)."""
    if not 0 <= exc.index < len(owner) or owner[exc.index] < 0:
        return exc
    rule = rules[owner[exc.index]]
    name, _, line = rule.location.rpartition(":")
    return RuleError([Issue(name, int(line) if line.isdigit() else 0, f"rule {rule.id!r}: {exc.reason}")])


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

    Raises:
        RuleError: a rule's pattern that the matcher rejects, at the rule's ``file:line`` (the
            built-in packs are checked on Hyperscan here, in the one compile of the database).
        ValueError: the matcher rejects the set as a whole (``Matcher``).
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
        self._pending = OpenBlocks()
        self._line_pos = self._line_no = 0
        self._carry_end, self._carry_time = 0, 0.0   # the carried part of the current feed
        #: the last stamp search of the feed: searched up to, the stamp found (its line's start, time),
        #: the number of that line (``_line_index``)
        self._stamped: tuple[int, tuple[int, float] | None, int] = (0, None, 0)
        self._year = year or 0                        # the current feed's year for stamps without one
        #: the last feed's chunk (the caller's object) and, by id, its findings with where their line
        #: starts in it (:meth:`position`); None: no offsets (escapes were removed from the chunk)
        self._fed: bytes | None = None
        self._found: dict[int, tuple[Finding, int]] = {}
        if like is None:
            self._compile(rules)
        else:                                        # the compiled parts are never mutated, only replaced
            self.rules, self.matcher, self._owner = like.rules, like.matcher, like._owner
            self._compiled = like._compiled
            self._block_ids, self._fault_ids = like._block_ids, like._fault_ids
            self.judge = like.judge if tables is like.tables else Judge(
                self.rules, self._owner, self.matcher, self.tables, self.exceptions)

    # -- set-up ---------------------------------------------------------------------------

    def _compiled_for(self, rules: list[Rule], steps: StepTap | None) -> bool:
        """Whether this engine's database is the one ``rules`` would compile (the step tap's
        patterns are not in it: the tap finds its lines itself)."""
        return rules == self.rules      # (in C, each pair by identity first: per case of an evaluation, ~1,000 rules)

    def _compile(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._compiled = len(rules)                 # rules in the database; more: ``added_rules``
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
        self._owner = owner
        try:
            self.matcher = Matcher(patterns)
        except PatternError as exc:
            raise _rule_error(exc, rules, owner) from None
        self.judge = Judge(rules, owner, self.matcher, self.tables, self.exceptions)

    def add_rules(self, rules: Sequence[Rule]) -> list[str]:
        """Add rules at run time (R2: ``set_retryable_errors``). A rule whose id the engine has
        already is left out. Only the rules added at run time are compiled, into a small
        database beside the compiled one (``added_rules``: milliseconds, where the
        whole set took seconds and stalled the loop). Returns the ids added."""
        known = {r.id for r in self.rules}
        added = [r for r in rules if r.id not in known]
        if added:
            added_rules.layer(self, self.rules + added)
        return [r.id for r in added]

    def remove_rules(self, ids: Iterable[str]) -> int:
        """Remove the rules with these ids (``watch``: a job's ``set_retryable_errors`` rules when
        the job ends): the small database of rules added at run time is compiled again, the
        whole set only when a compiled rule goes. Returns how many went."""
        gone = set(ids)
        kept = [r for r in self.rules if r.id not in gone]
        removed = len(self.rules) - len(kept)
        if removed and all(r.id not in gone for r in self.rules[:self._compiled]):
            added_rules.layer(self, kept)
        elif removed:
            self._compile(kept)
        return removed

    # -- feeding --------------------------------------------------------------------------

    def scan_many(self, parts: Sequence[bytes]) -> list[list[tuple[int, int]] | None]:
        """One matcher scan for many chunks, per chunk its hits for ``feed``'s ``hits``
        (``ftwatch.rules.batches.scan_many``: what it returns, when a chunk gets None)."""
        return batches.scan_many(self, parts)

    def feed(self, origin: Origin, data: bytes, time: float, final: bool = False,
             sim_step: float = 0.0, hits: list[tuple[int, int]] | None = None,
             defer: list | None = None, counted: int | None = None) -> list[Finding]:
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
            hits: ``data``'s hits from ``scan_many`` (one scan for many origins, its step lines
                with them); None: scan here. Ignored (scanned again) when a block of ``origin``
                was carried over.
            defer: a list (``watch``: one batch's): where ``hits`` came from ``scan_many`` with
                its step lines and no block was carried over, the chunk's step lines that
                would go to the step tap here (before ``end``, none a block took) are appended
                to it instead, as one ``(origin, b"", time, ScanHits)`` part for
                :meth:`feed_steps` (``b""``: the chunk is counted here), so a batch's step lines
                go to the tap in one call whether or not a rule hit their chunk. None: taken here.
            counted: ``data``'s line count if the caller has it (``intake.output``'s, issue 16:
                ~0.012 s a bench replay), taken for a chunk counted whole and unchanged.

        Returns:
            The findings, in input order.
        """
        self.stats.bytes += len(data)
        self._fed, self._found = data, {}
        if b"\x1b" in data:
            data, counted = _ANSI_BYTES.sub(b"", data), None
            self._fed = None                        # offsets into the stripped chunk: not the caller's
        now = time
        consumed: set[int] = set()
        self._carry_end, self._carry_time = 0, time
        self._stamped = (0, None, 0)                # the last stamp search of this feed
        pending = self._pending.take(origin)
        carried = 0
        if pending is not None:
            carried = len(pending.data)
            data, counted = pending.data + data, None
            consumed.update(pending.skip)
            self._carry_end, self._carry_time = len(pending.data), pending.base
            if sim_step:
                time = pending.base                 # line numbers now count from the carried data
        if not data:
            return []
        steps = None
        if hits is None or pending is not None:
            hits = self.matcher.scan(data)
        elif defer is None:
            steps = getattr(hits, "steps", None)
        else:                                       # deferred: kept at the batch's offsets
            steps = getattr(hits, "found", None)
        self._year = self.year or fields.year_of(time)
        if not hits:
            self._count(data, len(data), counted)
            if self.steps is None or steps == []:
                return []
            if defer is not None and steps is not None:
                defer.append((origin, b"", time, batches.step_part(hits, len(data), consumed)))
                return []
            findings = self._steps(origin, data, len(data), consumed, time, sim_step, steps)
            self.stats.findings += len(findings)
            return findings
        by_line: dict[int, set[int]] = {}
        get = by_line.get
        for start, pid in hits:                 # no new set per hit, only per line (issue 16)
            ids = get(start)
            if ids is None:
                by_line[start] = {pid}
            else:
                ids.add(pid)
        starts = sorted(by_line)
        findings: list[Finding] = []
        end_of_work = len(data)
        self._line_pos, self._line_no = 0, 0     # incremental line numbering for sim_step
        index = None
        for start in starts:
            if start in consumed:
                continue
            ids = by_line[start]
            if ids & self._block_ids and starts_block(data, start):
                if index is None:
                    index = RankLines(data)            # the chunk's lines by rank, built if its blocks need it
                block = collect_block(data, start, final, index)
                if block is None:                      # open block: carry it over
                    self._pending.carry(origin, data, start, now, self._base_time(data, start, time, sim_step),
                                consumed)
                    end_of_work = start
                    break
                line_starts, texts, rank = block
                consumed.update(line_starts)
                # each line's pattern ids, the shared empty set for a line that hit none (judging
                # only reads them): no new set per block line (issue 16)
                lines = [(s, get(s, _NO_IDS)) for s in line_starts]
                block_ids: set[int] = set().union(*[ids for _, ids in lines if ids])
                first = line_starts[0]
                record = self._record(origin, rank, texts, data, first, time, sim_step)
                at = first
            else:
                end = data.find(b"\n", start)
                raw = data[start:] if end < 0 else data[start:end]
                rank, text = fields.split_rank_prefix(fields.clean(raw))
                if ids <= self._fault_ids and not self.tables.extract(text):
                    # only a fault-code candidate, and no code in it: no Record, no judging. Its
                    # stamp search still runs where the Record's would, so later lines' times stay.
                    if sim_step and fields.parse_timestamp(text, self._year) is None:
                        self._base_time(data, start, time, sim_step)
                    continue
                block_ids, lines = ids, [(start, ids)]
                record = self._record(origin, rank, [text], data, start, time, sim_step)
                at = start
            finding = self.judge.judge(record, block_ids, data, lines)
            if finding is not None:
                findings.append(finding)
                self._found[id(finding)] = (finding, max(0, at - carried))
        self._count(data, end_of_work, counted)
        if self.steps is not None and steps != []:
            if defer is not None and steps is not None:     # batch hits, nothing carried: see ``defer``
                defer.append((origin, b"", time, batches.step_part(hits, end_of_work, consumed)))
            else:
                findings += self._steps(origin, data, end_of_work, consumed, time, sim_step, steps)
        self.stats.findings += len(findings)
        return findings

    def position(self, f: Finding, data: bytes) -> int | None:
        """Where in ``data`` the line of ``f`` starts (0: in a block carried from the chunk before),
        when ``f`` is a finding of a rule hit that the last :meth:`feed` of this very ``data`` (the
        same object) returned; else None (another chunk's, the step tap's, an exit's, or a chunk
        whose escapes were removed). ``ftwatch.policy.progress.Survival`` reads a chunk for the
        progress after its errors only from shortly before them (issue 16)."""
        if data is not self._fed:
            return None
        found = self._found.get(id(f))
        return found[1] if found is not None and found[0] is f else None

    def _steps(self, origin: Origin, data: bytes, end: int, consumed: set[int], time: float,
               sim_step: float, found: list | None = None) -> list[Finding]:
        """Hand the chunk to the step tap: its step lines before ``end`` that no block took (a
        step line may also hit rules: those were judged above). Its findings come after the
        chunk's others. A line's time, only where the tap asks (``ftwatch.rules.lineclock.LineClock``)."""
        return self.steps.take_chunk(origin, data, end, consumed, LineClock(self, data, time, sim_step),
                                     self.next_seq, found)

    def chunk_bytes(self, origin: Origin) -> int:
        """Bytes of ``origin``'s output a chunk should hold for the step tap
        (``StepTracker.chunk_bytes``: thousands of ranks in one stream); 0: no wish (no tap, or
        no rank known yet)."""
        return 0 if self.steps is None else self.steps.chunk_bytes(origin)

    def count_if_quiet(self, origin: Origin, data: bytes, hits: list[tuple[int, int]] | None) -> bool:
        """Count ``data`` and return True when :meth:`feed` of it with ``hits`` (from
        :meth:`scan_many`) would only count it: no rule hit, no step line, no open block of
        ``origin`` carried over (``watch``: a batch's quiet origins, ``IncidentDesk.output_many``).
        Else False, and nothing is done: feed it."""
        if hits is None or hits or (self.steps is not None and getattr(hits, "found", None) != []) or (
                self._pending and origin in self._pending):
            return False
        self.stats.bytes += len(data)
        self._count(data, len(data))
        return True

    def steps_only(self, origin: Origin, hits: list[tuple[int, int]] | None) -> bool:
        """Whether :meth:`feed` of a chunk with ``hits`` (from :meth:`scan_many`) would only
        count it and hand its step lines to the tap: no rule hit, step lines found, no open
        block of ``origin`` carried over. Such chunks of many origins go to :meth:`feed_steps`
        together."""
        return (hits is not None and not hits and self.steps is not None and bool(getattr(hits, "found", None))
                and not (self._pending and origin in self._pending))

    def feed_steps(self, parts: Sequence[tuple[Origin, bytes, float, ScanHits]]) -> list[Finding]:
        """The step lines of many origins' chunks (those :meth:`steps_only` passed) in one step-tap
        call; returns the tap's findings (``ftwatch.rules.batches.feed_steps``)."""
        return batches.feed_steps(self, parts)

    def flush(self, origin: Origin, time: float) -> list[Finding]:
        """Close the open block of ``origin`` (its stream ended or went quiet)."""
        if origin not in self._pending:
            return []
        return self.feed(origin, b"", time, final=True)

    def flush_stale(self, now: float, timeout: float, job: str | None = None) -> list[Finding]:
        """Close every open block older than ``timeout`` seconds (P1 flush timeout); only those
        of ``job`` when given."""
        out: list[Finding] = []
        for origin in self._pending.stale(now, timeout, job):
            out.extend(self.flush(origin, now))
        return out

    def next_seq(self) -> int:
        """A sequence number after every record made so far (for findings made beside the engine,
        e.g. exits read from a stream, so that they sort after the lines that came before them)."""
        return next(self._seq)

    def track_blocks(self) -> None:
        """From now on note which origins' open blocks change, for :meth:`changed_blocks`
        (``watch`` stores them with each batch, issue 17)."""
        self._pending.track()

    def changed_blocks(self) -> list[tuple[Origin, bytes | None, float, frozenset[int]]]:
        """The open blocks that changed since the last call (after :meth:`track_blocks`): per
        origin ``(origin, data, base, skip)`` as ``ftwatch.rules.blocks.OpenBlock`` holds them,
        ``data`` None when the origin has none open any more."""
        return self._pending.changed()

    def restore_block(self, origin: Origin, data: bytes, base: float, skip: frozenset[int], now: float) -> None:
        """Open ``origin``'s block again as a stored batch left it (``changed_blocks``); it goes
        stale from ``now`` (epoch s)."""
        self._pending.restore(origin, data, base, skip, now)

    def pending_origins(self) -> list[Origin]:
        """Origins with an open block carried over."""
        return self._pending.origins()

    def pending_over(self, max_blocks: int, max_bytes: int) -> list[Origin]:
        """The origins whose open blocks are past the caps (``limits.max_open_blocks`` /
        ``max_open_block_bytes``), the least recently carried first: those to :meth:`flush`
        early. Empty while within both."""
        return self._pending.over(max_blocks, max_bytes)

    # -- internals ------------------------------------------------------------------------

    def _count(self, data: bytes, end: int, counted: int | None = None) -> None:
        """``stats.lines`` += the lines before ``end`` (``counted`` where ``end`` is the end)."""
        if counted is not None and end == len(data):
            self.stats.lines += counted
            return
        self.stats.lines += chunks.newlines(data, 0, end)
        if end == len(data) and data and not data.endswith(b"\n"):
            self.stats.lines += 1                   # a last line without its newline

    def _base_time(self, data: bytes, start: int, time: float, sim_step: float) -> float:
        """The time of the line at ``start`` when it carries no timestamp of its own (see
        ``feed``'s ``sim_step``). Hits come mostly in order, so each search for the stamp
        before a hit covers only the lines since the previous one, and so does the count of the
        lines since that stamp (the stamp's line number is kept with it: a chunk of untimed hit
        lines under one stamp counted back to it for every hit, issue 16)."""
        if sim_step:
            searched, found, found_line = self._stamped
            year = self._year
            if start >= searched:
                newer = chunks.last_timestamp(data, searched, start, year)
                if newer is not None:
                    found, found_line = newer, self._line_index(data, newer[0])
                self._stamped = (start, found, found_line)
                if found is not None:
                    return found[1] + (self._line_index(data, start) - found_line) * sim_step
            else:                                   # a block's first line, before the last hit
                found = chunks.last_timestamp(data, 0, start, year)
                if found is not None:
                    return found[1] + chunks.newlines(data, found[0], start) * sim_step
            return time + self._line_index(data, start) * sim_step
        return self._carry_time if start < self._carry_end else time

    def _record(self, origin: Origin, rank: int | None, texts: list[str], data: bytes,
                start: int, time: float, sim_step: float) -> Record:
        stamp = fields.parse_timestamp(texts[0], self._year)
        if stamp is None:
            stamp = self._base_time(data, start, time, sim_step)
        self.stats.records += 1
        return Record(origin.with_rank(rank), "\n".join(texts), stamp, next(self._seq))

    def _line_index(self, data: bytes, start: int) -> int:
        """The 0-based line number of offset ``start``; hits come in order, so count forward only."""
        if start >= self._line_pos:
            self._line_no += chunks.newlines(data, self._line_pos, start)
        else:                                   # a block's first line, before the last hit
            self._line_no -= chunks.newlines(data, start, self._line_pos)
        self._line_pos = start
        return self._line_no
