"""``ftwatch replay``: recorded logs through the incident core, with a simulated clock (T3).

Each file is one instance's log (its rank read from the file name, e.g. ``rank3.log`` or
``worker-3.err``), a node's kernel log (``kern.log``: host evidence, never an instance) or one
combined log whose lines carry rank prefixes (``[rank3]:``,
torchrun's ``[default3]:`` / ``3:``). Files are read in 1 MiB chunks (up to 4 MiB where a file
holds thousands of ranks' step lines: ``Engine.chunk_bytes``) cut at line ends and fed,
one file after the other, to one :class:`ftwatch.pipeline.incidents.IncidentDesk` (the core
``run`` and ``watch`` decide through; errors open incidents, as in ``watch``); each chunk is
scanned whole (no per-line Python work on lines that do not hit a rule); a traceback or a
torchelastic summary cut by a chunk boundary is joined, and a line longer than a chunk is read
whole up to ``sources.process.MAX_LINE`` (8 MiB); as ``run``'s readers do, a longer one is handed
over in pieces of that size, each with a newline added, and a chunk with no newline at all (a
progress bar's redraws written to a file: ``\r`` and no ``\n`` until the bar closes) is handed over
at its last bare ``\r``, so memory stays bounded whatever the file holds. Findings and the
decision go through the Recorder (the CLI's prints nothing; tests hand in one with capture doubles
and check the alerts).

Time: a line with a timestamp is at its own time. A line without one is at the time of the last
timestamped line before it in the same file, plus ``SIM_STEP`` seconds per line between them
(which keeps a file's lines in order); lines before the file's first timestamp count from the
file's anchor: the first real timestamp among its first ``ANCHOR_LINES`` lines, moved back
``SIM_STEP`` per line (see ``anchor``), or, for a file with none there, the earliest anchor of
the other files, or ``SIM_START``. So a ``what(): CUDA error`` printed after a stamped ``NVRM:
Xid 79`` line counts as later than it. Only hit lines look back for their stamp (``Engine.feed``'s
``sim_step``), and the stamp is carried from chunk to chunk. The anchor's year is the engine's
year for stamps that carry none (glog, syslog). With job hang detection on (R5, opt-in), the
lines' timestamps also place each instance's output on a merged timeline, where a silence of
every instance for the interval is a job hang (see ``replay_hang``; a kernel log or a platform's
event stream is no instance there, only a witness of how far the input went, ``is_witness``); with ``phases`` the
interval is that of the phase the lines tell (``replay_phases``), as in ``run`` and ``watch``.
The end of the input is the end of the job: exit codes come from a torchelastic failure summary when present (placed after
every line); the desk's open incident, if any, is decided then, else the job succeeded.
"""

from __future__ import annotations

import contextlib
import gc
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ftwatch.config.phases import PhasesConfig
from ftwatch.events import Decision, Finding, Origin
from ftwatch.parsers import chunks, fields
from ftwatch.parsers.torchelastic import SummaryFailure
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.replay_hang import HangScan
from ftwatch.pipeline.replay_phases import PhaseScan
from ftwatch.pipeline.sources.hostlog import host_origin, is_host, is_host_file
from ftwatch.pipeline.sources.phases import PhaseTracker
from ftwatch.pipeline.sources.process import MAX_LINE
from ftwatch.policy.policy import Policy
from ftwatch.policy.progress import PROGRESS
from ftwatch.rules.engine import Engine
from ftwatch.rules.timers import HangTracker

CHUNK_BYTES = 1 << 20
#: the longest chunk: where a file holds thousands of ranks' step lines, a chunk is as long as the
#: step tap needs to find a few of each rank's (``Engine.chunk_bytes``), up to this (issue 16)
MAX_CHUNK_BYTES = 4 << 20
SIM_STEP = 0.001            # simulated seconds per line without a timestamp
SIM_START = 1_795_219_200.0  # 2026-11-21T00:00:00Z: the simulated clock's origin without an anchor
ANCHOR_LINES = 200          # lines at the head of a file searched for the clock's anchor
ANCHOR_BYTES = 64 << 10     # bytes at the head of a file searched for it
_ANCHOR_CHARS = 256         # of each line: every timestamp format starts well within it
#: young tracked objects alive before the collector's youngest pass during a replay (CPython's
#: default: 700). A MiB chunk of thousands of ranks' step lines holds ~20,000 tracked objects
#: while it is read (each step line's hit and groups, each rank's last step), so at 700 the
#: collector ran dozens of passes a chunk, each finding nothing to free: 0.2-0.35 s of a 4,096-rank
#: failure log's ~2 s replay, 0.73-0.76 s of an 8,192-rank one's ~4 s; at this bound 0.01-0.06 s (issue 16)
REPLAY_GC_THRESHOLD = 50_000
#: a rank in a log file's name; ``workerlog.N`` is the file Paddle's launcher writes for local worker N
#: (paddle/distributed/utils/launch_utils.py and fleet/launch_utils.py: ``open("%s/workerlog.%d" % (log_dir, idx))``)
_RANK_IN_NAME = re.compile(r"(?:rank|worker(?:log)?|default|node)[-_.]?(\d+)", re.IGNORECASE)
#: a platform's or scheduler's event stream saved beside the job's logs (``events.log``, ``events.txt``,
#: ``k8s-events.log``, ``modelarts-events.log``, ``slurmctld-events.log``): the control plane's records
#: about the job (a Kubernetes Event is "a report of an event somewhere in the cluster", written by the
#: controller that reports it), no instance's output: a witness of the job hang scan (``replay_hang``)
_EVENT_STREAM = re.compile(r"(?:.*[-_.])?events?\.(?:log|txt)", re.IGNORECASE)


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
    """The origin of a file: a node's kernel log side file (``kern.log``, ``dmesg.txt``: host
    evidence of the job's node, ``ftwatch.pipeline.sources.hostlog``, as ``watch`` and ``run``
    hand their host lines in); else its rank from the name when it has one, else a combined log."""
    if is_host_file(path):
        return host_origin("replay", job, str(path))
    match = _RANK_IN_NAME.search(path.name)
    if match:
        rank = int(match.group(1))
        return Origin(f"rank{rank}", rank, job, "replay", str(path), "replay")
    return Origin(path.stem, None, job, "replay", str(path), "replay")


def is_witness(path: Path, origin: Origin) -> bool:
    """True for a file that is no instance's output, for the job hang scan: a node's kernel log
    (host evidence) or a platform's or scheduler's event stream (``_EVENT_STREAM``)."""
    return is_host(origin) or _EVENT_STREAM.fullmatch(path.name) is not None


def exit_origin(origin: Origin, failure: SummaryFailure) -> Origin:
    """The origin of an exit a replayed summary reports: rank *r* is instance ``rank<r>`` on the
    summary's host, whatever file the summary was in."""
    return Origin(f"rank{failure.rank}", failure.rank, origin.job, failure.host or "replay", "exit", "replay")


def replay(paths: Sequence[Path], engine: Engine, policy: Policy, job: str = "replay",
           progress: Callable[[int], None] | None = None, recorder: Recorder | None = None,
           phases: PhasesConfig | None = None) -> ReplayResult:
    """Run recorded logs through ``engine`` and ``policy``.

    Args:
        paths: log files (see module docstring).
        engine: the rule engine (``ftwatch.pipeline.build.build_engine``).
        policy: the job's policy (``ftwatch.pipeline.build.build_policy``).
        job: the job id.
        progress: called with the number of bytes read after each chunk (a progress bar).
        recorder: where findings, output counts and the decision go (alerts included when it
            has a dispatcher); default: one that keeps nothing but its ``decisions``.
        phases: the ``phases`` section: with ``enabled``, job hangs are judged by the phase
            the lines tell (``ftwatch.pipeline.replay_phases``).

    Returns:
        The findings, the final decision and the volume read.

    Raises:
        OSError: a file cannot be read.
    """
    with _older_objects_left_alone(), _young_passes_fewer():
        return _replay(paths, engine, policy, job, progress, recorder, phases)


@contextlib.contextmanager
def _older_objects_left_alone():
    """The objects alive before a replay (config, rules, the compiled engine, the policy) kept out
    of the collector's scans for its length (``gc.freeze``, undone after; not where someone else
    froze): a replay of thousands of ranks makes enough objects to trigger full collections, and
    each rescanned them all (a fifth of a 4,096-rank failure log's replay, issue 16)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _young_passes_fewer():
    """The collector's youngest threshold raised to at least ``REPLAY_GC_THRESHOLD`` for a
    replay's length, and put back after (a higher one, as ``watch`` sets, is left as it is)."""
    before = gc.get_threshold()
    if before[0] >= REPLAY_GC_THRESHOLD or before[0] == 0:     # 0: the collector is off
        yield
        return
    gc.set_threshold(REPLAY_GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _replay(paths: Sequence[Path], engine: Engine, policy: Policy, job: str,
            progress: Callable[[int], None] | None, recorder: Recorder | None,
            phases: PhasesConfig | None) -> ReplayResult:
    recorder = recorder or Recorder(out=io.StringIO(), resolve_after=None)
    desk = IncidentDesk(job, engine, policy, recorder, exits=False, summaries="close", exit_origin=exit_origin)
    total = 0
    own_year = engine.year
    heads = [_head_texts(Path(path)) for path in paths]
    carried = [year for year in map(_carried_year, heads) if year is not None]
    default_year = own_year or min(carried, default=fields.year_of(SIM_START))
    anchors = [_anchor(texts, default_year) for texts in heads]
    fallback = min((a for a in anchors if a is not None), default=(SIM_START, own_year))
    ends = [fallback[0]]                    # each file's clock at its end
    interval = HangTracker.from_policy(policy.policy, exits=False).job_hang_interval
    scan = None
    if interval:                                                # phase hook (issue 13 item 4)
        tracker = PhaseTracker(phases, interval) if phases is not None and phases.enabled else None
        scan = HangScan(interval, job, PhaseScan(tracker, SIM_STEP) if tracker is not None else None,
                        progress=PROGRESS)
    try:
        for path, found in zip(paths, anchors):
            origin = origin_for(Path(path), job)
            base, engine.year = found or fallback
            if scan is not None:
                scan.open(origin, engine.year or default_year, witness=is_witness(Path(path), origin))
            size, end = _replay_file(Path(path), origin, desk, base, progress, scan)
            total += size
            ends.append(end)
    finally:
        engine.year = own_year
    hang, notes = _job_hang(scan, policy)
    if hang is not None:
        desk.add([hang])
        ends.append(scan.last)
    end = max([f.time for f in desk.findings] + ends)
    decision = desk.close(end, step=SIM_STEP) or policy.finished(end, ok=True)
    recorder.decision(decision)
    return ReplayResult(list(desk.findings), decision, engine.stats.lines, total, notes)


def _job_hang(scan: HangScan | None, policy: Policy) -> tuple[Finding | None, list[str]]:
    """The job hang ``scan`` found, and notes on what it could not read."""
    if scan is None:
        return None, []
    if scan.untimed:
        return None, [f"job hang detection needs timestamps: no line of {', '.join(scan.untimed)} has one, "
                      "so no job hang was looked for"]
    return scan.first_hang(HangTracker.from_policy(policy.policy, exits=False)), []


def _replay_file(path: Path, origin: Origin, desk: IncidentDesk, base: float,
                 progress: Callable[[int], None] | None, scan: HangScan | None = None) -> tuple[int, float]:
    """Feed one file to ``desk`` in chunks, its clock starting at ``base``.

    A chunk is ``CHUNK_BYTES`` long, or, where the step tap needs longer ones to find a few step
    lines of each of the file's ranks (thousands of ranks), that long, up to ``MAX_CHUNK_BYTES``:
    its work once per rank and chunk is then shared by a few lines of each rank (issue 16).

    Each chunk's time is that of its first line when it has no timestamp: the last stamp before
    it plus ``SIM_STEP`` per line since (``_next_base``). Gives each chunk to ``scan``, opened for
    this file, when hang detection is on; returns (bytes read, the clock at the end).
    """
    total = 0
    engine = desk.engine
    year = engine.year or fields.year_of(base)
    with open(path, "rb") as fh:
        parts: list[bytes] = []         # a line longer than a chunk, read so far ...
        held = 0                        # ... and its bytes
        while True:
            block = fh.read(min(MAX_CHUNK_BYTES, max(CHUNK_BYTES, engine.chunk_bytes(origin))))
            if not block:
                break
            cut = block.rfind(b"\n") + 1
            if cut == 0:                # no newline in a whole chunk: a bar's redraws end at a bare \r
                cut = block.rfind(b"\r", 0, len(block) - 1) + 1     # (not the last byte: "\r\n" cut)
            added = 0
            if cut == 0:
                parts.append(block)
                held += len(block)
                if held < MAX_LINE:
                    continue
                chunk, parts, held, added = b"".join(parts) + b"\n", [], 0, 1    # with a newline added
            else:
                chunk = b"".join([*parts, memoryview(block)[:cut]]) if parts else block[:cut]   # one copy
                parts = [block[cut:]] if cut < len(block) else []
                held = len(block) - cut
            block = b""                 # the chunk is its copy: not both kept while the chunk is read
            desk.output(origin, chunk, base, sim_step=SIM_STEP)
            if scan is not None:
                scan.take(chunk, base)
            base = _next_base(chunk, base, year)
            total += len(chunk) - added
            if progress:
                progress(len(chunk) - added)
        carry = b"".join(parts)
        desk.output(origin, carry, base, final=True, sim_step=SIM_STEP)
        if scan is not None:
            scan.take(carry, base)
            scan.close()
        total += len(carry)
        if progress and carry:
            progress(len(carry))
    return total, base


def _next_base(chunk: bytes, base: float, year: int) -> float:
    """The time of the line after ``chunk`` when it carries no timestamp: the chunk's last
    timestamped line plus ``SIM_STEP`` per line since it, else ``base`` plus the chunk's lines."""
    found = chunks.last_timestamp(chunk, 0, len(chunk), year)
    if found is None:
        return base + chunks.newlines(chunk) * SIM_STEP
    return found[1] + chunks.newlines(chunk, found[0]) * SIM_STEP


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
    return _anchor(_head_texts(path), year)


def _head_texts(path: Path) -> list[str]:
    """The first ``ANCHOR_LINES`` lines of a file's first ``ANCHOR_BYTES`` (their first 256
    characters), cleaned: where :func:`anchor` looks. Raises OSError."""
    with open(path, "rb") as fh:
        head = fh.read(ANCHOR_BYTES)
    if len(head) == ANCHOR_BYTES:
        head = head[: head.rfind(b"\n") + 1] or head      # not a line cut off by the read
    raws = head.split(b"\n", ANCHOR_LINES)[:ANCHOR_LINES]
    return [fields.clean(raw[:_ANCHOR_CHARS]) for raw in raws]


def _carried_year(texts: list[str]) -> int | None:
    """The year of the first stamp among ``texts`` that carries one (ISO, dmesg -T, plog), else None.

    A replay's files were written in one job's time: a file whose stamps carry no year (RFC 3164
    syslog's ``Mmm dd hh:mm:ss``, as a node's ``kern.log`` and journalctl's short format write it;
    glog's ``MMDD``) is read in the year its sibling files carry, as ``watch`` reads those lines
    live, in the year they are written, not in the simulated clock's."""
    for text in texts:
        stamp = fields.parse_timestamp(text, None)
        if stamp is not None:
            return fields.year_of(stamp)
    return None


def _anchor(texts: list[str], year: int) -> tuple[float, int] | None:
    """:func:`anchor` over a file's head lines (:func:`_head_texts`)."""
    year = _carried_year(texts) or year
    for index, text in enumerate(texts):
        stamp = fields.parse_timestamp(text, year)
        if stamp is not None:
            return stamp - index * SIM_STEP, year
    return None

