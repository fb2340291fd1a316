"""Literal gates: the literals every match of a regex holds, for patterns Hyperscan scans slowly.

Hyperscan finds a regex by its literals: it looks for them all at once and runs the regex's
other parts only around what it finds. A regex that *begins* with a literal costs little, but
one that begins with a class run (``\\S+: line \\d+: ...``, ``(\\.mm?|\\.swift|\\]):\\d+: failed
assertion``) and reaches its rare literal only later makes Hyperscan track that start wherever
it may begin. On ``make bench``'s corpus (real log text, 28 % step lines) a few such built-in
regexes of 1,264 took a third of the scan's instructions (cachegrind, per 4 MB: 120 M with them
scanned as written, 80 M with them gated), since short pieces such as ``]:`` and ``/`` are on
most lines.

Such a pattern is *gated* (:func:`gate`): the matcher's scan looks for its required literals
instead (:attr:`Gate.literals`; a line holding none of them cannot match), and only the lines
where one is found are scanned again, joined, with the whole regex (``Matcher``'s second
database), so the answer is exact and the same as scanning with the regex itself.

Which patterns: those whose every match holds one of a few literals of at least
:data:`MIN_GATE_BYTES`, and whose matches do not all begin with a literal of at least
:data:`MIN_LEAD_BYTES` (Hyperscan handles those well itself). A shorter gate is found on too
many lines (``" steps"``: on 81,000 of the corpus' 290,000, every one then scanned twice); a
regex that begins with its literal (``exitcode\\s*:\\s*-9\\b``) gains nothing from a gate and
would cost its lines' second scan. Measured: the scan of the bench corpus 28-31 % faster at
1,000 and 10,000 rules, the same to 6 % faster on ``tests/corpus``' failure logs (where errors
are on most lines).

How (a reading of the regex's parse tree, as Russ Cox's "Regular Expression Matching with a
Trigram Index" reads one for an index, swtch.com/~rsc/regexp/regexp4.html): per node, the set of
strings it matches when that set is small (``exact``), and sets one of which every match begins
with, ends with and holds; a concatenation joins a left part's ends to a right part's starts, an
alternation unites its branches' sets, a repeat of at least one keeps its body's. The tree is
Python's own regex parser's (``re._parser``, on the pattern's bytes read as Latin-1). Where that
parser could read the pattern differently from Hyperscan (POSIX classes ``[[:digit:]]``, ``{,n}``,
``\\p``, ``\\Q``) or refuses it, the pattern gets no gate and is scanned as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

try:
    import re._constants as _C
    import re._parser as _P
except ImportError:  # pragma: no cover - Python < 3.11 named them sre_constants / sre_parse
    import sre_constants as _C  # type: ignore[no-redef]
    import sre_parse as _P  # type: ignore[no-redef]

MIN_GATE_BYTES = 8   # the shortest literal a gate may look for (module doc: shorter ones are on too many lines)
MIN_LEAD_BYTES = 3   # a regex whose every match begins with a literal this long is scanned as it is
_MAX_SET = 16        # strings in one set (larger: the node tells nothing)
_MAX_BYTES = 64      # bytes in one string of a set
_MAX_COUNT = 4       # the most copies a bounded repeat's exact set is spelt out for
#: syntax Python's parser reads otherwise than Hyperscan (or not at all): no gate for such a pattern
_UNSURE = re.compile(r"\[:|\{,|\\[pPQE]")
#: at least four literal bytes at the start and no alternation anywhere: the lead is at least
#: three (the fourth may be quantified), so the pattern is never gated and needs no parse
_PLAIN_LEAD = re.compile(rb"(?:[^\\^$.|?*+()\[\]{}]|\\[^0-9A-Za-z]){4}[^|]*")

_NOTHING = frozenset([""])   # no constraint: every string begins with, ends with and holds ""


@dataclass(frozen=True, slots=True)
class Gate:
    """What a gated pattern's scan looks for.

    Attributes:
        literals: byte strings, at least :data:`MIN_GATE_BYTES` each: every match of the pattern
            holds one of them (within its line).
        caseless: look for them ignoring ASCII case (the pattern, or part of it, is caseless).
    """

    literals: tuple[bytes, ...]
    caseless: bool


class _Info:
    """One node's sets (module doc): ``exact`` (None: too many, or unbounded), ``prefix``,
    ``suffix``, ``match``; a set holding ``""`` says nothing."""

    __slots__ = ("exact", "prefix", "suffix", "match")

    def __init__(self, exact: frozenset[str] | None = None, prefix: frozenset[str] = _NOTHING,
                 suffix: frozenset[str] = _NOTHING, match: frozenset[str] = _NOTHING):
        self.exact, self.prefix, self.suffix, self.match = exact, prefix, suffix, match

    def sets(self) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        """(prefix, suffix, match); an exact node's are its exact set."""
        if self.exact is not None:
            return self.exact, self.exact, self.exact
        return self.prefix, self.suffix, self.match


_EMPTY = _Info(_NOTHING)
_UNKNOWN = _Info()


def _score(strings: frozenset[str]) -> tuple[int, int]:
    """How good a set is as a gate: its shortest string's length, then fewer strings."""
    return (min(map(len, strings)) if strings else 0, -len(strings))


def _best(*sets: frozenset[str] | None) -> frozenset[str]:
    return max((s for s in sets if s is not None), key=_score, default=_NOTHING)


def _cross(left: frozenset[str], right: frozenset[str]) -> frozenset[str] | None:
    """Every string of ``left`` followed by every one of ``right``; None when too many or too long."""
    if len(left) * len(right) > _MAX_SET:
        return None
    out = frozenset(a + b for a in left for b in right)
    return out if max(map(len, out)) <= _MAX_BYTES else None


def _union(sets: list[frozenset[str]]) -> frozenset[str]:
    if any("" in s for s in sets):
        return _NOTHING
    out = frozenset().union(*sets)
    return out if len(out) <= _MAX_SET else _NOTHING


def _concat(left: _Info, right: _Info) -> _Info:
    if left.exact is not None and right.exact is not None:
        both = _cross(left.exact, right.exact)
        if both is not None:
            return _Info(both)
    l_pre, l_suf, l_match = left.sets()
    r_pre, r_suf, r_match = right.sets()
    prefix = (_cross(left.exact, r_pre) or left.exact) if left.exact is not None else l_pre
    suffix = (_cross(l_suf, right.exact) or right.exact) if right.exact is not None else r_suf
    return _Info(None, prefix, suffix, _best(l_match, r_match, _cross(l_suf, r_pre), prefix, suffix))


def _alternation(branches: list[_Info]) -> _Info:
    if all(b.exact is not None for b in branches):
        exact = frozenset().union(*(b.exact for b in branches))  # type: ignore[arg-type]
        if len(exact) <= _MAX_SET:
            return _Info(exact)
    sets = [b.sets() for b in branches]
    return _Info(None, _union([s[0] for s in sets]), _union([s[1] for s in sets]),
                 _union([_best(*s) for s in sets]))


def _repeat(low: int, high: int, body: _Info) -> _Info:
    if body.exact is not None and high is not _C.MAXREPEAT and high <= _MAX_COUNT:
        spelt: set[str] = set()
        copies: frozenset[str] | None = _NOTHING
        for count in range(high + 1):
            if count >= low:
                spelt |= copies                         # type: ignore[arg-type]
            if count < high:
                copies = _cross(copies, body.exact)     # type: ignore[arg-type]
                if copies is None:
                    break
        else:
            if len(spelt) <= _MAX_SET:
                return _Info(frozenset(spelt))
    if low == 0:
        return _UNKNOWN
    prefix, suffix, match = body.sets()
    return _Info(None, prefix, suffix, _best(match, prefix, suffix))


def _class(items: list) -> _Info:
    """A character class: exact when it holds at most four characters (``[Cc]``, ``[Tt]``)."""
    chars: set[str] = set()
    for op, value in items:
        if op is _C.LITERAL:
            chars.add(chr(value))
        elif op is _C.RANGE and value[1] - value[0] < 4:
            chars.update(map(chr, range(value[0], value[1] + 1)))
        else:                                           # NEGATE, a category, a wide range
            return _UNKNOWN
    return _Info(frozenset(chars)) if len(chars) <= 4 else _UNKNOWN


def _sequence(items) -> _Info:
    out = _EMPTY
    for op, value in items:
        out = _concat(out, _node(op, value))
    return out


def _node(op, value) -> _Info:
    if op is _C.LITERAL:
        return _Info(frozenset([chr(value)]))
    if op is _C.AT:                                     # ^ $ \b \B: zero width
        return _EMPTY
    if op is _C.IN:
        return _class(value)
    if op is _C.SUBPATTERN:
        return _sequence(value[-1])
    if op is _C.BRANCH:
        return _alternation([_sequence(branch) for branch in value[1]])
    if op in _REPEATS:
        low, high, body = value
        return _repeat(low, high, _sequence(body))
    return _UNKNOWN                                     # ., \d, \S, a negated literal, anything else


_REPEATS = tuple(op for op in (getattr(_C, name, None) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"))
                 if op is not None)


def _minimal(strings: frozenset[str]) -> tuple[str, ...]:
    """The strings no shorter one of them is part of (a line holding ``abcd`` holds ``bc``)."""
    ordered = sorted(strings, key=lambda s: (len(s), s))
    kept: list[str] = []
    for s in ordered:
        if not any(k in s for k in kept):
            kept.append(s)
    return tuple(kept)


def parse(expression: bytes):
    """Python's parse tree (``re._parser``'s ``SubPattern``) of a Hyperscan expression, its bytes
    read as Latin-1 (one character per byte, as Hyperscan reads them); None where that parser
    could read it otherwise than Hyperscan (module doc) or refuses it."""
    text = expression.decode("latin-1")
    if _UNSURE.search(text):
        return None
    try:
        return _P.parse(text, 0)
    except (_C.error, RecursionError, OverflowError, ValueError):
        return None


def gate(expression: bytes, caseless: bool) -> Gate | None:
    """The gate of a Hyperscan expression (a rule pattern as ``ftwatch.rules.patterns`` translates
    it), or None when it should be scanned as it is (module doc: no literals long enough, a lead
    literal Hyperscan does well with, or syntax this reading is not sure of).

    Args:
        expression: the regex's bytes (a literal pattern's escaped bytes too: never gated).
        caseless: the pattern's caseless flag.
    """
    if _PLAIN_LEAD.fullmatch(expression):
        return None
    tree = parse(expression)
    if tree is None:
        return None
    info = _sequence(list(tree))
    prefix, suffix, match = info.sets()
    if min(map(len, prefix)) >= MIN_LEAD_BYTES:
        return None
    best = _best(prefix, suffix, match)
    if min(map(len, best)) < MIN_GATE_BYTES:
        return None
    icase = caseless or bool(tree.state.flags & _C.SRE_FLAG_IGNORECASE) or b"(?i" in expression
    return Gate(tuple(s.encode("latin-1") for s in _minimal(best)), icase)
