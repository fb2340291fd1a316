"""The rank the others waited for was busy, not broken (SPEC R7, issue 12 item 3).

A program may run work on one rank while the others wait for it in a barrier: Hugging Face's
``main_process_first`` is built for that ("A context manager for torch distributed environment
where on needs to do something on the main process, while blocking replicas ... One such use is
for datasets's map feature which to be efficient should be run once on the main process",
transformers ``TrainingArguments.main_process_first``; accelerate's ``main_process_first`` /
``wait_for_everyone`` the same). The replicas wait under the process group's timeout; when the
main process's work outlasts it, their barrier (a store read, a collective, an NPU stream
synchronise under HCCL) times out and they die while the main process is still working.
Transformers names the cure: ``ddp_timeout``, "The timeout for torch.distributed.init_process_group
calls, used to avoid GPU socket timeouts when performing slow operations in distributed runnings"
(default 1800 s). Nothing failed: the job's own schedule asked the replicas to wait longer than
its timeout, and a restart runs the same work under the same timeout (the work was cut before
it finished, so no cache of it was saved). That is the job's configuration: user_code, fail_job.

:func:`busy_rank` reads it from the evidence, not from a case:

1. no instance died on its own (an exit by a signal other than the watchdog's SIGABRT and a
   launcher's SIGTERM, or a listed code), and every rank that reports an error was *waiting*:
   its findings include a timeout (a rule of ``collectives.TIMEOUT_RULES`` or a line that says
   the wait timed out) and a wait for peers (a collective timeout rule, or a line or traceback
   frame naming a barrier, a collective or the store read a barrier does), and none of its
   findings is a fault of its own (hardware, OOM, a program error);
2. another rank, with no error of its own up to then, was in a phase of its own work
   (:data:`PHASE_RULES`, ``lifecycle.rank_phase.*`` in ``rules/packs/lifecycle.yaml``: the
   datasets map progress bar; a bar counting bytes, tqdm's ``unit="B"``: a file read, download or
   upload, I/O that needs no peer; a bar of the dataset's tokenization, which the process that
   builds the dataset does alone), its latest such line before the first timeout not finished
   (below 100 %), and by the bar's own account (tqdm's ``[elapsed<remaining, ...]``) that work
   both overlaps the replicas' wait (from the first timeout less the wait's timeout, given by
   ``Timeout(ms)`` or ``timed out after <ms>ms`` where a line has it, else
   :data:`DEFAULT_WAIT_SECONDS`, to the first timeout) and lasts at least that timeout: the work
   could not end before the replicas' wait did, whatever else happened (a node that died
   meanwhile would not have saved them). A replayed bar line without a time of its own carries
   the last stamped line's, so the overlap, not the line's time alone, ties it to the wait.

Where the ranks' lines carry no prefix of their own:

* a phase line on a stream without a rank prefix (``torchrun`` prefixes its workers'
  tracebacks, ``[rank1]:``, but not rank 0's progress bar) counts when the waiting ranks are
  named: it is not one of theirs;
* so does a bar that opens a waiting rank's own timeout line: tqdm ends each update with a
  carriage return, so on a terminal the ranks share (``accelerate launch`` prefixes nothing) the
  next process's message runs on from the bar's line, and the waiting rank, blocked in the
  wait, is not the one updating a bar (only a datasets bar: a training bar on that line is the
  main process's own training, which a rank that hung in training leaves there as well);
* a bar of any unit on that line counts when the same bar opens a later line with more done
  (:func:`_advanced_bars`): it went on advancing after its peer's collective timed out, which a
  rank inside that collective cannot do (NCCL user guide: a collective not called on every rank
  leaves the others "waiting indefinitely"); a hung rank's bar shows no later update;
* the rank a c10d line names in the default process group (``[Rank 2] Watchdog caught ...``)
  is that line's rank.

Then that rank is the root cause, ``collective.busy_rank`` (user_code, fail_job). A rank that
shows no phase line is not read as busy: a silent rank stays the hang reading of
``ftwatch.policy.collectives.silent_rank``.

A rank's own lines tell the same without a bar, by their time (:func:`working_rank`): every rank
of a process group takes part in each of its collectives (PyTorch DDP notes; NCCL's collectives
block until every rank has called them), so a rank whose main thread is inside the collective its
peers wait in prints nothing of its own work until that collective ends. After step 1, another
rank with no error of its own up to the first timeout that printed a line of its own work
(:data:`WORK_RULES`, ``lifecycle.own_work.*``: it writes a file to a path, it runs an evaluation;
a progress bar is read by its own account above, never by its time) stamped at least :data:`INSIDE_SECONDS` after the waits began (the
latest waiting rank's first timeout less the wait's timeout) was running its own code while they
waited, not stuck in their collective: ``collective.busy_rank`` as well (rank-only work between
the loop and the next collective, outlasting the timeout: transformers' ``ddp_timeout``, "used to
avoid GPU socket timeouts when performing slow operations in distributed runnings"). Only a wait
whose timeout a line gives (``Timeout(ms)=``) is dated; else :data:`SHORTEST_WAIT_SECONDS`, the
shortest default (NCCL's 10 minutes), so the wait is never dated earlier than it began. A waiting
rank's own line of such work before its timeout dates its wait as well: it printed it before it called
the collective it then waited in (the program's start-up, e.g. reading its input, ended there), so the
wait began no earlier; only that rank's work lines after that count as work the waiting ranks did too
(an unstamped watchdog line in a replay carries the stamp of an earlier line, which dates the wait
too early, a live monitor's time of it does not). A line at
the moment the wait began says nothing of the kind: a rank stuck in a save on dead storage, or on a
device, printed its last line then and nothing after (the time, not the word, carries the reading).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity, is_error
from ftwatch.policy.collectives import TIMEOUT_RULES, rank_of

#: Rules that say a rank is in a phase of its own work outside training (lifecycle.yaml's
#: ``lifecycle.rank_phase.*``; tests/policy/test_busy_rank.py keeps the two in step).
PHASE_RULES = frozenset({"lifecycle.rank_phase.datasets_map", "lifecycle.rank_phase.bytes_transfer",
                         "lifecycle.rank_phase.label_scan", "lifecycle.rank_phase.tokenizing"})
#: What each phase's bar is, in the finding's line.
PHASE_WORDS = {"lifecycle.rank_phase.datasets_map": "a datasets map bar",
               "lifecycle.rank_phase.bytes_transfer": "a bar of bytes read or transferred",
               "lifecycle.rank_phase.label_scan": "a dataset label scan, the local master's alone",
               "lifecycle.rank_phase.tokenizing": "a bar of the dataset's tokenization"}
#: The phase a datasets bar stands for, in the finding's fields (the rule that reads such a bar).
DATASETS_PHASE = "lifecycle.rank_phase.datasets_map"
#: The phase of a bar of any unit that went on advancing after a peer's timeout (:func:`_advanced_bars`).
ADVANCED_PHASE = "progress_bar.advanced_past_timeout"
PHASE_WORDS[ADVANCED_PHASE] = "a progress bar that went on advancing after its peers timed out"
#: The wait assumed where no line gives its timeout: torch.distributed's default process-group
#: timeout for the store and gloo (``default_pg_timeout``, 30 min) and transformers' ``ddp_timeout``.
DEFAULT_WAIT_SECONDS = 1800.0
#: Rules that say a rank does work of its own (lifecycle.yaml's ``lifecycle.own_work.*``), read by
#: their time in :func:`working_rank`; tests/policy/test_busy_rank.py keeps the two in step.
WORK_RULES = frozenset({"lifecycle.own_work.writing", "lifecycle.own_work.evaluation",
                        "lifecycle.own_work.data_loading"})
#: How far inside its peers' wait a rank's own line must be to say it was not in their collective
#: (seconds): CUDA runs a collective asynchronously, so a rank may print a little past the point
#: where it issued it, and an undated line carries an earlier line's time.
INSIDE_SECONDS = 300.0
#: The wait :func:`working_rank` assumes where no line gives its timeout: the shortest default a
#: process group has (torch.distributed.constants ``default_pg_nccl_timeout``, 10 minutes), so the
#: wait is dated no earlier than it could have begun (seconds).
SHORTEST_WAIT_SECONDS = 600.0
SOURCE = ("transformers src/transformers/training_args.py TrainingArguments.main_process_first and "
          "ddp_timeout; huggingface/datasets src/datasets/arrow_dataset.py Dataset.map progress bar")
#: A line that says a wait timed out (c10d "Socket Timeout", gloo "Timed out waiting", CANN
#: "Stream synchronize timeout", the watchdog's "timed out").
_TIMEOUT = re.compile(r"(?i)\btim(?:e|ed)[ _-]?out\b|timeout\b")
#: A wait for peers, on the error line or a frame of its traceback: a barrier (torch's, a
#: framework's ``main_process_first`` / ``wait_for_everyone``), a collective, the store read
#: that a barrier or a communicator's set-up does, and the rendezvous's connect to rank 0's store:
#: under ``env://`` (``_env_rendezvous_handler``) rank 0 creates the ``TCPStore`` server only once it
#: reaches ``init_process_group`` itself, and every other rank's ``TCPStore`` client retries its
#: connect until the process group's timeout (torch/distributed/rendezvous.py ``_create_c10d_store``:
#: ``TCPStore(hostname, port, world_size, start_daemon=rank == 0, timeout=...)``), so a client's
#: timeout there is a wait for rank 0 to arrive.
_WAIT_CALL = re.compile(r"\bbarrier\(|main_process_first|wait_for_everyone|\ball_?reduce\b|\bbroadcast\("
                        r"|store->get|key-value store|in _create_c10d_store\b")
#: A progress bar's percentage, counts, elapsed and remaining time (tqdm:
#: ``37%|███▋      | 851000/2300000 [21:05<35:52, 673.1 examples/s]``; ``?`` while unknown;
#: scaled byte counts with ``unit_scale``: ``2.00G/5.00G``).
_BAR = re.compile(r"[^|\n]{0,200}?(\d+)%\|[^|]*\| *([0-9.]+[kMGTP]?i?B?)/([0-9.]+[kMGTP]?i?B?) \[([0-9:]+)<([0-9:]+|\?)")
#: The rest of a datasets bar after its times (``, 673.1 examples/s]``; ``ex/s`` before datasets
#: 2.14): the unit ``lifecycle.rank_phase.datasets_map`` reads as well.
_DATASETS_UNIT = re.compile(r", *[0-9.?]+ ?(?:examples|ex)/s\]")
#: A wait's timeout spelled out on its line (c10d's socket: ``timed out after 1800000ms``; later
#: releases in seconds, ``The client socket has timed out after 1800s while trying to connect``).
_TIMED_OUT_AFTER = re.compile(r"timed out after (\d+) ?(ms|s)\b")
_OWN_FAULTS = frozenset({FailureClass.HARDWARE_NODE, FailureClass.OOM, FailureClass.USER_CODE})
_LOGGED = ("keyword", "fault_code")


def _waiting(mine: Sequence[Finding]) -> bool:
    """Says whether one rank's logged findings show it waiting for peers until a timeout."""
    errors = [f for f in mine if is_error(f)]
    if not errors or any(f.failure_class in _OWN_FAULTS for f in errors):
        return False
    timed_out = any(f.rule_id in TIMEOUT_RULES or _TIMEOUT.search(f.line) for f in errors)
    waits = any(f.rule_id in TIMEOUT_RULES or any(_WAIT_CALL.search(x) for x in (f.line, *f.evidence))
                for f in mine)
    return timed_out and waits


def _clock(text: str) -> float:
    """tqdm's ``[H:]MM:SS`` as seconds."""
    secs = 0.0
    for part in text.split(":"):
        secs = secs * 60 + int(part)
    return secs


def _unfinished(f: Finding) -> tuple[int, float, float] | None:
    """A phase line's bar below 100 %: its percentage, elapsed and remaining seconds (0 where the
    bar does not know what remains); None when it is done or has no bar."""
    m = _BAR.search(f.line)
    if m is None:
        return None
    pct, done, total = int(m.group(1)), m.group(2), m.group(3)
    if done.isdigit() and total.isdigit() and int(done) >= int(total):
        return None                     # (scaled counts, ``2.00G/5.00G``: the percentage says it)
    # tqdm prints "?" for what remains while it cannot tell: none is assumed, so the elapsed time
    # alone must then cover the wait (a lower bound of the work, never more than the bar says).
    remaining = 0.0 if m.group(5) == "?" else _clock(m.group(5))
    return (pct, _clock(m.group(4)), remaining) if pct < 100 else None


def _timeout_s(f: Finding) -> float | None:
    """The timeout a wait line gives (the watchdog's ``Timeout(ms)``, c10d's ``after <ms>ms``)."""
    if isinstance(f.fields.get("timeout_ms"), int):
        return f.fields["timeout_ms"] / 1000.0
    m = _TIMED_OUT_AFTER.search(f.line)
    if m is None:
        return None
    return int(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)


def died_on_its_own(f: Finding) -> bool:
    """An exit that says something of its own: not a generic code, not the SIGABRT the watchdog ends
    a timed-out rank with, not the SIGTERM a launcher stops the others with, not the SIGINT of a
    person's Ctrl-C (POSIX termios: the INTR character sends SIGINT to the terminal's foreground
    process group; mpirun and torchrun forward it to their ranks) (a SIGKILL, a SIGSEGV, a listed
    code: that rank died, which no waiting explains)."""
    if f.kind != "exit_code" or f.fields.get("generic"):
        return False
    return f.fields.get("signal") not in (2, 6, 15) and f.fields.get("exitcode") not in (130, 134, 143)


def _own_bar(f: Finding) -> bool:
    """A datasets bar that opens the line of another process's message: tqdm ends an update with a
    carriage return, never a newline, so what a peer writes next to the shared terminal runs on
    from the bar; the bar is the busy process's (the waiting rank's main thread is in the wait)."""
    m = _BAR.match(f.line)
    return m is not None and _DATASETS_UNIT.match(f.line, m.end()) is not None


def _advanced_bars(timeouts: Sequence[Finding], order: Sequence[Finding]) -> set[int]:
    """The ids of the waiting ranks' ``timeouts`` whose line opens with an unfinished bar of any unit
    that went on advancing after it.

    The same bar (its total) opens a later line with more done and more elapsed (tqdm redraws one
    bar in place, so its next update again runs into whatever a peer writes next). A process that
    advanced its own loop after its peers' collective timed out was not inside that collective:
    NCCL's collectives block until every rank of the communicator has called them (NCCL user
    guide, usage/operations.html: "NCCL collective operations have to be called for each rank ...
    to form a complete collective operation. Failure to do so will result in other ranks waiting
    indefinitely"), so a training step of a rank that hung in it could not complete either. A bar
    that stopped, as a hung rank's does, shows no later update and says nothing (the module
    docstring's step 2). "More done" holds when either count is not a plain number (``1.2k``).

    One sweep of the incident's bars from the last back, per bar total the later updates kept so
    that a timeout asks "a later update with more elapsed and more done?" in O(log n): each timeout
    reading every later finding was O(timeouts x findings) (a hung job's log repeated 640 times,
    ~27,000 lines: 15 s).

    Args:
        timeouts: the waiting ranks' timeout findings.
        order: the incident's findings by (time, seq).

    Returns:
        ``id`` of each timeout whose bar a later finding's line shows advanced.
    """
    asked = []                                           # (key, done, total, elapsed, id) of each timeout's bar
    for f in timeouts:
        m = _BAR.match(f.line)
        if m is not None and _unfinished(f) is not None:
            asked.append(((f.time, f.seq), m.group(2), m.group(3), _clock(m.group(4)), id(f)))
    if not asked:
        return set()
    bars = []                                            # (key, total, elapsed, done) of every finding's bar
    for g in order:
        n = _BAR.match(g.line)
        if n is not None:
            bars.append(((g.time, g.seq), n.group(3), _clock(n.group(4)), n.group(2)))
    later = {total: _LaterUpdates(sorted({e for _, t, e, d in bars if t == total and d.isdigit()}))
             for total in {b[1] for b in bars}}
    bars.sort(key=lambda b: b[0], reverse=True)
    asked.sort(key=lambda a: a[0], reverse=True)
    out: set[int] = set()
    k = 0
    for key, done, total, elapsed, ident in asked:       # each asked once every update after its key is in
        while k < len(bars) and bars[k][0] > key:
            later[bars[k][1]].add(bars[k][2], bars[k][3])
            k += 1
        if total in later and later[total].advanced(elapsed, done):
            out.add(ident)
    return out


class _LaterUpdates:
    """The updates of one bar total seen so far (:func:`_advanced_bars`): the most elapsed of all and
    of those whose count is no plain number, and, over the plain counts, the most done among the
    updates past an elapsed time (a max Fenwick tree over the sorted elapsed times)."""

    def __init__(self, elapsed: list[float]):
        self.elapsed = elapsed                           # the plain-count updates' elapsed times, sorted
        self.tree = [-1] * (len(elapsed) + 1)            # over them, last first (a suffix is a prefix)
        self.most = self.most_odd = float("-inf")

    def add(self, elapsed: float, done: str) -> None:
        self.most = max(self.most, elapsed)
        if not done.isdigit():
            self.most_odd = max(self.most_odd, elapsed)
            return
        i = len(self.elapsed) - bisect.bisect_left(self.elapsed, elapsed)
        while i < len(self.tree):
            self.tree[i] = max(self.tree[i], int(done))
            i += i & -i

    def advanced(self, elapsed: float, done: str) -> bool:
        """Some update seen has more elapsed than ``elapsed`` and more done than ``done``."""
        if not done.isdigit():
            return self.most > elapsed
        if self.most_odd > elapsed:
            return True
        i, most = len(self.elapsed) - bisect.bisect_right(self.elapsed, elapsed), -1
        while i > 0:
            most = max(most, self.tree[i])
            i -= i & -i
        return most > int(done)


@dataclass(frozen=True)
class Waits:
    """The ranks that only waited for their peers until a timeout (step 1 of the module docstring).

    Attributes:
        waiting: the ranks whose errors are waits, sorted.
        by_rank: every logged finding by rank (:func:`rank_of`), in order.
        unranked: logged findings with no rank, by instance, in order.
        timeouts: the waiting ranks' timeout findings.
        first: the earliest of them.
        window: the wait's timeout in seconds (the longest a line gives, else
            :data:`DEFAULT_WAIT_SECONDS`).
    """

    waiting: list[int]
    by_rank: dict[int, list[Finding]]
    unranked: dict[str, list[Finding]]
    timeouts: list[Finding]
    first: Finding
    window: float

    def others(self) -> list[tuple[str, list[Finding]]]:
        """The ranks that did not wait (``("rank 3", findings)``), then the unranked instances
        (their lines are not the waiting ranks' when those are named)."""
        waiting = set(self.waiting)
        return [(f"rank {r}", m) for r, m in sorted(self.by_rank.items()) if r not in waiting] + [
            (f"{i} (no rank prefix)", m) for i, m in sorted(self.unranked.items())]


def waits(order: Sequence[Finding], errors: Sequence[Finding]) -> Waits | None:
    """The ranks that only waited (step 1 of the module docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        errors: the errors to explain (the real ones, or the fallout when there is none): every
            one that names a rank must be on a waiting rank; one without a rank may only be
            fallout or an exit (a launcher's report).

    Returns:
        The waits, or None when an error is no wait, an instance died on its own, or no rank waited.
    """
    if any(rank_of(f) is None and f.kind in _LOGGED and f.failure_class is not FailureClass.FALLOUT for f in errors):
        return None
    if any(died_on_its_own(f) for f in errors):
        return None
    by_rank: dict[int, list[Finding]] = {}
    unranked: dict[str, list[Finding]] = {}
    for f in order:
        if f.kind in _LOGGED:
            r = rank_of(f)
            (by_rank.setdefault(r, []) if r is not None else unranked.setdefault(f.origin.instance, [])).append(f)
    waiting = sorted({r for f in errors if f.kind in _LOGGED and (r := rank_of(f)) is not None})
    if not waiting or not all(_waiting(by_rank.get(r, ())) for r in waiting):
        return None
    timeouts = [f for r in waiting for f in by_rank[r] if f.rule_id in TIMEOUT_RULES or _TIMEOUT.search(f.line)]
    first = min(timeouts, key=lambda f: (f.time, f.seq))
    window = max((t for f in timeouts if (t := _timeout_s(f)) is not None), default=DEFAULT_WAIT_SECONDS)
    return Waits(waiting, by_rank, unranked, timeouts, first, window)


def busy_rank(order: Sequence[Finding], w: Waits | None) -> Finding | None:
    """``collective.busy_rank`` on the rank the others waited for (see the module docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        w: :func:`waits` of ``order`` and the errors to explain (None: they are not all waits).

    Returns:
        A Finding on the busy rank's phase line's origin, at the first timeout's (time, seq), or
        None when the errors are not all waits or no other rank shows unfinished work of its own.
    """
    if w is None:
        return None
    waiting, first, window = w.waiting, w.first, w.window
    advanced = _advanced_bars(w.timeouts, order)
    phases: list[tuple[str, Finding]] = [(f"the process whose bar rank {rank_of(f)}'s message interrupted", f)
                                         for f in w.timeouts if _own_bar(f) or id(f) in advanced]
    for who, mine in w.others():
        before = [f for f in mine if (f.time, f.seq) <= (first.time, first.seq)]
        if not any(is_error(f) for f in before):
            phases += [(who, f) for f in sorted(before, key=lambda f: (f.time, f.seq))[::-1]
                       if f.rule_id in PHASE_RULES][:1]
    for who, phase in phases:
        bar = _unfinished(phase)
        if bar is None:
            continue
        pct, elapsed, remaining = bar
        work = elapsed + remaining
        if work < window or phase.time - elapsed > first.time or phase.time + remaining < first.time - window:
            continue
        kind = (phase.rule_id if phase.rule_id in PHASE_RULES
                else DATASETS_PHASE if _own_bar(phase) else ADVANCED_PHASE)
        line = (f"{who} was still in work of its own ({PHASE_WORDS[kind]}, {pct}% done, {work:.0f} s of work by "
                f"its bar) when rank(s) {waiting} timed out waiting ({first.rule_id}, timeout {window:.0f} s): the "
                "program held them in a barrier longer than its timeout (rank-0-only work outlasting the "
                "process-group timeout; raise the timeout, e.g. ddp_timeout, or do the work before the "
                "distributed job)")
        busy = phase.rank if phase.rule_id in PHASE_RULES else None
        return Finding("collective.busy_rank", "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                       phase.origin, line, first.time, first.seq, (phase.line, first.line),
                       {"busy": busy, "waiting": waiting, "phase": kind, "percent": pct,
                        "work_s": work, "timeout_s": window}, SOURCE)
    return None


def working_rank(order: Sequence[Finding], w: Waits | None) -> Finding | None:
    """``collective.busy_rank`` on a rank that wrote lines of its own work while its peers waited (the
    module docstring's last paragraph), or None.

    Args:
        order: the incident's findings by (time, seq).
        w: :func:`waits` of ``order`` and the errors to explain (None: they are not all waits).

    Returns:
        A Finding on the working rank's latest such line's origin, at the first timeout's (time,
        seq), or None when the errors are not all waits or no other rank wrote such a line inside
        the wait.
    """
    if w is None:
        return None
    given = [t for f in w.timeouts if (t := _timeout_s(f)) is not None]
    window = max(given) if given else SHORTEST_WAIT_SECONDS
    earliest: dict[int | None, float] = {}         # each rank's first timeout (one pass: 4,096 ranks)
    for f in w.timeouts:
        r = rank_of(f)
        if f.time < earliest.get(r, float("inf")):
            earliest[r] = f.time
    firsts = {r: earliest.get(r, w.first.time) for r in w.waiting}
    began = max(firsts.values()) - window
    mark = (w.first.time, w.first.seq)
    own = WORK_RULES                    # (a bar is read by its own account, in busy_rank)
    # A waiting rank's own line of work before its timeout was printed by its main thread before it
    # called the collective it then waited in: its wait began no earlier (a replayed watchdog line
    # without a stamp of its own carries an earlier line's, which dates the wait too early).
    entered = [f.time for r in w.waiting for f in w.by_rank.get(r, ()) if f.rule_id in own and f.time <= firsts[r]]
    began = max([began, *entered])
    if any(f.rule_id in own and f.time > began for r in w.waiting for f in w.by_rank.get(r, ())):
        return None                     # a waiting rank did that work too: nothing of one rank's own
    for who, mine in w.others():
        before = [f for f in mine if (f.time, f.seq) <= mark]
        if any(is_error(f) for f in before):
            continue
        inside = [f for f in before if f.rule_id in own and f.time >= began + INSIDE_SECONDS]
        if not inside:
            continue
        last = max(inside, key=lambda f: (f.time, f.seq))
        line = (f"{who} was still writing lines of its own work {last.time - began:.0f} s into its peers' wait "
                f"({last.line.strip()[:160]}) while rank(s) {w.waiting} timed out waiting in a collective "
                f"({w.first.rule_id}, timeout {window:.0f} s): it was running its own code, not in their "
                "collective; the program held them longer than its timeout (rank-only work between "
                "collectives; raise the timeout or move the work)")
        return Finding("collective.busy_rank", "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                       last.origin, line, w.first.time, w.first.seq, (last.line, w.first.line),
                       {"busy": rank_of(last), "waiting": w.waiting, "phase": last.rule_id,
                        "inside_s": last.time - began, "timeout_s": window}, SOURCE)
    return None
