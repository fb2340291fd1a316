"""torchelastic's failure summary (P3): which rank failed, with what exit code or signal.

torchrun prints it when a worker group fails (``torch/distributed/elastic/multiprocessing/errors``)::

    Failures:
    [1]:
      time      : 2026-11-21_09:36:04
      host      : node-a
      rank      : 2 (local_rank: 2)
      exitcode  : -15 (pid: 4121)
      ...
    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-21_09:36:03
      host      : node-a
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 4120)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 4120

``ftwatch replay`` and ``ftwatch watch`` take the job's exit codes from it (through
``ftwatch.pipeline.incidents``): the summary only restates failures (its own lines are fallout),
but its exit codes are facts. :class:`SummaryLines` gathers a summary's lines from chunks of a
stream, :func:`summary_exits` turns its failures into exits.
"""

from __future__ import annotations

import bisect
import calendar
import itertools
import re
import signal as _signal
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, Sequence

from ftwatch.events import Origin, ProcessExit
from ftwatch.parsers.fields import clean, split_rank_prefix

try:  # as in ftwatch.rules.matcher: hyperscan wheels exist for x86_64 only
    import hyperscan as _hs
except ImportError:  # pragma: no cover - depends on the platform
    _hs = None

_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)$")
_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_RANK = re.compile(r"^(\d+)")
_EXIT = re.compile(r"^(-?\d+)")
_ROOT = "Root Cause (first observed failure)"
_STARTS = (b"Failures:", _ROOT.encode())
MAX_SUMMARY_LINES = 2000    # a summary that never closes is read after this many lines


@dataclass(frozen=True, slots=True)
class SummaryFailure:
    """One failure listed in the summary.

    Attributes:
        rank: global rank.
        exitcode: the process's exit code; negative means killed by signal ``-exitcode``.
        host: the node it ran on.
        time: epoch seconds (the summary's local time read as UTC), or None.
        root_cause: True for the "Root Cause (first observed failure)" entry.
    """

    rank: int
    exitcode: int
    host: str
    time: float | None
    root_cause: bool


def parse_summary(lines: Iterable[str]) -> list[SummaryFailure]:
    """Every failure entry of every torchelastic summary in ``lines`` (cleaned text lines).

    Lines that are not part of a summary are skipped; a partial entry without rank or
    exitcode is dropped. A launcher's label before a line (``srun --label``'s ``0: ``, a
    ``[default0]:`` prefix) is removed first. Never raises on odd input.
    """
    out: list[SummaryFailure] = []
    in_summary = root = False
    entry: dict[str, str] | None = None

    def close() -> None:
        if entry and "rank" in entry and "exitcode" in entry:
            rank = _RANK.match(entry["rank"])
            code = _EXIT.match(entry["exitcode"])
            if rank and code:
                out.append(SummaryFailure(int(rank.group(1)), int(code.group(1)),
                                          entry.get("host", ""), _time(entry.get("time", "")), root))

    for line in lines:
        if not in_summary and "Failures:" not in line and _ROOT not in line:
            continue                                # the bulk of a log: one substring test
        line = split_rank_prefix(line)[1]
        text = line.strip()
        if text.startswith("Failures:") or text.startswith(_ROOT):
            close()
            entry = None
            in_summary = True
            root = text.startswith("Root Cause")
            continue
        if not in_summary:
            continue
        if _ENTRY.match(text):
            close()
            entry = {}
            continue
        field = _FIELD.match(line)
        if field and entry is not None:
            entry[field.group(1)] = field.group(2).strip()
        elif text.startswith("====="):
            close()
            entry = None
            in_summary = False
    close()
    return out


#: torchelastic's ``time`` field as it writes it (``%Y-%m-%d_%H:%M:%S``, ASCII digits, zero-padded)
_STAMP = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})_([0-9]{2}):([0-9]{2}):([0-9]{2})")


def _time(text: str) -> float | None:
    """Epoch seconds of a summary's ``time`` field read as UTC, None when it is no valid time. The
    zero-padded form torchelastic writes is read by one match and ``calendar.timegm`` (the same value,
    the same None for an impossible date, as ``strptime``: issue 16, ~10 us a failure in replay);
    any other text (unpadded fields, other digits) as before, by ``strptime``."""
    text = text.strip()
    m = _STAMP.fullmatch(text)
    if m is not None:
        return _utc(*map(int, m.groups()))
    try:
        return datetime.strptime(text, "%Y-%m-%d_%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _utc(*fields: int) -> float | None:
    """Epoch seconds of UTC (year, month, day, hour, minute, second), None when impossible."""
    try:
        datetime(*fields)                           # validates (Feb 30, second 60: ValueError)
    except ValueError:
        return None
    return float(calendar.timegm(fields + (0, 0, 0)))


class SummaryLines:
    """The lines of one stream's torchelastic failure summaries, gathered from its chunks.

    A summary runs from ``Failures:`` (or ``Root Cause (first observed failure)``) to its
    ``=====`` border; a chunk boundary may fall anywhere in it. Only the summaries' own lines
    are split and cleaned (from a start's line to the end of the border's line); the lines
    between them, and every chunk without a start or an open summary, cost a few substring
    searches. A summary that never closes is cut after ``MAX_SUMMARY_LINES`` lines.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._open = False
        self._count = 0          # lines taken of the summary still open

    def take(self, chunk: bytes) -> bool:
        """Read one chunk of complete lines; True when a summary closed in it (its failures are
        then ready: :meth:`failures`).

        Each start is searched for again only after ``pos`` passed its last offset: searching
        every start from each summary's end rescanned the chunk to its end for a start it
        lacked (issue 16: ~0.04 s of bytes.find in a 1.2 s profiled replay at 10,000 rules).
        Where hyperscan is installed, a chunk's starts are listed by one scan instead
        (:func:`start_offsets`) and the next one found by bisection."""
        took, pos, size = False, 0, len(chunk)
        nxt = [-2] * len(_STARTS)                   # each start's first offset >= pos; -1: none left
        starts: list[int] | None = None             # every start's offset (:func:`start_offsets`)
        listed = False                              # (scanned for once a start is looked for)
        while pos < size:
            if not self._open:                      # the next start, from its line on
                if not listed:
                    starts, listed = start_offsets(chunk), True
                if starts is not None:
                    k = bisect.bisect_left(starts, pos)
                    found = starts[k:k + 1]
                else:
                    for k, s in enumerate(_STARTS):     # searched again only once pos passed it
                        if -1 < nxt[k] < pos or nxt[k] == -2:
                            nxt[k] = chunk.find(s, pos)
                    found = [i for i in nxt if i >= 0]
                if not found:
                    break
                pos = max(pos, chunk.rfind(b"\n", pos, min(found)) + 1)
                self._open, self._count = True, 0
            border = chunk.find(b"=====", pos)
            end = size if border < 0 else chunk.find(b"\n", border) + 1 or size
            part = chunk[pos:end].split(b"\n")
            if chunk.endswith(b"\n", pos, end):
                part.pop()                          # nothing after the span's last newline
            room = MAX_SUMMARY_LINES + 1 - self._count
            self.lines.extend(clean(raw) for raw in part[:room])
            self._count += min(len(part), room)
            took = True
            if border >= 0 or self._count > MAX_SUMMARY_LINES:
                self._open = False
            pos = end
        return took and not self._open              # the chunk's last summary closed in it

    @property
    def pending(self) -> bool:
        """True while it holds lines not handed out by :meth:`failures`."""
        return bool(self.lines)

    def failures(self) -> list[SummaryFailure]:
        """The failures of every summary read so far (an unclosed one too); forgets them."""
        lines, self.lines, self._open, self._count = self.lines, [], False, 0
        return parse_summary(lines)


def summary_exits(failures: Iterable[SummaryFailure], origin_of: Callable[[SummaryFailure], Origin],
                  at: float, step: float = 0.0) -> list[ProcessExit]:
    """The exits a torchelastic summary reports, root cause first, one per rank.

    A SIGTERM beside a real failure is the agent stopping the survivors: that exit is
    ``stopped_by_us`` (it makes no finding), as when ftwatch stops the survivors itself.

    Args:
        failures: from :func:`parse_summary` / :meth:`SummaryLines.failures`.
        origin_of: the origin of a failure's exit (the reader knows how its instances are named).
        at: epoch seconds of the first exit; the summary's own times have second resolution and
            another clock than the log lines.
        step: seconds between consecutive exits (keeps them in summary order).

    Returns:
        ProcessExits with pid 0, the exit code or the signal (a negative exitcode).
    """
    failures = sorted(failures, key=lambda f: not f.root_cause)
    real = any(f.exitcode != -_signal.SIGTERM for f in failures)
    out: list[ProcessExit] = []
    seen: set[int] = set()
    for f in failures:
        if f.rank in seen:
            continue
        seen.add(f.rank)
        sig = -f.exitcode if f.exitcode < 0 else None
        out.append(ProcessExit(origin_of(f), 0, None if sig else f.exitcode, sig, at,
                               stopped_by_us=bool(real and sig == _signal.SIGTERM)))
        at += step
    return out


CLEAN_FINISH = b"worker group successfully finished"
"""What a torchelastic agent logs (INFO, ``LOGLEVEL=INFO``) once every worker of its group
exited 0: ``[default] worker group successfully finished. Waiting 300 seconds for other agents
to finish.`` (``torch/distributed/elastic/agent/server/api.py``, ``SimpleElasticAgent._invoke_run``;
torch 2.x)."""


_STARTS_DB: list = []                              # the hyperscan database of :data:`_STARTS`, once built
_SCRATCH = threading.local()


def start_offsets(chunk: bytes) -> list[int] | None:
    """The offsets where :data:`_STARTS` occur in ``chunk``, sorted, from one hyperscan scan (a
    summary's start found by bisection: two ``bytes.find`` passes over each gap between summaries
    cost ~0.8 ms a MiB, the scan ~0.13 ms, issue 16); None without hyperscan or for a small chunk
    (there the searches cost less than the scan's call). The last chunk's answer is kept (per
    thread): :func:`may_hold_summary` and then :meth:`SummaryLines.take` of the same chunk scan once."""
    if _hs is None or len(chunk) < 4096:
        return None
    last = getattr(_SCRATCH, "last", None)
    if last is not None and last[0] is chunk:
        return last[1]
    if not _STARTS_DB:
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        db.compile(expressions=[re.escape(s) for s in _STARTS], ids=list(range(len(_STARTS))),
                   flags=[_hs.HS_FLAG_SOM_LEFTMOST] * len(_STARTS))
        _STARTS_DB.append(db)
    db = _STARTS_DB[0]
    scratch = getattr(_SCRATCH, "scratch", None)
    if scratch is None:
        scratch = _SCRATCH.scratch = _hs.Scratch(db)
    found: list[int] = []
    db.scan(chunk, match_event_handler=lambda _id, start, _end, _flags, _ctx: found.append(start), scratch=scratch)
    starts = sorted(set(found))
    _SCRATCH.last = (chunk, starts)
    return starts


def may_hold_summary(data: bytes) -> bool:
    """True when ``data`` may start a failure summary (it holds a start line's words): a stream
    with no summary under way needs no :class:`SummaryLines` for a chunk without them. One scan
    (:func:`start_offsets`, kept for the chunk's :meth:`SummaryLines.take`) where it lists them,
    else a search per start."""
    starts = start_offsets(data)
    return any(s in data for s in _STARTS) if starts is None else bool(starts)


def holding_summary(chunks: Sequence[bytes]) -> set[int]:
    """The indexes of the chunks for which :func:`may_hold_summary` is true, found by searching
    them joined (``watch``: a job's chunks of one batch, one per pod, hundreds of them) and
    confirming each chunk a start's words fell in, instead of searching every chunk."""
    joined = b"".join(chunks)
    found = []
    for start in _STARTS:
        at = joined.find(start)
        while at >= 0:
            found.append(at)
            at = joined.find(start, at + 1)
    if not found:
        return set()
    ends = list(itertools.accumulate(map(len, chunks)))
    candidates = {bisect.bisect_right(ends, at) for at in found}
    return {k for k in candidates if may_hold_summary(chunks[k])}


AGENT_STARTS = (b"starting workers for entrypoint", b"Rendezvous'ing worker group")
"""What a torchelastic agent logs (INFO) as it starts: ``[default] starting workers for entrypoint:
python`` once as its run begins, ``[default] Rendezvous'ing worker group`` before every start of
its workers (``torch/distributed/elastic/agent/server/api.py``, ``SimpleElasticAgent._invoke_run``
and ``_initialize_workers``; torch 1.9 to 2.x). An agent that logged :data:`CLEAN_FINISH` has
returned, so either line later in that pod's output is a new agent: the job runs again."""


def agent_start_at(data: bytes, after: int = 0) -> int:
    """Where, in a chunk of a launcher's output, the first line from offset ``after`` (a line's
    start) saying a torchelastic agent starts its worker group (:data:`AGENT_STARTS`) starts;
    -1: none does."""
    found = [at for at in (data.find(start, after) for start in AGENT_STARTS) if at >= 0]
    if not found:
        return -1
    newline = data.rfind(b"\n", after, min(found))
    return after if newline < 0 else newline + 1


def finish_end(data: bytes) -> int:
    """Where the line after a chunk's first :data:`CLEAN_FINISH` line starts (``len(data)``: it
    is the last line); -1: the chunk holds none."""
    at = data.find(CLEAN_FINISH)
    if at < 0:
        return -1
    end = data.find(b"\n", at)
    return len(data) if end < 0 else end + 1


def finished_cleanly(data: bytes) -> bool:
    """True when a chunk of a launcher's output says its worker group finished successfully
    (:data:`CLEAN_FINISH`); the only sign of a clean end that shipped logs carry."""
    return CLEAN_FINISH in data
