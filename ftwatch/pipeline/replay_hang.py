"""Job hang detection for ``ftwatch replay`` (SPEC R5 on recorded logs), from the lines' timestamps.

Only with ``--enable-job-hang-detection=True`` (Sync): then replay also reads the timestamp of
each line that may carry one (a per-line pass, but only over lines that start with a digit,
``[`` or ``(``, a glog letter and a digit, a month name, a weekday and a month (C's
``ctime``, as nvidia-smi heads its table) or a level word; a rank prefix starts
with ``[`` or a digit). Each instance's output becomes a few *active segments*: runs of
output with no silence of ``job_hang_interval`` or more inside. The instances are those of
``ftwatch replay``: a per-rank file is one; in a combined log each rank prefix is one, and
the lines without a prefix (torchrun's agent, banners) count only when the file has no
prefixed line at all. A parallel shell's host label (pdsh's ``worker-0: ``) or a logger's name before its
level word (Paddle's ``LAUNCH INFO <date>``) may stand before the stamp; the line is the file's own.

A line without a timestamp was written when it happened: between the stamped lines around it. Which
part of that span it fills depends on what it is (issue 12, replay's clock as live ``watch`` sees it):

* a line that reports the work going on (a *progress* line, ``ftwatch.policy.progress.PROGRESS``: a
  step or iteration counter, a tqdm or Lightning bar, an epoch or loss figure; or a server's line
  for a request it answered, ``ftwatch.parsers.silence.REQUEST_LINE``) was written while
  the work went on, anywhere up to the next stamp: its instance counts as writing throughout that
  span (from the stamp before it to the next stamp of its file, or to the end of the input when no
  stamp follows). *k* such lines cut a span into *k + 1* gaps, so a span of *(k + 1)* intervals or
  more held a silence of the interval wherever they lie (they are then read as written with the
  stamp before them). A log whose stamps are rare (a launcher line at the start, a watchdog at the
  end, untimed step prints between) must not look like a hang;
* any other untimed line (NCCL's ``NCCL INFO`` init lines, a banner, a traceback, the rest of a
  multi-line message) was printed with the stamped line before it in its file: an init burst right
  after ``Initializing TorchBackend`` is output at that time, not hours later, so a silence that
  follows it is one, as live watch sees it (lines before a file's first stamp are read with the
  first stamp, as the replay's clock anchors them).

Two lines tell more (``ftwatch.parsers.silence``): a watcher's
stamped report of a silence (``no output ... for 2h11m``) places the untimed lines before it ahead
of the silence it states, and Slurm's ``*** JOB|STEP ... CANCELLED AT <time> ***`` line is dated by
its mid-line stamp (it is no rank's output: it dates the end of the ranks' silence, as a launcher's
shutdown line does).

Some files are no instance's output at all (knowledge round 26): a node's kernel log (host
evidence, ``ftwatch.pipeline.sources.hostlog``: the replay driver never makes it an instance)
and a platform's or scheduler's event stream (``events.log``, ``k8s-events.log``,
``modelarts-events.log``: Kubernetes describes an Event as "a report of an event somewhere in the
cluster", written by the controller that reports it, the kubelet, the scheduler; ModelArts'
and Slurm's event lists are their control planes' likewise). Such a *witness* file's periodic
lines (a health poll every ten minutes, a corrected PCIe error every minute) say nothing about
whether the job writes, so they never keep a silent job "active"; their stamps still show that
the input went on past the ranks' last line, as a launcher's shutdown line does.

The hang is the first moment *T* at which every instance seen so far has been silent for the
interval, also when the silence runs up to a later stamped line that is no instance's output (a
launcher's shutdown line); the end of the input is no hang (the job ended there). With phases (``phases.enabled``,
``ftwatch.pipeline.replay_phases``) the interval is the one of the job's phase when the silence
began (a long checkpoint save or evaluation is judged by its phase's interval, training by the
policy's), and the finding names that phase. The finding is the one that
the live ``HangTracker`` gives (kind ``hang``, rule ``hang.job``, class HANG, action
RESTART_JOB, origin = the instance that went silent first), at *T*: the caller (the replay
hub) hands one in, so this module stays inside the pipeline stage.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from ftwatch.events import Finding, Origin
from ftwatch.parsers import chunks, fields, silence

_MONTHS = b"Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
# C's ctime()/asctime() form opens the line bare ("Thu Dec 31 02:15:38 2020"): nvidia-smi's header,
# Python's time.ctime(), a job script's `date`-style marks; fields.parse_timestamp reads it
_WEEKDAYS = b"Mon|Tue|Wed|Thu|Fri|Sat|Sun"
# fields.split_rank_prefix's prefixes ([rank3]:, [default3]:, mpirun's [1,3]<stdout>:, "3: "), the rank in
# group 1 or 2; mpirun --timestamp-output's ctime before its tag is read as a stamp (its rank: ``_own_or_rank``)
_PREFIX = rb"(?:%s|(\d{1,6}): )" % (fields.RANK_BRACKET % r"(\d{1,7})").encode()
# how a line that may carry a timestamp goes on after its prefixes: a digit, "[" or "(", a glog
# letter and a digit, a month (syslog), a weekday and a month (ctime), a level word (vLLM's
# "INFO 11-13 09:15:02") before an ISO date ("INFO 2026-..."), or Slurm's slurmstepd/srun head (its
# "*** JOB ... CANCELLED AT <time> ***" line, fields.cancel_stamp)
# A parallel shell's host label may lead all of it: pdsh labels each line of a host's output with
# "host: " (pdsh(1): "output ... is prefixed by the hostname"; DeepSpeed's multi-node runner,
# deepspeed/launcher/multinode_runner.py PDSHRunner: "worker-0: [2022-05-17 03:52:02,512] [INFO] ...").
# A logger's name may stand before its level word: Paddle's launcher (python/paddle/distributed/
# launch/context/__init__.py get_logger, "%(name)s %(levelname)s %(asctime)s %(message)s") writes
# "LAUNCH INFO 2023-06-05 10:02:14,221 ...".
_HOST = rb"[A-Za-z][\w.-]{0,63}: (?:[\[(]|\d{4}[-/])"     # a label, then a bracket or a dated stamp
_MAY_STAMP = (rb"[ \t]*(?:[\[(\d]|[IWEF]\d|(?:" + _MONTHS + rb") |(?:" + _WEEKDAYS + rb") (?:" + _MONTHS
              + rb") |(?:[A-Z]{3,8}:? +){1,2}\d|(?:slurmstepd|srun)\S*: |" + _HOST + rb")")
_STAMPED = re.compile(rb"^" + _PREFIX + rb"*" + _MAY_STAMP, re.MULTILINE)        # per-rank files
_ANY_LINE = re.compile(rb"^" + _PREFIX + rb"*(" + _MAY_STAMP + rb")?", re.MULTILINE)  # combined logs
_WEEKDAY_FIRST = (b"M", b"T", b"W", b"F", b"S")   # first letters of a ctime stamp's weekday
_HEAD = 256                 # bytes of a line read: every timestamp format starts well within it
_UNREAD_BYTES = 8 << 20     # untimed text kept unsearched at most (``HangScan._untimed``), a combined
_UNREAD_LINE = 32           # log's line counted as this many bytes (~ what its entry costs in memory)


class Tracker(Protocol):
    """What ``first_hang`` needs of ``ftwatch.rules.timers.HangTracker``."""

    def started(self, origin: Origin, time: float) -> None: ...

    def output(self, instance: str, time: float) -> None: ...

    def set_job_hang_interval(self, seconds: float | None, time: float, phase: str | None = None) -> None: ...

    def check(self, now: float) -> list[Finding]: ...


class Phases(Protocol):
    """What ``HangScan`` needs of ``ftwatch.pipeline.replay_phases.PhaseScan``."""

    shortest: float

    def open(self, year: int | None) -> None: ...

    def take(self, chunk: bytes, base: float) -> None: ...

    def interval_at(self, t: float) -> tuple[float | None, str]: ...


@dataclass
class _Activity:
    """One instance's output: closed active segments and the open one."""

    origin: Origin
    segments: list[tuple[float, float]] = field(default_factory=list)
    start: float | None = None
    end: float = 0.0

    def add(self, t: float, interval: float, bridge: bool, untimed: int = 0) -> None:
        """Output at ``t``; ``bridge``: the instance wrote ``untimed`` lines (of unknown times) up to ``t``.

        ``untimed`` lines in a span of ``t - end`` seconds leave a silence of at least
        ``(t - end) / (untimed + 1)`` somewhere in it (they cut it into ``untimed + 1`` gaps). When
        the span is ``(untimed + 1) * interval`` or longer, a silence of the interval happened in
        it wherever the lines lie, so the span is not bridged: the lines are read as written with
        the stamped line before them (the continuation lines of a multi-line message, a
        traceback, a burst of prints: the common case), the silence from ``end``. A shorter span
        is bridged (the lines may fill it). ``t`` is no output of this instance.
        """
        if self.start is None:
            self.start = self.end = t
        elif bridge and untimed and t - self.end >= (untimed + 1) * interval:
            pass                    # a silence of the interval is certain: not bridged
        elif t - self.end >= interval and not bridge:
            self.segments.append((self.start, self.end))
            self.start = self.end = t
        elif t > self.end:
            self.end = t

    def all(self) -> list[tuple[float, float]]:
        return self.segments + ([(self.start, self.end)] if self.start is not None else [])


class _File:
    """The reading state of one file: its stamps so far and the instances with untimed lines since."""

    def __init__(self, origin: Origin, year: int | None, witness: bool = False) -> None:
        self.origin = origin
        self.year = year
        self.witness = witness      # no instance's output: its stamps only date the input's end
        self.combined = origin.rank is None
        self.pending: Counter[str] = Counter()   # instance -> its untimed lines since the last stamp
        self.spread: Counter[str] = Counter()    # instance -> how many of them are progress lines
        self.unread: list[tuple[str, bytes, int, int]] = []  # untimed lines not yet searched: (instance, chunk, span)
        self.unread_bytes = 0
        self.last: float | None = None           # the file's latest stamp
        self.ranked = False         # a combined log with rank prefixes: its unprefixed lines are no instance
        self.stamps = 0
        self.lines = False


class HangScan:
    """Collects per-instance output times from replayed chunks and finds the first job hang.

    Args:
        interval: the job-hang interval in seconds (> 0).
        job: the job id, for the origins of a combined log's ranks.
        phases: the job's phases (``replay_phases.PhaseScan``), fed the same chunks; their
            intervals judge each silence; None: ``interval`` judges every one.
        progress: what a progress line holds (``ftwatch.policy.progress.PROGRESS``: a step
            counter, a tqdm bar, an epoch or loss figure): an untimed line it matches, or a
            server's request line (``silence.REQUEST_LINE``), was written while the work went
            on, anywhere up to the next stamp; None: no line is one (each untimed line is read
            with the stamp before it).
    """

    def __init__(self, interval: float, job: str, phases: "Phases | None" = None,
                 progress: "re.Pattern[bytes] | None" = None) -> None:
        self.phases = phases
        self.progress = None if progress is None else re.compile(progress.pattern + b"|" + silence.REQUEST_LINE)
        # activity splits at the shortest interval in use: every silence that may be a hang stays visible
        self.interval = min(float(interval), phases.shortest) if phases is not None else float(interval)
        self.job = job
        self._acts: dict[str, _Activity] = {}
        self._origins: dict[str, Origin] = {}
        self._keys: dict[bytes, str] = {}           # a rank prefix's digits -> its instance
        self._file: _File | None = None
        self.untimed: list[str] = []     # files with lines but no timestamp
        self.last: float | None = None   # the latest timestamp seen

    def open(self, origin: Origin, year: int | None, witness: bool = False) -> None:
        """A file starts; ``year`` dates its glog and syslog stamps; ``witness``: the file is no
        instance's output (a kernel log, a platform's event stream): its stamps show only how far
        the input went on (``last``), never that the job wrote."""
        self._file = _File(origin, year, witness)
        if not witness:
            self._origins.setdefault(origin.instance, origin)
        if self.phases is not None:
            self.phases.open(year)

    def take(self, chunk: bytes, base: float = 0.0) -> None:
        """Read the timestamps of one chunk of complete lines of the open file (``base``: the
        replay clock's time of its first line when that has no stamp; for the phases).

        Only lines that may carry a stamp are decoded and parsed (``fields.parse_timestamp``);
        in a combined log every line's rank prefix is read (by one regex), since an untimed
        line is output of its rank too.
        """
        f = self._file
        assert f is not None
        if not chunk:
            return
        if self.phases is not None:
            self.phases.take(chunk, base)
        f.lines = True
        if f.witness:
            self._witness(f, chunk)
            return
        if f.combined:
            self._take_combined(f, chunk)
            return
        pos, own = 0, f.origin.instance
        for m in _STAMPED.finditer(chunk):
            start = m.start()
            if start > pos:                                         # lines between that carry no stamp
                self._untimed(f, own, chunk, pos, start, chunks.newlines(chunk, pos, start))
            pos = self._parse(f, chunk, start, own) + 1
        if pos < len(chunk):
            self._untimed(f, own, chunk, pos, len(chunk), chunks.newlines(chunk, pos) or 1)

    def _witness(self, f: _File, chunk: bytes) -> None:
        """A witness file's chunk: its stamps move ``last`` on, nothing is any instance's output."""
        for m in _STAMPED.finditer(chunk):
            end = self._line_end(chunk, m.start())
            stamp = fields.parse_timestamp(fields.clean(chunk[m.start():min(end, m.start() + _HEAD)]), f.year,
                                           vllm=True)
            if stamp is not None:
                f.stamps += 1
                self.last = stamp if self.last is None else max(self.last, stamp)

    def _untimed(self, f: _File, key: str, chunk: bytes, lo: int, hi: int, lines: int) -> None:
        """``lines`` lines of ``key``, ``chunk[lo:hi]`` (``hi`` -1: the line at ``lo``), carry no stamp:
        counted, and those of them that are progress lines (``progress``) counted apart. They are
        searched only when the span to the next stamp could hold a silence (:meth:`_stamp`): in a
        stamped log most cannot, and the search (~0.1 s per MiB) would be most of the scan's cost
        (up to ``_UNREAD_BYTES`` kept)."""
        f.pending[key] += lines
        if self.progress is None:
            return
        f.unread.append((key, chunk, lo, hi))
        f.unread_bytes += hi - lo if hi >= 0 else _UNREAD_LINE
        if f.unread_bytes > _UNREAD_BYTES:
            self._spread(f)

    def _spread(self, f: _File) -> None:
        """Search the kept untimed lines (:meth:`_untimed`) for progress lines."""
        for key, chunk, lo, hi in f.unread:
            self._search(f, key, chunk, lo, hi)
        self._unread(f)

    @staticmethod
    def _unread(f: _File) -> None:
        f.unread.clear()
        f.unread_bytes = 0

    def _search(self, f: _File, key: str, chunk: bytes, lo: int, hi: int) -> None:
        assert self.progress is not None
        if hi < 0:
            hi = self._line_end(chunk, lo)
        last = -2
        for m in self.progress.finditer(chunk, lo, hi):
            line = chunk.rfind(b"\n", lo, m.start())
            if line != last:
                f.spread[key] += 1
                last = line

    def _take_combined(self, f: _File, chunk: bytes) -> None:
        own, size = f.origin.instance, len(chunk)
        pending, unread = f.pending, (f.unread if self.progress is not None else None)
        for m in _ANY_LINE.finditer(chunk):
            start = m.start()
            if start == size:
                break
            key = own
            if m.end(1) >= 0 or m.end(2) >= 0:
                key = self._rank_key(f, m.group(1) if m.end(1) > m.end(2) else m.group(2))
            elif chunk[start:start + 1] in _WEEKDAY_FIRST and m.start(3) >= 0:
                key = self._own_or_rank(f, chunk, start, own)
            if m.start(3) < 0:              # no stamp can follow: ``_untimed`` of the line, inline
                pending[key] += 1
                if unread is not None:
                    unread.append((key, chunk, start, -1))      # -1: to the line's end
                    f.unread_bytes += _UNREAD_LINE
            else:
                self._parse(f, chunk, start, key)
        if f.unread_bytes > _UNREAD_BYTES:
            self._spread(f)

    @staticmethod
    def _line_end(chunk: bytes, start: int) -> int:
        end = chunk.find(b"\n", start)
        return len(chunk) if end < 0 else end

    def _parse(self, f: _File, chunk: bytes, start: int, key: str) -> int:
        """Parse the line at ``start`` as ``key``'s output; returns where the line ends."""
        end = self._line_end(chunk, start)
        text = fields.clean(chunk[start:min(end, start + _HEAD)])
        stamp = fields.parse_timestamp(text, f.year, vllm=True)     # Slurm's cancel line's too
        if stamp is None:
            self._untimed(f, key, chunk, start, end, 1)
        else:
            self._stamp(f, key, stamp, silence.reported_silence(text) or 0.0)
        return end

    def _own_or_rank(self, f: _File, chunk: bytes, start: int, own: str) -> str:
        """The key of a line that opens with a weekday: its rank's where mpirun's
        ``--timestamp-output`` ctime leads its ``[1,3]<stdout>:`` tag (``fields.rank_prefix_at``),
        else ``own``."""
        rank = fields.rank_prefix_at(chunk, start)[0]
        return own if rank is None else self._rank_key(f, b"%d" % rank)

    def _rank_key(self, f: _File, digits: bytes) -> str:
        key = self._keys.get(digits)
        if key is None:
            rank = int(digits)
            key = self._keys[digits] = f"rank{rank}"
            self._origins.setdefault(key, Origin(key, rank, self.job, "replay", f.origin.stream, "replay"))
        f.ranked = True
        return key

    def close(self) -> None:
        """The open file ended: untimed lines after its last stamp count as output to the end."""
        f = self._file
        assert f is not None
        if f.witness:
            pass                                            # no instance's output, stamped or not
        elif f.lines and not f.stamps:
            self.untimed.append(f.origin.stream)
        elif f.stamps:
            self._spread(f)
            for key, lines in f.pending.items():
                if lines > f.spread[key]:                   # printed with the last stamp
                    self._activity(key, f.last, bridge=False)
                if f.spread[key] and key in self._acts:     # progress went on: to the end
                    self._acts[key].add(math.inf, self.interval, bridge=True)
        if f.ranked:
            self._acts.pop(f.origin.instance, None)
        self._file = None

    def first_hang(self, tracker: Tracker) -> Finding | None:
        """The first job hang of the merged timeline; None if none.

        Args:
            tracker: a fresh ``HangTracker`` with this scan's interval as its job-hang interval;
                it is fed the merged timeline and reports the hang.

        Returns:
            The tracker's ``hang`` finding, at the moment the interval ran out; None when there
            is no hang, or when a file had no timestamp at all (its output cannot be placed).
        """
        if self.untimed:
            return None
        segments = sorted((s, e, key) for key, act in self._acts.items() for s, e in act.all())
        covered: float | None = None
        seen: set[str] = set()
        for start, end, key in segments:
            if covered is not None:
                limit, phase = (self.phases.interval_at(covered) if self.phases is not None
                                else (self.interval, None))
                if limit is not None and start - covered >= limit:
                    if phase is not None:
                        tracker.set_job_hang_interval(limit, covered, phase)
                    return tracker.check(covered + limit)[0]
            if key not in seen:
                seen.add(key)
                # "started" before its first line, so that this line counts as output
                tracker.started(self._acts[key].origin, -math.inf)
            tracker.output(key, start)
            tracker.output(key, end)
            covered = end if covered is None else max(covered, end)
        return self._silent_to_the_last_stamp(tracker, covered)

    def _silent_to_the_last_stamp(self, tracker: Tracker, covered: float | None) -> Finding | None:
        """The hang of a job whose instances all fell silent while the log's clock went on.

        A stamped line that is no instance's output (the launcher's unprefixed lines in a
        combined log with rank prefixes, e.g. torchrun's ``Received Signals.SIGINT death signal``
        hours later) proves the input did not end where the ranks' output did: a live monitor
        saw that silence and reported the hang at ``covered + interval``, before whatever the
        stamped line says (a person's Ctrl-C, a scheduler's SIGTERM, issue 12). The end of the
        input itself is still no hang.
        """
        if covered is None or self.last is None or not math.isfinite(covered):
            return None
        limit, phase = (self.phases.interval_at(covered) if self.phases is not None
                        else (self.interval, None))
        if limit is None or self.last - covered < limit:
            return None
        if phase is not None:
            tracker.set_job_hang_interval(limit, covered, phase)
        return tracker.check(covered + limit)[0]

    def _stamp(self, f: _File, key: str, t: float, silent: float = 0.0) -> None:
        """``key`` wrote at ``t``; ``silent``: seconds before ``t`` in which, as the line itself
        reports (a watcher's ``no output ... for 2h11m``, ``parsers.silence``), nothing was written."""
        f.stamps += 1
        self.last = t if self.last is None else max(self.last, t)
        # before the file's first stamp, or in a span shorter than the interval (no silence lies in
        # it), the lines are bridged up to now (or to the reported silence), unread
        bridged = f.last is None or t - silent - f.last < self.interval
        if bridged:
            self._unread(f)
        else:
            self._spread(f)
        for other, lines in f.pending.items():  # untimed lines since the last stamp
            spread = f.spread[other]
            if bridged:
                self._activity(other, t - silent, bridge=True, untimed=lines)
                continue
            if lines > spread:
                self._activity(other, f.last, bridge=False)     # printed with the stamp before them
            if spread:                                          # written while the work went on
                self._activity(other, t - silent, bridge=True, untimed=spread)
        f.pending.clear()
        f.spread.clear()
        f.last = t if f.last is None else max(f.last, t)
        self._activity(key, t, bridge=False)

    def _activity(self, key: str, t: float, bridge: bool, untimed: int = 0) -> None:
        act = self._acts.get(key)
        if act is None:
            act = self._acts[key] = _Activity(self._origins[key])
        act.add(t, self.interval, bridge, untimed)
