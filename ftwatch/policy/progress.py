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
before it says the process started over (a restart), which does not outlive the error. Two lines,
not one: in synchronous training a rank whose peer died may still finish the step it was in, but
it cannot start and finish another (the next collective waits for the dead peer). The window
bounds how long an error waits: past it, the error stands as it did before.
"""

from __future__ import annotations

import re
from typing import Iterator

from ftwatch.config.health import STEP_PATTERNS
from ftwatch.events import Finding
from ftwatch.parsers import fields
from ftwatch.rules.stragglers import scan_form

SURVIVE_SECONDS = 300.0   # how long after an error its instance's progress still counts
MARKS = 2                 # progress lines after the error that show a whole step began and ended
MAX_WAITING = 256         # errors waiting at once (the oldest stop waiting first)

#: progress counters beside the step patterns (see the module docstring for where each is printed)
EXTRA_PATTERNS: dict[str, str] = {
    "epoch": r"\b[Ee]poch(?:\(train\))?['\"]?\s*[:=]?\s*[(\[]?\s*\d",
    "iteration": r"\b(?:[Ii]ter(?:ation)?s?)(?:\(train\))?\s*[:=]?\s*\[?\s*\d",
    "loss": r"\b[Ll]oss['\"]?\s*[:=]?\s*[-+]?\d*\.\d",
}
_ALL = {**{f"step_{k}": scan_form(p) for k, p in STEP_PATTERNS.items()}, **EXTRA_PATTERNS}
PATTERNS: tuple[str, ...] = tuple(_ALL.values())
_KINDS = tuple(_ALL)
_PROGRESS = re.compile("|".join(f"(?P<k{i}>{p})" for i, p in enumerate(PATTERNS)).encode())
_NO_COUNTER = frozenset({"loss", "step_megatron_straggler"})
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
          year: int | None) -> Iterator[tuple[int | None, float, str, int | None]]:
    """The progress lines of a chunk, in order, as (rank from the line's prefix, time, the kind of
    counter, its value): the kind is the pattern's name (:data:`EXTRA_PATTERNS`, ``step_<name>``
    for ``STEP_PATTERNS``), the value the first number it matched (None for a loss).

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
        kind = _KINDS[int(m.lastgroup[1:])]
        digits = None if kind in _NO_COUNTER else _DIGITS.search(m.group())
        yield rank, time if own is None else own, kind, int(digits.group()) if digits else None


class Survival:
    """Errors waiting to be outlived by their instance's progress (see the module docstring).

    Args:
        window: seconds after an error in which its instance's progress counts.
        needed: progress lines after it that outlive it.
    """

    def __init__(self, window: float = SURVIVE_SECONDS, needed: int = MARKS):
        self.window = window
        self.needed = needed
        self._waiting: dict[int, list] = {}      # id(finding) -> [finding, lines after, {kind: count before}]

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def wait(self, finding: Finding) -> None:
        """``finding`` waits for its instance's progress (the oldest stops waiting past
        :data:`MAX_WAITING`)."""
        if len(self._waiting) >= MAX_WAITING:
            del self._waiting[next(iter(self._waiting))]
        self._waiting[id(finding)] = [finding, 0, {}]

    def progress(self, instance: str, time: float, kind: str = "", count: int | None = None) -> list[Finding]:
        """``instance`` printed a progress line at ``time`` (its counter ``kind`` at ``count``):
        the errors it now outlived (they stop waiting). An error of the instance whose window
        ``time`` is past, or whose counter went back (the process started over), stops waiting."""
        out = []
        for key, entry in list(self._waiting.items()):
            f, before = entry[0], entry[2]
            if f.origin.instance != instance:
                continue
            if time <= f.time:
                if count is not None:
                    before[kind] = count
                continue
            if time > f.time + self.window or (count is not None and count < before.get(kind, count)):
                del self._waiting[key]
                continue
            entry[1] += 1
            if entry[1] >= self.needed:
                del self._waiting[key]
                out.append(f)
        return out

    def expire(self, now: float) -> None:
        """Errors whose window ended by ``now`` stop waiting (they stand)."""
        for key, entry in list(self._waiting.items()):
            if now > entry[0].time + self.window:
                del self._waiting[key]

    def clear(self) -> None:
        """Nothing waits (a new attempt)."""
        self._waiting.clear()
