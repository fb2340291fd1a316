"""Whether the job outlived an error: its progress lines after it (issue 12 item 3).

An error-looking line does not always end the process that prints it. A client that catches an
exception and logs its traceback (``logging.exception``, ``traceback.print_exc()``) and goes on,
a connection error that is retried, a warning-level NCCL / c10d line: the job keeps making
progress afterwards, and such a finding is a notice, not an incident. Python prints a traceback
for an exception that ends the program only as the program ends (``sys.excepthook`` runs at
exit, docs.python.org/3/library/sys.html#sys.excepthook), so a process that prints its own
step lines after a traceback it caught was not ended by it. A traceback that unwound the main
program (``ftwatch.policy.catchsite.ended_program``) is the one that cannot be followed: step
lines after it were written before it (standard output flushed at exit, or read apart from
standard error), so it never waits here (``triggers.may_survive``).

What counts as progress (:data:`PATTERNS`): the step lines the straggler tap reads
(``ftwatch.config.health.STEP_PATTERNS``: Megatron's ``iteration N/M``, DeepSpeed's ``step=N``,
tqdm and Lightning bars, ``step N``) and epoch, iteration and loss counters as trainers print
them: Keras ``Epoch 3/10`` (keras callbacks ProgbarLogger), Lightning ``Epoch 0:``, MMEngine
``Epoch(train) [1][50/500]`` / ``Iter(train) [100/1000]``, Detectron2 ``iter: 19 total_loss:``,
fairseq ``epoch 001 | loss 4.5``, the HF Trainer's ``{'loss': 0.12, ..., 'epoch': 0.5}``.
A line that also speaks of an error, exception, failure, timeout or abort is no progress.

Python says so itself for an exception it could not raise (``sys.unraisablehook``: "Exception
ignored in: <object>" and then the traceback, docs.python.org/3/library/sys.html#sys.unraisablehook;
rule ``python.exception_ignored``) and for one that ended a thread, not the process
(``threading.excepthook``: "Exception in thread <name>:" and then the traceback,
docs.python.org/3/library/threading.html#threading.excepthook; rule ``python.thread_exception``):
that traceback is a notice at once (:func:`ignored`). A thread's report may be a chain (CPython
prints the header once, then each cause and, last, the exception that left ``run()``); the engine
reads each link apart, so a link whose first frame is the thread's entry, right after a link of the
same report, is a notice too (:func:`thread_link`).

The program's own "training finished" line (``lifecycle.finished_by_program``: HF Trainer,
Lightning, Megatron and the other trainers of ``rules/packs/lifecycle.yaml``) after an error outlives it at once (:meth:`Survival.finished`): the training
loop returned after the error, which an exception that ended the program cannot allow. In a
synchronous job (SPEC D1 Sync: data-parallel ranks all-reduce every step) the line outlives every
rank's errors, not only its printer's: most trainers log on rank 0 alone, and rank 0 could not
finish the steps after another rank's error without that rank taking part (Megatron's line even
follows a barrier, ``print_datetime``).

The program's end (:meth:`Survival.program_ended`): once an instance printed a traceback that
unwound its main program, a progress line of that instance dated after the traceback outlives
none of its errors from before it: they stop waiting and stand (and one read later never
waits). The lines of that process read after the traceback were written before it (see above),
and where they fell among its earlier errors the two streams, read apart, do not say. Progress
dated before the traceback (a log read whole, in the order it was written) reads as before.
Recorded on an H200 (``tests/golden/gpu_nccl_init_oom``): NCCL's ``Cuda failure 2 'out of
memory'`` on standard output, stamped before the traceback it caused, came after it with the
step lines printed before both, and those read as progress that outlived the out-of-memory
error; ``ftwatch run`` restarted the job twice where ``replay`` of the same log failed it.

The same traceback again (:meth:`Survival.repeat`): one its instance already outlived, caught at
the same frame (``ftwatch.policy.catchsite``), is a notice at once, not a new wait.

The reading (:class:`Survival`): an error of one instance (rank) is outlived when that same
instance prints :data:`MARKS` progress lines after it within :data:`SURVIVE_SECONDS`, its counters
going on from where they were: a counter (step, iteration, epoch) lower after the error than
before it says the process started over (a restart), which does not outlive the error (a step or
iteration count that restarts with a new epoch is no restart: :func:`went_back`). Two lines,
not one: in synchronous training a rank whose peer died may still finish the step it was in, but
it cannot start and finish another (the next collective waits for the dead peer). The window
bounds how long an error waits: past it, the error stands as it did before.

Why one module of ~690 lines: reading a chunk's marks (:func:`marks`, :class:`Clock`) and judging
them (:class:`Survival`) share one contract, the per-rank counters held back before every waiting
error and read only at their last line (p16r; ``DEFER_BEFORE``), which is what keeps replay's cost
per line low; split apart, that contract would have to cross a module boundary on every chunk.
Finding the lines themselves is ``ftwatch.policy.progresslines``.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from typing import Callable, Container, Iterable, Iterator

from ftwatch.bounded import EVICTIONS, BoundedDict
from ftwatch.config.health import STEP_PATTERNS
from ftwatch.config.limits import MAX_INSTANCES_PER_JOB, MAX_NOTICES_PER_JOB
from ftwatch.events import Finding, Origin
from ftwatch.parsers import chunks, fields
from ftwatch.parsers.multiline import PY_START as _TRACEBACK
from ftwatch.policy.catchsite import catch_site, ended_thread, going_on
from ftwatch.policy.progresslines import iter_lines as _lines
from ftwatch.policy.waiting import Waiting, went_back  # noqa: F401  (went_back: re-exported)
from ftwatch.rules.stragglers import scan_form

SURVIVE_SECONDS = 300.0   # how long after an error its instance's progress still counts
MARKS = 2                 # progress lines after the error that show a whole step began and ended
MAX_WAITING = 256         # errors waiting at once (the oldest stop waiting first)
MAX_SITES = 64            # catch sites of outlived tracebacks kept per instance (:meth:`Survival.repeat`)
#: Bytes of a chunk read before the first line of the errors found in it (:meth:`Survival.outlived`):
#: ~130 lines of a combined log, a step line of every rank of a 128-rank job. (A chunk read from its
#: start gave an error near its start fewer; ``watch``'s chunks, a batch's lines of a stream, hold
#: little before their errors either.) Half a scan piece (``progresslines.PIECE_BYTES``), so that one
#: scan finds the lines before an error and those after it that outlive it (bench replay: 64 KiB and
#: 128 KiB pieces cost 0.047 s, 32 KiB and 64 KiB pieces 0.037 s)
LOOKBACK = 32 * 1024
#: :meth:`Survival.outlived` reads only the last of a run of progress lines before an instance's errors that
#: holds each counter (False: every line, as :func:`marks` yields it; the tests compare both)
DEFER_BEFORE = True

#: progress counters beside the step patterns (see the module docstring for where each is printed)
EXTRA_PATTERNS: dict[str, str] = {
    "epoch": r"\b[Ee]poch(?:\(train\))?['\"]?\s*[:=]?\s*[(\[]?\s*\d+",
    # (?<!-): a command-line flag (``--train-iters 100000`` in a launcher's echoed command) is a setting, no progress
    "iteration": r"(?<!-)\b(?:[Ii]ter(?:ation)?s?)(?:\(train\))?\s*[:=]?\s*\[?\s*\d+",
    # (?:\b|_): a snake_case metric name ends in the word too (``total_loss: 5.81``, ``train_loss=0.43``,
    # Keras' ``val_loss: 0.52``, Lightning's bar postfix ``train_loss=0.123``), where ``\b`` alone never matches
    "loss": r"(?:\b|_)[Ll]oss['\"]?\s*[:=]?\s*[-+]?\d*\.\d",
}
_ALL = {**{f"step_{k}": scan_form(p) for k, p in STEP_PATTERNS.items()}, **EXTRA_PATTERNS}
PATTERNS: tuple[str, ...] = tuple(_ALL.values())
_PROGRESS = re.compile("|".join(f"(?:{p})" for p in PATTERNS).encode())
PROGRESS = _PROGRESS
"""What a progress line holds (any of :data:`PATTERNS`), on bytes: replay's hang scan reads an untimed
line it matches as written while the work went on (``ftwatch.pipeline.replay_hang``)."""
_COUNTERS = tuple((k, re.compile(p.encode())) for k, p in _ALL.items()
                  if k not in ("loss", "step_megatron_straggler"))     # a loss or a round-trip time counts nothing
#: A literal each counter pattern's matches hold: a line without it is not searched with the pattern.
_COUNTER_GATES = {"step_megatron": b"iteration", "step_deepspeed": b"step=", "step_tqdm_its": b"%|",
                  "step_tqdm_sit": b"%|", "step_lightning_rich": b"Epoch ", "step_plain": b"tep", "epoch": b"poch",
                  "iteration": b"ter"}
_GATED_COUNTERS = tuple((k, _COUNTER_GATES[k], rx) for k, rx in _COUNTERS)
_DIGITS = re.compile(rb"\d+")
#: ``terminat`` and ``cancel``: a tear-down's lines, which name a step that ends rather than one run (Slurm's srun:
#: ``srun: Terminating job step 448213.0``, ``srun: Force Terminated job step 448213.0``, slurmstepd's ``*** STEP
#: 448213.0 ON n1 CANCELLED AT ... ***``, SchedMD/slurm src/srun and src/slurmd/slurmstepd: a Slurm job step id,
#: ``<jobid>.<stepid>``, not a training step)
_VETO = re.compile(r"(?i)error|exception|traceback|fail|timed? ?out|abort|killed|fatal|terminat|cancel")
#: :data:`_VETO` for ASCII text made lower case (the same answer there, 6x faster than ``(?i)``;
#: elsewhere case folding also matches non-ASCII letters, e.g. the Kelvin sign for ``k``).
_VETO_LOWER = re.compile(_VETO.pattern.removeprefix("(?i)"))
_TIMEOUT_LOWER = re.compile("timed? ?out")


def _vetoed_lower(low: str) -> bool:
    """``_VETO_LOWER.search(low) is not None`` for ASCII lower-case text, its words looked for as
    substrings first (seven ``in`` tests cost a third of the alternation's try at every position)."""
    return ("error" in low or "exception" in low or "traceback" in low or "fail" in low or "abort" in low
            or "killed" in low or "fatal" in low or "terminat" in low or "cancel" in low
            or "out" in low and _TIMEOUT_LOWER.search(low) is not None)


def _vetoed(text: str) -> bool:
    """A line's text speaks of an error (:data:`_VETO`): it is no progress."""
    return _vetoed_lower(text.lower()) if text.isascii() else _VETO.search(text) is not None


_TAIL_ENDS = frozenset(bytes([c]) for c in b"hrnsp)'\":=([/")     # the last bytes :data:`_TAIL` allows
#: The progress pattern, anchored at a position and matching only from its line (the same match
#: ``_PROGRESS.search`` finds first from there, when it starts on that line).
_ON_LINE = re.compile(rb"[^\n]*?(" + _PROGRESS.pattern + rb")")


IGNORED = "python.exception_ignored"
THREAD = "python.thread_exception"
#: Words that the traceback after them ended no program: Python's for an exception it could not
#: raise (``sys.unraisablehook``), one that ended a thread, not the process
#: (``threading.excepthook``), and an exit handler's before Python 3.10 (``Error in
#: atexit._run_exitfuncs:``, cleared at finalisation: the exit status stands); torch.compile's for a
#: frame it could not compile and ran eagerly
NOT_ENDING = frozenset({IGNORED, THREAD, "python.atexit_error", "torch.dynamo_wont_convert"})
_RANKED = re.compile(r"(?:(.*)/)?rank([0-9]+)")   # an instance ``Origin.with_rank`` named for a rank
_NO_RANKS: frozenset[int | None] = frozenset()
_ALL_RANKS = frozenset({None, -1})       # ``Survival._ranks``: every line of the origin counts


def ignored(previous: Finding | None, f: Finding) -> bool:
    """``f`` is the traceback of an exception that ended no program: ``previous``, the finding of the
    same instance just before it, is Python's ``Exception ignored in: ...`` or ``Exception in thread
    <name>:`` line, or torch.compile's ``WON'T CONVERT ...`` (:data:`NOT_ENDING`); or the traceback
    starts at a library handler whose code catches everything, logs it and returns
    (``ftwatch.policy.catchsite.going_on``)."""
    if going_on(f) is not None:
        return True
    return (previous is not None and previous.rule_id in NOT_ENDING and bool(f.evidence)
            and _TRACEBACK in f.evidence[0] and (previous.time, previous.seq) <= (f.time, f.seq))


def _is_traceback(f: Finding) -> bool:
    return bool(f.evidence) and _TRACEBACK in f.evidence[0]


def thread_link(previous: Finding | None, f: Finding) -> bool:
    """``f`` is the last link of a thread's chained report whose earlier link, ``previous`` (the
    same instance's finding just before it), followed Python's "Exception in thread <name>:"
    header (:meth:`Survival.ignored` keeps which instances are in such a report): a traceback that
    starts at the thread's entry frame (``catchsite.ended_thread``). CPython prints the header once
    and then the whole chain, its causes first and the exception that left ``run()`` last, each
    link after "During handling of the above exception, another exception occurred:" (Lib/traceback.py
    TracebackException.format), so that link ended the same thread and no program."""
    return (previous is not None and _is_traceback(previous) and _is_traceback(f) and ended_thread(f)
            and (previous.time, previous.seq) <= (f.time, f.seq))


#: Open MPI's report that a rank called MPI_Abort (``rules/packs/kill_vocab.tsv``) and the errorcode line it
#: wraps onto the next line when that errorcode is 0 (``rules/packs/lifecycle.yaml``)
ABORT_REPORT = "mpi.abort_invoked"
ABORT_ZERO = "mpi.abort_errorcode_zero"


def abort_zero(previous: Finding | None, f: Finding) -> bool:
    """``f`` is Open MPI's wrapped ``with errorcode 0.`` line and ``previous``, the finding of the same
    instance just before it, the ``MPI_ABORT was invoked on rank N in communicator C`` line it ends:
    the program asked mpirun to stop every rank with exit status 0 (MPI 4.1 section 11.2.2, the
    errorcode is returned to the invoking environment), its own deliberate stop, so ``previous`` is
    no failing exit (open-mpi/ompi ompi/mpi/help-mpi-api.txt [mpi-abort])."""
    return (previous is not None and previous.rule_id == ABORT_REPORT and f.rule_id == ABORT_ZERO
            and (previous.time, previous.seq) <= (f.time, f.seq))


def marks(data: bytes, time: float, sim_step: float, year: int | None,
          ranks: Container[int | None] | None = None,
          defer: Callable[[int | None, float, bytes, str], bool] | None = None,
          begin: int = 0) -> Iterator[tuple[int | None, float, dict[str, int]]]:
    """The progress lines of a chunk, in order, as (rank from the line's prefix, time, counters):
    the counters are the line's step, iteration and epoch numbers by the name of the pattern that
    found each (:data:`EXTRA_PATTERNS`, ``step_<name>`` for ``STEP_PATTERNS``), each the first
    number its match holds.

    A line is at its own timestamp; else at the last timestamped line's before it in ``data``
    plus ``sim_step`` per line between them; else at ``time`` plus ``sim_step`` per line from the
    chunk's start (how ``ftwatch.rules.engine.Engine.feed`` dates a hit line).

    Cost: one pass per chunk, in C (``ftwatch.policy.progresslines.lines``: the lines that hold a
    progress literal and may be of ``ranks``, one hyperscan scan); Python work (decode, veto,
    timestamp, counters) only for those lines of ``ranks``, with the rank ``lines`` read (not split
    again). Bench corpus (35 MB, ranks {1, None} waiting, ~14k lines): 0.27 s at a33fc32, 0.20 s
    reading each chunk from its start (the scan ~0.07 s; per line ~7 us, half of it :func:`_counters`);
    :meth:`Survival.outlived` now begins near the chunk's errors (``begin``): ~0.037 s, ~1.7k lines. They are the lines
    ``_PROGRESS.finditer`` over the whole chunk starts a match on: a match may run on (``\\s``) into the next line, so the lines before a wanted one that could
    carry one into it (:data:`_TAIL`) are matched too, unread. One difference from dating every
    progress line: an untimed line's stamp is looked for back to the last line read, not the last
    progress line of any rank (``chunks.last_timestamp`` tries at most 16 clock-bearing lines a
    search, so only 16+ unparseable stamps in a row between them could tell).

    Args:
        data: complete lines (``b"\\n"``-separated).
        time: the time of the chunk's first line (replay) or when it was read (live).
        sim_step: replay's seconds per untimed line; 0 live.
        year: the year for stamps that carry none.
        ranks: only the lines whose rank (``fields.split_rank_prefix``; None: no prefix) is in it
            (None: every line).
        defer: asked ``(rank, time, line, text)`` about each wanted line that carries its own
            timestamp and that no match can run on past, before its counters are read: True
            takes the line off the progress lines yielded here (the caller reads it, if it needs
            to, with :func:`_vetoed` and :func:`_counters`: :meth:`Survival.outlived`'s lines
            before every error of their instance). Such a line changes nothing here for the
            lines after it (no match of it can reach them).
        begin: a line's start: the lines before it are not read (:meth:`Survival.outlived`).
    """
    for rank, at, counters, _ in _marks(data, Clock(data, time, sim_step, year), ranks, defer, begin):
        yield rank, at, counters


def _marks(data: bytes, clock: Clock, ranks: Container[int | None] | None,
           defer: Callable[[int | None, float, bytes, str], bool] | None,
           begin: int) -> Iterator[tuple[int | None, float, dict[str, int], int]]:
    """:func:`marks`, each with the start of its line; ``clock``: the chunk's (one for every
    reading of it that goes on further in it: :meth:`Survival.outlived`)."""
    time, sim_step, year = clock.time, clock.sim_step, clock.year
    pos = 0                             # where the last progress match ended (``finditer``'s next start)
    for start, end, want, rank, off in _lines(data, ranks, begin=begin):
        if end < pos:                   # all taken by a match from an earlier line
            continue
        line = data[start:end]
        counters = text = own = None
        if want and pos <= start and line.rstrip()[-1:] not in _TAIL_ENDS:
            if defer is not None:       # its text and own time first (pure), for ``defer``
                if off >= 0:
                    text = fields.clean(data[off:end])
                else:
                    rank, text = fields.split_rank_prefix(fields.clean(line))
                own = fields.parse_timestamp(text, year)
                if own is not None and defer(rank, own, line, text):
                    continue
            # No match can run on past this line, so a progress match starts on it exactly where
            # one of the counter patterns matches in it: those found, ``_ON_LINE`` need not run.
            counters = _counters(line)
            if counters:
                pos = end
        if not counters:
            m = _ON_LINE.match(data, max(start, pos))
            if m is None:
                continue
            pos = m.end(1)
            if pos <= end and line.rstrip()[-1:] not in _TAIL_ENDS:
                pos = end               # no match can run on past this line
            while pos < end:            # the line's further matches: one may run on into the next line
                more = _ON_LINE.match(data, pos)
                if more is None:
                    break
                pos = more.end(1)
            if not want:
                continue
        if text is None:
            if off >= 0:                # the rank and the text's start read by ``_lines`` already
                text = fields.clean(data[off:end])
            else:
                rank, text = fields.split_rank_prefix(fields.clean(line))
            own = fields.parse_timestamp(text, year)
        if _vetoed(text):
            continue
        if own is None and sim_step:
            own = clock.at(start)
        yield rank, time if own is None else own, _counters(line) if counters is None else counters, start


def _counters(line: bytes) -> dict[str, int]:
    """A progress line's counters (:func:`marks`): per counter pattern that matches in it, the
    first number of its first match."""
    counters = {}
    for kind, gate, pattern in _GATED_COUNTERS:
        hit = pattern.search(line) if gate in line else None
        if hit is not None:
            counters[kind] = int(_DIGITS.search(hit.group()).group())
    return counters


class Clock:
    """The time of a chunk's untimed lines, asked for in line order (:func:`marks`): the last
    timestamped line's before it plus ``sim_step`` per line between them, else ``time`` plus
    ``sim_step`` per line from the chunk's start. Lines are counted from that stamp's line only
    (a reading that begins far into the chunk counts no lines before its stamp, issue 16)."""

    def __init__(self, data: bytes, time: float, sim_step: float, year: int | None):
        self.data, self.time, self.sim_step, self.year = data, time, sim_step, year
        self.stamps = chunks.Stamps(data, year)  # ``chunks.last_timestamp``, its times of day found once
        self.searched = 0                       # the last stamp search ended here
        self.base = time                        # the last stamp's time (else ``time``) ...
        self.counted, self.lines = 0, 0         # ... and the newlines from its line (else 0) up to ``counted``

    def at(self, start: int) -> float:
        """The time of the line starting at ``start`` (not before the last line asked for)."""
        found = self.stamps.last(self.searched, start)
        self.searched = start
        if found is not None:
            self.base, self.counted, self.lines = found[1], found[0], 0
        self.lines += chunks.newlines(self.data, self.counted, start)
        self.counted = start
        return self.base + self.lines * self.sim_step


class Survival:
    """One attempt's errors waiting to be outlived by their instance's progress, and those that
    were: the notices (see the module docstring). Truthy while an error waits.

    Args:
        window: seconds after an error in which its instance's progress counts.
        needed: progress lines after it that outlive it.
        max_notices: ``limits.max_notices_per_job``: past it the oldest notices are forgotten
            (to three quarters of it), counted in ``ftwatch_state_evicted_total{kind="notice"}``
            and handed to ``on_drop``; their ``notice`` events are stored already.
        max_instances: ``limits.max_instances_per_job``: the instances whose latest finding is
            kept (for :func:`ignored`), the least recently seen forgotten first (uncounted: they
            shadow the desk's instances, counted there).
        on_drop: called with the notices forgotten (oldest first); the desk drops them from its
            evidence too, so a forgotten notice never counts as an error again.
        where: ``(finding, chunk) -> offset``: where the finding's line starts in the chunk it was
            found in, None when it is not that chunk's (``ftwatch.rules.engine.Engine.position``);
            None: never known (every chunk is read from its start).
    """

    def __init__(self, window: float = SURVIVE_SECONDS, needed: int = MARKS, *,
                 max_notices: int = MAX_NOTICES_PER_JOB, max_instances: int = MAX_INSTANCES_PER_JOB,
                 on_drop: Callable[[list[Finding]], None] | None = None,
                 where: Callable[[Finding, bytes], int | None] | None = None):
        self.window = window
        self.needed = needed
        self.max_notices = max_notices
        self.on_drop = on_drop
        self.where = where
        self.notices: list[Finding] = []         # errors outlived (or ignored by Python), in order
        self._ids: set[int] = set()              # their ids
        self._waiting = Waiting()                # the errors waiting, by instance
        self._last: dict[str, Finding] = BoundedDict(max_instances)   # each instance's latest finding
        self._ranked: dict[str | None, frozenset[int]] = {}   # base (None: "rank<k>") -> k of "<base>/rank<k>" waiting
        #: instance -> the catch sites (:func:`catch_site`) of its notices
        self._sites: dict[str, set] = BoundedDict(max_instances)
        #: instances whose latest finding is a traceback of a thread's report ("Exception in
        #: thread <name>:" and its chain, :meth:`ignored`)
        self._thread_report: dict[str, bool] = BoundedDict(max_instances)
        #: instance -> the time of its latest traceback that unwound the main program, until a
        #: progress line after it is read (:meth:`program_ended`) ...
        self._ended: dict[str, float] = BoundedDict(max_instances)
        #: ... then here: its errors at or before this time stood, and never wait again
        self._stood: dict[str, float] = BoundedDict(max_instances)

    def is_notice(self, f: Finding) -> bool:
        """``f`` was outlived (or ignored by Python)."""
        return id(f) in self._ids

    def evidence(self, findings: list[Finding]) -> list[Finding]:
        """``findings`` less the notices."""
        return [f for f in findings if id(f) not in self._ids] if self._ids else findings

    def note(self, f: Finding) -> None:
        """``f`` became a notice by another reading than progress (a boot the job outlived, a
        scheduler's verdict on a job that ran again and finished): out of the evidence."""
        if id(f) not in self._ids:
            self._note(f)

    def _note(self, f: Finding) -> None:
        self.notices.append(f)
        self._ids.add(id(f))
        site = catch_site(f)
        if site is not None:
            sites = self._sites.get(f.origin.instance)
            if sites is None:
                sites = self._sites[f.origin.instance] = set()
            if len(sites) < MAX_SITES:
                sites.add(site)
        if len(self.notices) > self.max_notices:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        """Past ``max_notices``: the oldest notices go, to three quarters of the cap (so the
        next cut is a quarter of the cap away), counted and handed to ``on_drop``."""
        n = len(self.notices) - max(1, self.max_notices - self.max_notices // 4)
        gone = self.notices[:n]
        del self.notices[:n]
        for f in gone:
            self._ids.discard(id(f))
        EVICTIONS.count("notice", n)
        if self.on_drop is not None:
            self.on_drop(gone)

    def repeat(self, f: Finding) -> bool:
        """``f``'s traceback is one its instance already outlived, caught at the same place
        (:func:`catch_site`: same exception rule, same frames, the first not the program's entry):
        now a notice (the caller reports it). O(frames): the outlived sites are kept per instance."""
        site = catch_site(f)
        if site is None or site not in self._sites.get(f.origin.instance, ()):
            return False
        self._note(f)
        return True

    def _same_site(self, f: Finding) -> list[Finding]:
        """The errors of ``f``'s instance waiting with ``f``'s catch site (:func:`catch_site`), ``f``
        just outlived: they stop waiting, now notices (:meth:`repeat`, for those read before
        the progress that outlived ``f``: a replay's chunk, a burst)."""
        site = catch_site(f)
        if site is None:
            return []
        out = []
        for key in list(self._waiting.keys(f.origin.instance)):
            g = self._waiting.finding(key)
            if catch_site(g) == site:
                self._drop(key)
                self._note(g)
                out.append(g)
        return out

    def ignored(self, findings: list[Finding]) -> list[Finding]:
        """The tracebacks among ``findings`` that Python said it ignored (:func:`ignored`), and the
        MPI_Abort reports whose wrapped errorcode is 0 (:func:`abort_zero`): now notices."""
        out = []
        for f in findings:
            instance = f.origin.instance
            previous = self._last.get(instance)
            in_report = instance in self._thread_report and thread_link(previous, f)
            if in_report or ignored(previous, f):
                self._note(f)
                out.append(f)
            elif abort_zero(previous, f) and previous is not None and id(previous) not in self._ids:
                self._note(previous)         # MPI_Abort with errorcode 0: the report is no failing exit
                out.append(previous)
            if in_report or (previous is not None and previous.rule_id == THREAD and id(f) in self._ids
                             and _is_traceback(f)):
                self._thread_report[instance] = True
            else:
                self._thread_report.pop(instance, None)
            self._last[instance] = f
        return out

    def outlived(self, origin: Origin, data: bytes, time: float, sim_step: float,
                 year: int | None) -> list[tuple[Finding, float]]:
        """Read a chunk of ``origin``'s output (see :func:`marks`) for the waiting errors: those
        it outlives, each with the time of the progress line that did, now notices.

        A line at or before every waiting error of its instance (most of them in a replay, where
        a chunk is read after the errors it holds) only adds its counters to what those errors
        saw before them (``ftwatch.policy.waiting``: the last such line holding each counter is
        what an error reads). So such lines, those ``marks`` may leave to the caller
        (``defer``), are kept per instance as they come, and only the last holding each counter
        is read and logged, in line order, before the next line that may change the instance's
        errors and at the end (:meth:`_log_before`): the same log for every error that reads
        it, without each line's counters and veto (issue 16).

        Where every waiting error was found in this very chunk (``where``), the chunk is read only
        from :data:`LOOKBACK` bytes before the first of their lines (:meth:`_begin`), and again so
        whenever errors stop waiting and those left begin further on: a stream prints in order,
        so the lines before an error's own line were printed before it (whatever their stamps
        say), and of them an error reads only its counters before it, which the last of its
        instance's lines hold (every step line holds them all). A chunk read from its start made
        an error's counters before it depend on where the chunk happened to begin (an error at
        its start read none), and cost most of a chunk's lines per error (bench replay: the
        reading stopped at ~70 % of each 1 MiB chunk: 0.125 s, now 0.037 s, issue 16).
        """
        ranks = self._ranks(origin)
        if not ranks:
            return []
        out = []
        instances: dict[int | None, str] = {}          # rank -> its instance, made once a chunk
        before: dict[str, list[tuple[float, bytes, str]]] = {}   # instance -> its lines taken by ``defer``
        #: rank -> (its instance's waiting errors, ``Waiting.order``: no error starts waiting during this
        #: call, so the list stays the one drops update; None: none waits), its lines taken by ``defer``
        orders: dict[int | None, tuple[list | None, list]] = {}
        waiting = self._waiting

        def instance_of(rank: int | None) -> str:
            instance = instances.get(rank)
            if instance is None:
                instance = instances[rank] = origin.with_rank(rank).instance
            return instance

        def defer(rank: int | None, at: float, line: bytes, text: str) -> bool:
            known = orders.get(rank)
            if known is None:
                instance = instance_of(rank)
                known = orders[rank] = (waiting.order(instance), before.setdefault(instance, []))
            order, run = known
            if not order:
                return True                             # nothing of it waits: the line changes nothing
            if bisect_left(order, (at,)):               # after one of its errors (``Waiting.before_all``)
                return False
            run.append((at, line, text))
            return True

        wanted = None if ranks is _ALL_RANKS else ranks
        clock = Clock(data, time, sim_step, year)
        begin = self._begin(data, 0)
        while begin is not None:
            restart, waiting_n = None, len(self._waiting)
            for rank, at, counters, start in _marks(data, clock, wanted, defer if DEFER_BEFORE else None, begin):
                instance = instance_of(rank)
                run = before.get(instance)
                if run:
                    self._log_before(instance, run)
                    run.clear()                         # (the list ``defer`` appends to: kept)
                for f in self.progress(instance, at, counters):
                    self._note(f)
                    out.append((f, at))
                    out.extend((g, at) for g in self._same_site(f))
                if not self._waiting:
                    return out
                if len(self._waiting) < waiting_n:      # errors stopped waiting: those left may begin far on
                    waiting_n = len(self._waiting)
                    restart = self._begin(data, start)
                    if restart > start:
                        break
                    restart = None
            for instance, run in before.items():
                self._log_before(instance, run)
                run.clear()
            begin = restart
        return out

    def _begin(self, data: bytes, floor: int) -> int:
        """Where :meth:`outlived` reads ``data`` from, not before ``floor`` (a line's start): the
        start of the line :data:`LOOKBACK` bytes before the first line of the waiting errors, when
        every one of them was found in ``data`` (``where``); else ``floor``."""
        if self.where is None:
            return floor
        first = len(data)
        for f in self._waiting.findings():
            at = self.where(f, data)
            if at is None:
                return floor
            first = min(first, at)
        cut = data.rfind(b"\n", floor, first - LOOKBACK) + 1 if first - LOOKBACK > floor else 0
        return max(cut, floor)

    def _log_before(self, instance: str, run: list[tuple[float, bytes, str]]) -> None:
        """Log ``run``, progress lines of ``instance`` (time, raw line, text) at or before every one of
        its waiting errors, in line order, as :meth:`progress` of each would: of the lines that are
        progress (not vetoed, with counters), only the last holding each counter changes what an
        error reads (``waiting._fold``: per counter the last line at or before it), so the lines
        are read from the last back until every counter whose literal the run holds was found."""
        if instance not in self._waiting:
            return
        joined = b"\n".join([line for _, line, _ in run])
        left = {kind for kind, gate, _ in _GATED_COUNTERS if gate in joined}   # counters a line may hold
        kept = []
        for at, line, text in reversed(run):
            if not left:
                break
            if _vetoed(text):
                continue
            counters = _counters(line)
            if not left.isdisjoint(counters):
                left.difference_update(counters)
                kept.append((at, counters))
        for at, counters in reversed(kept):
            self.progress(instance, at, counters)

    def _ranks(self, origin: Origin) -> Container[int | None]:
        """The ranks (None: no prefix) of ``origin``'s lines whose instance has an error waiting
        (``Origin.with_rank``: ``rank<k>`` in a replay, else ``<instance>/rank<k>``), or
        :data:`_ALL_RANKS`. O(1): the waiting instances are indexed by name (:meth:`_index`)."""
        if origin.rank is not None:             # every line is the origin's instance
            return _ALL_RANKS if origin.instance in self._waiting else ()
        ranks = self._ranked.get(None if origin.source == "replay" else origin.instance, _NO_RANKS)
        return ranks | {None} if origin.instance in self._waiting else ranks

    def _index(self, instance: str, add: bool) -> None:
        """``instance`` (``rank<k>`` or ``<base>/rank<k>``) starts or stops waiting: kept in ``_ranked``."""
        m = _RANKED.fullmatch(instance)
        if m is None or str(int(m.group(2))) != m.group(2):
            return
        base, rank = m.group(1), int(m.group(2))
        ranks = self._ranked.get(base, frozenset())
        ranks = ranks | {rank} if add else ranks - {rank}
        if ranks:
            self._ranked[base] = ranks
        else:
            self._ranked.pop(base, None)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def watches(self, origin: Origin) -> bool:
        """Whether output of ``origin`` may outlive a waiting error (:meth:`outlived` would read
        it): an error of its instance, or of one of its ranks' instances (``Origin.with_rank``),
        waits. False means :meth:`outlived` would find nothing and change nothing."""
        if not self._waiting:
            return False
        if origin.instance in self._waiting:
            return True
        if origin.rank is not None:                 # a prefix's rank keeps the instance
            return False
        if origin.source == "replay":               # a combined log: any rank's instance
            return True
        prefix = origin.instance + "/rank"
        return any(instance.startswith(prefix) for instance in self._waiting.instances())

    def program_ended(self, f: Finding) -> None:
        """``f`` is a traceback that unwound its instance's main program
        (``catchsite.ended_program``; the caller checks): the instance's first progress line dated
        after it makes the instance's errors at or before it stand, not outlived, and
        :meth:`wait` then refuses those read later (see the module docstring)."""
        instance = f.origin.instance
        if f.time > max(self._ended.get(instance, float("-inf")), self._stood.get(instance, float("-inf"))):
            self._ended[instance] = f.time

    def _stand(self, instance: str, ended: float) -> None:
        """A progress line of ``instance`` after its program ended at ``ended``: its errors at or
        before then stop waiting (they stand). O(errors waiting of the instance), once per end."""
        del self._ended[instance]
        self._stood[instance] = ended
        for key in self._waiting.keys(instance):
            if self._waiting.finding(key).time <= ended:
                self._drop(key)

    def wait(self, finding: Finding) -> None:
        """``finding`` waits for its instance's progress (the oldest stops waiting past
        :data:`MAX_WAITING`); not when its instance's program ended after it and progress after
        that end was read (:meth:`program_ended`)."""
        if finding.time <= self._stood.get(finding.origin.instance, float("-inf")):
            return
        if len(self._waiting) >= MAX_WAITING:
            self._drop(self._waiting.oldest())
        if self._waiting.add(finding):
            self._index(finding.origin.instance, True)

    def _drop(self, key: int) -> None:
        instance = self._waiting.drop(key)
        if instance is not None:
            self._index(instance, False)

    def progress(self, instance: str, time: float, counters: dict[str, int] | None = None) -> list[Finding]:
        """``instance`` printed a progress line at ``time`` (with ``counters``, see :func:`marks`):
        the errors it now outlived (they stop waiting). An error of the instance whose window
        ``time`` is past, or a counter of which went back (the process started over), stops
        waiting (``ftwatch.policy.waiting``: O(log n) in the errors waiting). A line after the
        instance's program ended outlives none of its errors from before that end
        (:meth:`program_ended`)."""
        ended = self._ended.get(instance) if self._ended else None
        if ended is not None and time > ended:
            self._stand(instance, ended)
        out, gone = self._waiting.progress(instance, time, counters or {}, self.window, self.needed)
        for emptied in gone:
            self._index(emptied, False)
        return out

    def finished(self, instance: str | None, time: float, seq: int) -> list[Finding]:
        """``instance`` printed its own "training finished" line at (``time``, ``seq``): its errors
        waiting from before it are outlived (they stop waiting; the caller notes them). The
        program's finish line runs only after its training loop returned, and an exception that
        ends a program is printed as the program ends (``sys.excepthook``), so the process that
        printed both caught the error and went on. ``instance`` None: every instance's errors
        (a synchronous job, whose ranks all took part in each step up to the finish)."""
        out = []
        for key in self._waiting.keys(instance):
            f = self._waiting.finding(key)
            if (f.time, f.seq) < (time, seq):
                self._drop(key)
                self._note(f)
                out.append(f)
        return out

    def exited_ok(self, findings: Iterable[Finding]) -> list[Finding]:
        """Tracebacks whose process then exited 0 (its own status under ``ftwatch run``, or its
        launcher's reading of it, ``ftwatch.policy.lifecycle``): they ended no program. They stop
        waiting and are notices; returns those that were not notices yet (the caller notes them)."""
        out = []
        for f in findings:
            if id(f) in self._ids:
                continue
            for key in self._waiting.keys(f.origin.instance):
                if self._waiting.finding(key) is f:
                    self._drop(key)
            self._note(f)
            out.append(f)
        return out

    def expire(self, now: float) -> None:
        """Errors whose window ended by ``now`` stop waiting (they stand)."""
        for emptied in self._waiting.expire(now, self.window):
            self._index(emptied, False)

    def clear(self) -> None:
        """Nothing waits, no notice (a new attempt)."""
        self._waiting.clear()
        self._ranked.clear()
        self.notices.clear()
        self._ids.clear()
        self._last.clear()
        self._sites.clear()
        self._thread_report.clear()
        self._ended.clear()
        self._stood.clear()
