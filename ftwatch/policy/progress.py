"""Whether the job outlived an error: its progress lines after it (issue 12 item 3).

An error-looking line does not always end the process that prints it. A client that catches an
exception and logs its traceback (``logging.exception``, ``traceback.print_exc()``) and goes on,
a connection error that is retried, a warning-level NCCL / c10d line: the job keeps making
progress afterwards, and such a finding is a notice, not an incident. Python prints a traceback
for an exception that ends the program only as the program ends (``sys.excepthook`` runs at
exit, docs.python.org/3/library/sys.html#sys.excepthook), so a process that prints its own
step lines after the traceback was not ended by it.

What counts as progress (:data:`PATTERNS`): the step lines the straggler tap reads
(``ftwatch.config.health.STEP_PATTERNS``: Megatron's ``iteration N/M``, DeepSpeed's ``step=N``,
tqdm and Lightning bars, ``step N``) and epoch, iteration and loss counters as trainers print
them: Keras ``Epoch 3/10`` (keras callbacks ProgbarLogger), Lightning ``Epoch 0:``, MMEngine
``Epoch(train) [1][50/500]`` / ``Iter(train) [100/1000]``, Detectron2 ``iter: 19 total_loss:``,
fairseq ``epoch 001 | loss 4.5``, the HF Trainer's ``{'loss': 0.12, ..., 'epoch': 0.5}``.
A line that also speaks of an error, exception, failure, timeout or abort is no progress.

Python says so itself for an exception it could not raise (``sys.unraisablehook``: "Exception
ignored in: <object>" and then the traceback, docs.python.org/3/library/sys.html#sys.unraisablehook;
rule ``python.exception_ignored``): that traceback is a notice at once (:func:`ignored`).

The reading (:class:`Survival`): an error of one instance (rank) is outlived when that same
instance prints :data:`MARKS` progress lines after it within :data:`SURVIVE_SECONDS`, its counters
going on from where they were: a counter (step, iteration, epoch) lower after the error than
before it says the process started over (a restart), which does not outlive the error (a step or
iteration count that restarts with a new epoch is no restart: :func:`went_back`). Two lines,
not one: in synchronous training a rank whose peer died may still finish the step it was in, but
it cannot start and finish another (the next collective waits for the dead peer). The window
bounds how long an error waits: past it, the error stands as it did before.
"""

from __future__ import annotations

import re
from typing import Iterator

from ftwatch.config.health import STEP_PATTERNS
from ftwatch.events import Finding, Origin
from ftwatch.parsers import fields
from ftwatch.rules.stragglers import scan_form

SURVIVE_SECONDS = 300.0   # how long after an error its instance's progress still counts
MARKS = 2                 # progress lines after the error that show a whole step began and ended
MAX_WAITING = 256         # errors waiting at once (the oldest stop waiting first)

#: progress counters beside the step patterns (see the module docstring for where each is printed)
EXTRA_PATTERNS: dict[str, str] = {
    "epoch": r"\b[Ee]poch(?:\(train\))?['\"]?\s*[:=]?\s*[(\[]?\s*\d+",
    "iteration": r"\b(?:[Ii]ter(?:ation)?s?)(?:\(train\))?\s*[:=]?\s*\[?\s*\d+",
    "loss": r"\b[Ll]oss['\"]?\s*[:=]?\s*[-+]?\d*\.\d",
}
_ALL = {**{f"step_{k}": scan_form(p) for k, p in STEP_PATTERNS.items()}, **EXTRA_PATTERNS}
PATTERNS: tuple[str, ...] = tuple(_ALL.values())
_PROGRESS = re.compile("|".join(f"(?:{p})" for p in PATTERNS).encode())
_COUNTERS = tuple((k, re.compile(p.encode())) for k, p in _ALL.items()
                  if k not in ("loss", "step_megatron_straggler"))     # a loss or a round-trip time counts nothing
_DIGITS = re.compile(rb"\d+")
_VETO = re.compile(r"(?i)error|exception|traceback|fail|timed? ?out|abort|killed|fatal")
IGNORED = "python.exception_ignored"
_TRACEBACK = "Traceback (most recent call last):"


def ignored(previous: Finding | None, f: Finding) -> bool:
    """``f`` is the traceback of an exception Python ignored: ``previous``, the finding of the same
    instance just before it, is the ``Exception ignored in: ...`` line."""
    return (previous is not None and previous.rule_id == IGNORED and bool(f.evidence)
            and _TRACEBACK in f.evidence[0] and (previous.time, previous.seq) <= (f.time, f.seq))


def marks(data: bytes, time: float, sim_step: float,
          year: int | None) -> Iterator[tuple[int | None, float, dict[str, int]]]:
    """The progress lines of a chunk, in order, as (rank from the line's prefix, time, counters):
    the counters are the line's step, iteration and epoch numbers by the name of the pattern that
    found each (:data:`EXTRA_PATTERNS`, ``step_<name>`` for ``STEP_PATTERNS``), each the first
    number its match holds.

    A line is at its own timestamp; else at the last timestamped line's before it in ``data``
    plus ``sim_step`` per line between them; else at ``time`` plus ``sim_step`` per line from the
    chunk's start (how ``ftwatch.rules.engine.Engine.feed`` dates a hit line).

    Args:
        data: complete lines (``b"\\n"``-separated).
        time: the time of the chunk's first line (replay) or when it was read (live).
        sim_step: replay's seconds per untimed line; 0 live.
        year: the year for stamps that carry none.
    """
    searched, stamp = 0, None           # the last stamp search ended here; (its line, time, line no)
    counted, lines = 0, 0               # newlines counted up to ``counted``
    last_line = -1
    for m in _PROGRESS.finditer(data):
        start = data.rfind(b"\n", 0, m.start()) + 1
        if start == last_line:
            continue
        last_line = start
        end = data.find(b"\n", start)
        rank, text = fields.split_rank_prefix(fields.clean(data[start:] if end < 0 else data[start:end]))
        if _VETO.search(text):
            continue
        own = fields.parse_timestamp(text, year)
        if own is None and sim_step:
            found = fields.last_timestamp(data, searched, start, year)
            searched = start
            if found is not None:
                lines += data.count(b"\n", counted, found[0])
                counted = found[0]
                stamp = (found[0], found[1], lines)
            lines += data.count(b"\n", counted, start)
            counted = start
            own = (stamp[1] + (lines - stamp[2]) * sim_step) if stamp is not None else time + lines * sim_step
        line = data[start:] if end < 0 else data[start:end]
        counters = {}
        for kind, pattern in _COUNTERS:
            hit = pattern.search(line)
            if hit is not None:
                counters[kind] = int(_DIGITS.search(hit.group()).group())
        yield rank, time if own is None else own, counters


def went_back(before: dict[str, int], now: dict[str, int]) -> bool:
    """The counters ``now`` are lower than ``before`` (the process started over): the epoch
    decides where both lines have one (a step or iteration count may restart with each epoch),
    else any counter both lines have."""
    if "epoch" in before and "epoch" in now and before["epoch"] != now["epoch"]:
        return now["epoch"] < before["epoch"]
    return any(n < before.get(k, n) for k, n in now.items())


class Survival:
    """One attempt's errors waiting to be outlived by their instance's progress, and those that
    were: the notices (see the module docstring). Truthy while an error waits.

    Args:
        window: seconds after an error in which its instance's progress counts.
        needed: progress lines after it that outlive it.
    """

    def __init__(self, window: float = SURVIVE_SECONDS, needed: int = MARKS):
        self.window = window
        self.needed = needed
        self.notices: list[Finding] = []         # errors outlived (or ignored by Python), in order
        self._ids: set[int] = set()              # their ids
        self._waiting: dict[int, list] = {}      # id(finding) -> [finding, lines after, {kind: count before}]
        self._by: dict[str, dict[int, None]] = {}    # instance -> the ids of its waiting errors, in order
        self._last: dict[str, Finding] = {}      # each instance's latest finding

    def is_notice(self, f: Finding) -> bool:
        """``f`` was outlived (or ignored by Python)."""
        return id(f) in self._ids

    def evidence(self, findings: list[Finding]) -> list[Finding]:
        """``findings`` less the notices."""
        return [f for f in findings if id(f) not in self._ids] if self._ids else findings

    def _note(self, f: Finding) -> None:
        self.notices.append(f)
        self._ids.add(id(f))

    def ignored(self, findings: list[Finding]) -> list[Finding]:
        """The tracebacks among ``findings`` that Python said it ignored (:func:`ignored`): now
        notices."""
        out = []
        for f in findings:
            if ignored(self._last.get(f.origin.instance), f):
                self._note(f)
                out.append(f)
            self._last[f.origin.instance] = f
        return out

    def outlived(self, origin: Origin, data: bytes, time: float, sim_step: float,
                 year: int | None) -> list[tuple[Finding, float]]:
        """Read a chunk of ``origin``'s output (see :func:`marks`) for the waiting errors: those
        it outlives, each with the time of the progress line that did, now notices."""
        out = []
        for rank, at, counters in marks(data, time, sim_step, year):
            for f in self.progress(origin.with_rank(rank).instance, at, counters):
                self._note(f)
                out.append((f, at))
            if not self._waiting:
                break
        return out

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def watches(self, origin: Origin) -> bool:
        """Whether output of ``origin`` may outlive a waiting error (:meth:`outlived` would read
        it): an error of its instance, or of one of its ranks' instances (``Origin.with_rank``),
        waits. False means :meth:`outlived` would find nothing and change nothing."""
        if not self._waiting:
            return False
        if origin.instance in self._by:
            return True
        if origin.rank is not None:                 # a prefix's rank keeps the instance
            return False
        if origin.source == "replay":               # a combined log: any rank's instance
            return True
        prefix = origin.instance + "/rank"
        return any(instance.startswith(prefix) for instance in self._by)

    def wait(self, finding: Finding) -> None:
        """``finding`` waits for its instance's progress (the oldest stops waiting past
        :data:`MAX_WAITING`)."""
        if len(self._waiting) >= MAX_WAITING:
            self._drop(next(iter(self._waiting)))
        self._waiting[id(finding)] = [finding, 0, {}]
        self._by.setdefault(finding.origin.instance, {})[id(finding)] = None

    def _drop(self, key: int) -> None:
        instance = self._waiting.pop(key)[0].origin.instance
        keys = self._by[instance]
        keys.pop(key, None)
        if not keys:
            del self._by[instance]

    def progress(self, instance: str, time: float, counters: dict[str, int] | None = None) -> list[Finding]:
        """``instance`` printed a progress line at ``time`` (with ``counters``, see :func:`marks`):
        the errors it now outlived (they stop waiting). An error of the instance whose window
        ``time`` is past, or a counter of which went back (the process started over), stops waiting."""
        counters = counters or {}
        out = []
        for key in list(self._by.get(instance, ())):
            entry = self._waiting[key]
            f, before = entry[0], entry[2]
            if time <= f.time:
                before.update(counters)
                continue
            if time > f.time + self.window or went_back(before, counters):
                self._drop(key)
                continue
            entry[1] += 1
            if entry[1] >= self.needed:
                self._drop(key)
                out.append(f)
        return out

    def expire(self, now: float) -> None:
        """Errors whose window ended by ``now`` stop waiting (they stand)."""
        for key, entry in list(self._waiting.items()):
            if now > entry[0].time + self.window:
                self._drop(key)

    def clear(self) -> None:
        """Nothing waits, no notice (a new attempt)."""
        self._waiting.clear()
        self._by.clear()
        self.notices.clear()
        self._ids.clear()
        self._last.clear()
