"""``ftwatch replay``: recorded logs through the same engine and policy, with a simulated clock (T3).

Each file is one instance's log (its rank read from the file name, e.g. ``rank3.log`` or
``worker-3.err``) or one combined log whose lines carry rank prefixes (``[rank3]:``,
torchrun's ``[default3]:`` / ``3:``). Files are read in 1 MiB chunks cut at line ends and
scanned whole (no per-line Python work on lines that do not hit a rule); a traceback or a
torchelastic summary cut by a chunk boundary is joined, and a line longer than a chunk is
read whole.

Time comes from the lines' timestamps where present, else from a simulated clock that
advances ``SIM_STEP`` seconds per line. Each file's clock is anchored at the first real
timestamp among its first ``ANCHOR_LINES`` lines (see ``anchor``): line *i* of a file whose
line *k* reads time *t* is at *t + (i - k) * SIM_STEP*, so untimed lines sit on the log's own
dates; a file with none there takes the earliest anchor of the other files, or ``SIM_START``.
The anchor's year is the engine's year for stamps that carry none (glog, syslog). This is
the simplest correct thing, not a per-line clock: an untimed line long after the anchor
may still be placed before a timestamped line that precedes it (SIM_STEP per line runs
slower than most logs), since following every timestamp would mean Python work on every
line. With job hang detection on (R5, opt-in), the lines' timestamps also place each
instance's output on a merged timeline, where a silence of every instance for the interval is
a job hang (see ``replay_hang``); it is the trigger when it comes before the first real
error. The end of the input is the end of the job: exit
codes come from a torchelastic failure summary when present; otherwise the job failed if an
error was found, else it succeeded.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from ftwatch.events import Decision, Finding, Origin, ProcessExit, Severity, FailureClass
from ftwatch.parsers import fields
from ftwatch.parsers.torchelastic import SummaryFailure, parse_summary
from ftwatch.pipeline.replay_hang import HangScan
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.policy.triggers import opens_incident
from ftwatch.policy.policy import Incident, Policy
from ftwatch.rules.timers import HangTracker

CHUNK_BYTES = 1 << 20
SIM_STEP = 0.001            # simulated seconds per line without a timestamp
SIM_START = 1_795_219_200.0  # 2026-11-21T00:00:00Z: the simulated clock's origin without an anchor
ANCHOR_LINES = 200          # lines at the head of a file searched for the clock's anchor
ANCHOR_BYTES = 64 << 10     # bytes at the head of a file searched for it
_ANCHOR_CHARS = 256         # of each line: every timestamp format starts well within it
_RANK_IN_NAME = re.compile(r"(?:rank|worker|default|node)[-_.]?(\d+)", re.IGNORECASE)
_SUMMARY_MARK = b"Root Cause (first observed failure)"


@dataclass
class ReplayResult:
    """What a replay found: every finding, the decision, the lines and bytes read, and notes
    for the user (e.g. that hang detection found no timestamps)."""

    findings: list[Finding]
    decision: Decision
    lines: int
    bytes: int
    notes: list[str] = field(default_factory=list)


def origin_for(path: Path, job: str) -> Origin:
    """The origin of a file: its rank from the name when it has one, else a combined log."""
    match = _RANK_IN_NAME.search(path.name)
    if match:
        rank = int(match.group(1))
        return Origin(f"rank{rank}", rank, job, "replay", str(path), "replay")
    return Origin(path.stem, None, job, "replay", str(path), "replay")


def replay(paths: Sequence[Path], engine: Engine, policy: Policy, job: str = "replay",
           progress: Callable[[int], None] | None = None) -> ReplayResult:
    """Run recorded logs through ``engine`` and ``policy``.

    Args:
        paths: log files (see module docstring).
        progress: called with the number of bytes read after each chunk (a progress bar).

    Returns:
        The findings, the final decision and the volume read.

    Raises:
        OSError: a file cannot be read.
    """
    findings: list[Finding] = []
    failures: list[SummaryFailure] = []
    ranks: set[int] = set()
    total = 0
    own_year = engine.year
    default_year = own_year or _year_of(SIM_START)
    anchors = [anchor(Path(path), default_year) for path in paths]
    fallback = min((a for a in anchors if a is not None), default=(SIM_START, own_year))
    ends = [fallback[0]]                    # each file's clock at its end
    pol = policy.policy
    scan = (HangScan(pol.job_hang_interval, job) if pol.enable_job_hang_detection and pol.job_hang_interval > 0
            and pol.job_execution_mode == "Sync" else None)
    try:
        for path, found in zip(paths, anchors):
            origin = origin_for(Path(path), job)
            if origin.rank is not None:
                ranks.add(origin.rank)
            base, engine.year = found or fallback
            summary = _SummaryLines()
            if scan is not None:
                scan.open(origin, engine.year or default_year)
            size, end = _replay_file(Path(path), origin, engine, base, findings, summary, progress, scan)
            total += size
            ends.append(end)
            failures.extend(parse_summary(summary.lines))
    finally:
        engine.year = own_year
    hang, notes = _job_hang(scan)
    if hang is not None:
        findings.append(hang)
        ends.append(scan.last)
    for f in findings:
        if f.rank is not None:
            ranks.add(f.rank)
    end = max([f.time for f in findings] + ends)
    exits = _summary_exits(failures, job, end + SIM_STEP)
    ranks.update(e.origin.rank for e in exits)
    table = ExitCodeTable.load()
    failed: set[str] = set()
    trigger: Finding | None = None
    for exit in exits:
        if exit.stopped_by_us:
            continue
        failed.add(exit.origin.instance)
        finding = exit_finding(exit, table, seq=0)
        if finding is not None:
            findings.append(finding)
            trigger = trigger or finding
    errors = [f for f in findings if f.severity >= Severity.ERROR and f.failure_class is not FailureClass.INFO]
    if trigger is None and errors:
        trigger = min(errors, key=lambda f: (f.time, f.seq))
        failed.update(f.origin.instance for f in errors
                      if f.failure_class is not FailureClass.FALLOUT and f is not hang)
    if hang is not None and not any(f.time < hang.time for f in errors
                                    if f.failure_class is not FailureClass.FALLOUT and f is not hang):
        trigger, failed = hang, set()       # live, the hang fired before anything failed
    if trigger is None:     # no failure: a C4D record or a notify / isolate finding still opens one (R8)
        trigger = next((f for f in sorted(findings, key=lambda f: (f.time, f.seq))
                        if opens_incident(f, policy.c4d)), None)
    if trigger is None:
        decision = policy.finished(end, ok=True)
    else:
        world = max(len(ranks), 1)
        decision = policy.decide(Incident(trigger, tuple(findings), world, frozenset(failed), 0), end)
    return ReplayResult(findings, decision, engine.stats.lines, total, notes)


def _job_hang(scan: HangScan | None) -> tuple[Finding | None, list[str]]:
    """The job hang ``scan`` found, and notes on what it could not read."""
    if scan is None:
        return None, []
    if scan.untimed:
        return None, [f"job hang detection needs timestamps: no line of {', '.join(scan.untimed)} has one, "
                      "so no job hang was looked for"]
    return scan.first_hang(HangTracker(scan.interval, None)), []


def _replay_file(path: Path, origin: Origin, engine: Engine, base: float, findings: list[Finding],
                 summary: "_SummaryLines", progress: Callable[[int], None] | None,
                 scan: HangScan | None = None) -> tuple[int, float]:
    """Feed one file to ``engine`` in chunks, its clock starting at ``base``.

    Appends to ``findings`` and ``summary`` (and gives each chunk to ``scan``, opened for this
    file, when hang detection is on); returns (bytes read, the clock at the end).
    """
    total = 0
    with open(path, "rb") as fh:
        parts: list[bytes] = []         # a line longer than a chunk, read so far
        while True:
            block = fh.read(CHUNK_BYTES)
            if not block:
                break
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                parts.append(block)
                continue
            chunk = b"".join(parts) + block[:cut] if parts else block[:cut]
            parts = [block[cut:]] if cut < len(block) else []
            findings.extend(engine.feed(origin, chunk, base, sim_step=SIM_STEP))
            base += chunk.count(b"\n") * SIM_STEP
            summary.take(chunk)
            if scan is not None:
                scan.take(chunk)
            total += len(chunk)
            if progress:
                progress(len(chunk))
        carry = b"".join(parts)
        findings.extend(engine.feed(origin, carry, base, final=True, sim_step=SIM_STEP))
        summary.take(carry)
        if scan is not None:
            scan.take(carry)
            scan.close()
        total += len(carry)
        if progress and carry:
            progress(len(carry))
    return total, base


def anchor(path: Path, year: int) -> tuple[float, int] | None:
    """Where a file's simulated clock starts: its first real timestamp, moved back to line 0.

    Reads the first ``ANCHOR_BYTES`` of the file and parses at most ``ANCHOR_LINES`` lines
    (their first 256 characters): cheap, whatever the file's size. The year comes from the
    first stamp there that carries one (ISO, dmesg -T, plog), else it is ``year``; glog and
    syslog stamps are read in it. If line *k* (0-based) is the first with a timestamp *t*,
    the clock starts at *t - k * SIM_STEP*, so that line's simulated time is its real one.

    Args:
        path: a log file.
        year: the year for stamps without one when no stamp in the head has one.

    Returns:
        (epoch seconds of line 0, the year), or None when no line there has a timestamp.

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        head = fh.read(ANCHOR_BYTES)
    if len(head) == ANCHOR_BYTES:
        head = head[: head.rfind(b"\n") + 1] or head      # not a line cut off by the read
    raws = head.split(b"\n", ANCHOR_LINES)[:ANCHOR_LINES]
    texts = [fields.clean(raw[:_ANCHOR_CHARS]) for raw in raws]
    for text in texts:
        stamp = fields.parse_timestamp(text, None)
        if stamp is not None:
            year = _year_of(stamp)
            break
    for index, text in enumerate(texts):
        stamp = fields.parse_timestamp(text, year)
        if stamp is not None:
            return stamp - index * SIM_STEP, year
    return None


def _year_of(t: float) -> int:
    return datetime.fromtimestamp(t, tz=timezone.utc).year


class _SummaryLines:
    """The lines of the chunks that hold a torchelastic failure summary (cleaned text).

    A summary runs from ``Failures:`` to its ``=====`` border; a chunk boundary may fall
    anywhere in it, so a chunk where one starts and does not end also takes the next one.
    Only such chunks are split into lines.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._open = False

    def take(self, chunk: bytes) -> None:
        last = max(chunk.rfind(b"Failures:"), chunk.rfind(_SUMMARY_MARK))
        if last < 0 and not self._open:
            return
        begin = 0
        if not self._open:                          # from the line of the first start on
            first = min(i for i in (chunk.find(b"Failures:"), chunk.find(_SUMMARY_MARK)) if i >= 0)
            begin = chunk.rfind(b"\n", 0, first) + 1
        self.lines.extend(fields.clean(raw) for raw in chunk[begin:].split(b"\n"))
        self._open = last >= 0 and chunk.find(b"=====", last) < 0


def _summary_exits(failures: list[SummaryFailure], job: str, at: float) -> list[ProcessExit]:
    """Exit events from torchelastic's summary; a SIGTERM beside a real failure is the agent's stop.

    The exits are placed at ``at`` (after every log line, in summary order): the summary's
    own times have second resolution and another clock than the log lines.
    """
    failures = sorted(failures, key=lambda f: not f.root_cause)
    any_real = any(f.exitcode != -_signal.SIGTERM for f in failures)
    out, seen = [], set()
    for f in failures:
        if f.rank in seen:
            continue
        seen.add(f.rank)
        sig = -f.exitcode if f.exitcode < 0 else None
        origin = Origin(f"rank{f.rank}", f.rank, job, f.host or "replay", "exit", "replay")
        at += SIM_STEP
        out.append(ProcessExit(origin, 0, None if sig else f.exitcode, sig, at,
                               stopped_by_us=bool(any_real and sig == _signal.SIGTERM)))
    return out
