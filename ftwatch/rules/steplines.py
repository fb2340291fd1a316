"""The step tap's one pass per chunk: which lines of a chunk are step lines, and by which pattern.

The step patterns are not in the engine's multi-pattern database (one matcher callback, one
Record-like parse and one Python call per step line cost ~10 us a line, and step lines are a
third of a training log). Instead each pattern runs once over the chunk's bytes as a compiled
``re`` (``finditer``, in C; every built-in pattern starts with a literal, so the search skips
the other lines at memchr speed), and Python touches each step line once, for its fields.

What a line's match is, exactly as the tap's per-line rules say (``ftwatch.rules.stragglers``):
the first pattern (in configured order) with a match that its veto lets pass wins, and of its
matches in the line the last one counts (a line may hold several ``\\r``-separated progress-bar
updates). Matches are read on the raw line, rank prefix included: no built-in pattern can match
inside a rank prefix, and the vetoes look only after it (``fields.rank_prefix_at``). The
built-in patterns' ``\\s`` become ``[^\\S\\n]`` (the same on one line, never across two);
a custom pattern (a Python regex from the config) runs with ``re.MULTILINE`` and only proposes
lines: the tracker reads those again per line with the regex itself.

A pass costs ~0.3 ns a byte even for a pattern with no line in the chunk, so a literal that
each built-in pattern's matches hold (``_GATES``) is first looked for, all together, in one
Hyperscan pass that stops at each literal's first match (``HS_FLAG_SINGLEMATCH``: at most one
callback per pattern and chunk); only the patterns present get their ``re`` pass. Without
hyperscan, and for custom patterns, every pattern gets its pass.
"""

from __future__ import annotations

import functools
import operator
import re
from itertools import repeat, tee
from typing import Callable, Container, Sequence

from ftwatch.config.health import STEP_PATTERNS
from ftwatch.parsers.fields import rank_prefix_at

try:  # as in ftwatch.rules.matcher: hyperscan wheels exist for x86_64 only
    import hyperscan as _hs
except ImportError:  # pragma: no cover - depends on the platform
    _hs = None

_NAMED = re.compile(r"\(\?P<\w+>")


#: A pattern's last group when it is one repeated character class (``(?:[0-9.]+)`` at the end).
_TRAILING_REPEAT = re.compile(r"(\(\?:(?:\[[^\]\\]*\]|\\[dw]))\+\)$")


_SPACE = re.compile(r"(?<!\\)\\s")


def scan_form(regex: str, builtin: bool = False) -> str:
    """A step pattern in the matcher's subset (what ``ftwatch check`` compiles a custom pattern
    as; the tap itself runs the Python regexes): named groups made non-capturing (``(?P<x>`` ->
    ``(?:``), and a last group of one repeated class matched once (``(?:[0-9.]+)$`` ->
    ``(?:[0-9.])``): a line matches either both or neither, and a matcher, which reports every
    end of a match, calls back once per step line instead of once per digit.

    ``builtin`` (the ``STEP_PATTERNS``, whose ``\\s`` all stand outside classes): ``\\s`` becomes
    ``[^\\S\\n]``, the same on one line but never a newline, so the matcher needs no per-hit RE2
    re-check of a match spanning two lines (``ftwatch.rules.matcher``)."""
    form = _TRAILING_REPEAT.sub(r"\1)", _NAMED.sub("(?:", regex))
    return _SPACE.sub(r"[^\\S\\n]", form) if builtin else form


#: tqdm descriptions of a training bar: none (HF Trainer) or Lightning's "Epoch N".
TRAIN_DESC = re.compile(r"(?:Epoch \d+:?)?")
#: "plain" hits that are not a training step (a checkpoint, the scheduler, evaluation, warm-up).
#: Looked for before the match only: "step 100 loss 2.3 eval_loss 2.1" is a step line.
NOT_A_STEP = re.compile(r"(?i)checkpoint|\bsav(?:e|ed|ing)\b|schedul|\beval|valid|warm.?up|\bresum|\bload")
_TRAIN_DESC_BYTES = re.compile(TRAIN_DESC.pattern.encode())
_NOT_A_STEP_BYTES = re.compile(NOT_A_STEP.pattern.encode())
_ANY_LINE = re.compile(rb"[^\n]+")          # a custom pattern that has no bytes form proposes every line
#: Built-in patterns that open with ``\b`` or digits start here with their first literal instead
#: (the head moved into a look-behind: the same lines, but ``re`` searches for the literal in C
#: instead of trying the pattern at every position, 4-8x faster). ``_start`` finds a tqdm match's
#: real start (its digits) for the veto.
_HEADS = {"deepspeed": (r"\bstep=", r"step=(?<=\bstep=)"),
          "lightning_rich": (r"\bEpoch ", r"Epoch (?<=\bEpoch )"),
          "tqdm_its": (r"\d+%\|", r"%\|(?<=\d%\|)"),
          "tqdm_sit": (r"\d+%\|", r"%\|(?<=\d%\|)"),
          "plain": (r"(?:\bglobal_|\b)[Ss]tep", r"tep(?:(?<=\bglobal_[Ss]tep)|(?<=\b[Ss]tep))")}


def byte_form(name: str) -> bytes:
    """The bytes regex of built-in pattern ``name`` for a chunk: ``\\s`` kept on one line, the
    head moved behind the first literal (``_HEADS``)."""
    pattern = STEP_PATTERNS[name]
    head = _HEADS.get(name)
    if head is not None:
        assert pattern.startswith(head[0]), name
        pattern = head[1] + pattern[len(head[0]):]
    return _SPACE.sub(r"[^\\S\\n]", pattern).encode()

_START = operator.itemgetter(0)
_MATCH_START, _GROUPS = re.Match.start, re.Match.groups

#: A line's step match: (line start, pattern index, the bytes match's groups, ``m.groups()``: group
#: ``g`` at ``g - 1``; None: read the line again). Groups, not the match: a tuple of bytes is left
#: alone by the garbage collector, a kept ``re.Match`` is not (a chunk's thousands of them were
#: promoted to the old generation and set off full collections of the whole process).
StepHit = tuple[int, int, "tuple[bytes | None, ...] | None"]


def _tqdm_ok(data: bytes, start: int, match: re.Match) -> bool:
    """A tqdm bar with no description or Lightning's ``Epoch N`` (the update's text before the bar,
    which starts at the percentage's digits: the match starts at its ``%``)."""
    at = match.start()
    while at > start and 48 <= data[at - 1] <= 57:
        at -= 1
    cut = data.rfind(b"\r", start, at)
    lo = cut + 1 if cut >= 0 else rank_prefix_at(data, start)[1]
    return _TRAIN_DESC_BYTES.fullmatch(data[lo:at].strip()) is not None


def _plain_ok(data: bytes, start: int, match: re.Match) -> bool:
    """No checkpoint, scheduler, evaluation or warm-up word before the match (after the rank prefix:
    looked for from the line's start first, which finds any the search after the prefix finds
    (``\\b`` sees the bytes before the search's start), so the prefix is read only when it finds one)."""
    search = _NOT_A_STEP_BYTES.search
    return search(data, start, match.start()) is None or search(data, rank_prefix_at(data, start)[1],
                                                                 match.start()) is None


_VETOES: dict[str, Callable[[bytes, int, re.Match], bool]] = {
    "tqdm_its": _tqdm_ok, "tqdm_sit": _tqdm_ok, "plain": _plain_ok}


def accepts(name: str, text: str, match: re.Match) -> bool:
    """The veto of pattern ``name`` on one line's ``text`` (rank prefix removed): does ``match`` count?"""
    if name in ("tqdm_its", "tqdm_sit"):
        segment = text[: match.start()].rsplit("\r", 1)[-1].rsplit("\n", 1)[-1]
        return TRAIN_DESC.fullmatch(segment.strip()) is not None
    if name == "plain":
        return NOT_A_STEP.search(text, 0, match.start()) is None
    return True


#: Per built-in pattern a literal each of its matches holds (the gate: no ``re`` pass over a
#: chunk without it).
_GATES = {"megatron": "elapsed time per iteration (ms): ", "megatron_straggler": "MnRtt/Rnk: ",
          "deepspeed": "step=", "tqdm_its": "it/s", "tqdm_sit": "s/it", "lightning_rich": "it/s", "plain": "tep"}


def _gate(names: Sequence[str], only: Container[int] | None = None):
    """(Hyperscan database, scratch) telling which built-in patterns' literals occur in a chunk
    (ids: pattern indexes), or None (no hyperscan, or no built-in pattern); ``only``: of these
    pattern indexes only (None: all)."""
    gated = tuple((i, _GATES[name]) for i, name in enumerate(names)
                  if name in _GATES and (only is None or i in only))
    if _hs is None or not gated:
        return None
    db = _gate_db(gated)
    return db, _hs.Scratch(db)                   # a scratch of its own: a tracker per thread


@functools.lru_cache(maxsize=64)
def _gate_db(gated: tuple[tuple[int, str], ...]):
    """The compiled gate of ``(pattern index, literal)`` pairs, once per process (a database is
    read-only once compiled): ~0.2-1 ms a compile, once per step tracker, was ~2 s of an evaluate
    of the corpus, which makes one tracker per case."""
    db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
    db.compile(expressions=[re.escape(text).encode() for _, text in gated], ids=[i for i, _ in gated],
               flags=[_hs.HS_FLAG_SINGLEMATCH] * len(gated))
    return db


class StepLines:
    """The step lines of a chunk, one compiled regex pass per pattern.

    Args:
        names: the configured patterns: built-in names (``STEP_PATTERNS``) or Python regexes.
        exact: per pattern, whether its bytes match may be used as is (built-in, not Megatron's
            straggler report, whose text the tracker reads); the others' lines are only proposed.
    """

    def __init__(self, names: Sequence[str]):
        self._names = list(names)
        self._gate = _gate(names)
        #: ``find(..., only=)``'s gates, one per ``only`` (``steptail``'s straggler-report pass
        #: reads most of every chunk for one literal: a one-literal database scans it ~4x faster)
        self._gates: dict[frozenset[int], tuple | None] = {}
        self.regexes: list[re.Pattern[bytes]] = []
        self.exact: list[bool] = []
        self._vetoes: list[Callable[[bytes, int, re.Match], bool] | None] = []
        gated: set[int] = set()
        for name in names:
            builtin = STEP_PATTERNS.get(name)
            if builtin is not None:
                self.regexes.append(re.compile(byte_form(name)))
                self.exact.append(name != "megatron_straggler")
                gated.add(len(self.regexes) - 1)
                self._vetoes.append(_VETOES.get(name))
                continue
            try:
                self.regexes.append(re.compile(name.encode("utf-8"), re.MULTILINE))
            except (re.error, UnicodeEncodeError):
                self.regexes.append(_ANY_LINE)
            self.exact.append(False)
            self._vetoes.append(None)
        self._ungated = frozenset(range(len(names))) - gated if self._gate is not None else frozenset()

    def find(self, data: bytes, end: int, skip: Container[int] = (), begin: int = 0,
             only: Container[int] | None = None) -> list[StepHit]:
        """The step lines among the lines of ``data`` that start in ``[begin, end)``, in line order.

        Args:
            data: complete lines, ANSI escapes removed.
            end: where the lines to look at end (a line start, or ``len(data)``).
            skip: line starts not to look at (lines a block already took).
            begin: where the lines to look at start (a line start; ``ftwatch.rules.steptail``
                reads a chunk's tail).
            only: the pattern indexes to look for (None: all of them).

        Returns:
            ``(line start, pattern index, the match's groups)`` in line order; of hits with the
            same start the last counts: the last match in the line of the first pattern whose
            veto passes there (hits of other patterns on that line come before it). The groups
            are None where the pattern is not ``exact`` (the tracker reads the line's text with
            the pattern itself).
        """
        found: list[list[StepHit]] = []
        rfind = data.rfind
        present: Container[int] | None = None
        gate = self._gate if only is None or self._gate is None else self._gate_of(only)
        if gate is not None:
            seen: set[int] = set()
            # a part of the chunk as a view, not a copy (the straggler reports' pass reads all but
            # the tail: a ~1 MiB copy a chunk, issue 16)
            gate[0].scan(memoryview(data)[begin:end] if begin or end < len(data) else data, scratch=gate[1],
                         match_event_handler=lambda pid, _f, _t, _fl, _c: seen.add(pid))
            present = seen | self._ungated
            if not present:
                return []
        for index, rx in enumerate(self.regexes):
            if present is not None and index not in present or only is not None and index not in only:
                continue
            veto, exact = self._vetoes[index], self.exact[index]
            if veto is None:                    # in C, no Python step per line, no match kept
                found_at, groups = (tee(rx.finditer(data, begin, end)) if exact
                                    else (rx.finditer(data, begin, end), None))
                starts = map(operator.add, map(rfind, repeat(b"\n"), repeat(0), map(_MATCH_START, found_at)),
                             repeat(1))
                hits = list(zip(starts, repeat(index), map(_GROUPS, groups) if exact else repeat(None)))
                if skip:
                    hits = [h for h in hits if h[0] not in skip]
                if hits:
                    found.append(hits)
                continue
            hits = [(rfind(b"\n", 0, m.start()) + 1, index, m) for m in rx.finditer(data, begin, end)]
            if not hits:
                continue
            if veto is _plain_ok:                # its first search inline: no call for a line without a veto word
                search = _NOT_A_STEP_BYTES.search
                hits = [h for h in hits if search(data, h[0], h[2].start()) is None or veto(data, h[0], h[2])]
            elif veto is not None:
                hits = [h for h in hits if veto(data, h[0], h[2])]
            if skip:
                hits = [h for h in hits if h[0] not in skip]
            hits = [(start, index, m.groups() if exact else None) for start, index, m in hits]
            if hits:
                found.append(hits)
        if not found:
            return []
        if len(found) == 1:                     # one pattern: its hits, in order (equal starts: the last counts)
            return found[0]
        merged: list[StepHit] = []
        for hits in reversed(found):            # a stable sort by start: a line's hits of the first
            merged += hits                      # pattern come last, its last match the very last
        merged.sort(key=_START)
        return merged

    def _gate_of(self, only: Container[int]):
        """The gate of the patterns in ``only`` (made once per ``only``; None: none of them is gated)."""
        key = only if isinstance(only, frozenset) else frozenset(i for i in range(len(self._names)) if i in only)
        if key not in self._gates:
            self._gates[key] = _gate(self._names, key)
        return self._gates[key]
