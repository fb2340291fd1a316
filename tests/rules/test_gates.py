"""Literal gates (``ftwatch.rules.gates``): the literals every match of a regex holds, and the
matcher's gated scan, which must answer exactly as a scan with the regexes themselves (its
line-start anchors read as newlines too, ``ftwatch.rules.anchors``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import re2
from hypothesis import given, settings, strategies as st

from ftwatch.rules import gates
from ftwatch.rules import matcher as matcher_mod
from ftwatch.rules.anchors import newline_led
from ftwatch.rules.gates import gate
from ftwatch.rules.loader import load_rules
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern

needs_hs = pytest.mark.skipif(matcher_mod._hs is None, reason="hyperscan not installed")
TESTS = Path(__file__).resolve().parents[1]


def literals(regex: str, caseless: bool = False):
    found = gate(regex.encode(), caseless)
    return None if found is None else (sorted(found.literals), found.caseless)


@pytest.mark.parametrize("regex, expected", [
    # led by a class run: the literal its matches reach later (the longer of two)
    (r"\S+: line \d+: \S+: command not found", [b": command not found"]),
    # an alternation's branches share what follows them
    (r"(\.mm?|\.swift|\]):\d+: failed assertion", [b": failed assertion"]),
    # an optional character is spelt both ways, a small class each of its characters
    (r"\w+ NCCL ?WARN failed to connect", [b" NCCL WARN failed to connect", b" NCCLWARN failed to connect"]),
    (r"\d+ [Cc]onnection reset by peer", [b" Connection reset by peer", b" connection reset by peer"]),
    # a bounded repeat spelt out; a literal holding another is left out (a line with it holds the other)
    (r"\d(abc){1,3}defghij", [b"abcdefghij"]),
])
def test_a_regex_led_by_a_class_run_is_gated_on_the_literals_every_match_holds(regex, expected):
    assert literals(regex) == (expected, False)


@pytest.mark.parametrize("regex", [
    r"exitcode\s*:\s*-9\b",                       # led by its literal: Hyperscan does well with it
    r"\d+ steps",                                 # its literal is too short: on too many lines
    r"\d+ failed to connect|\d+x",                # a branch holds no long literal
    r"[[:digit:]]+ failed to allocate memory",    # a POSIX class: Python's parser reads it otherwise
    r"\d{,3} failed to allocate memory",          # {,n}: a repeat to Python, a literal to RE2
    r"\d+ failed \e to allocate memory",          # \e (escape): Python's parser refuses it
    "connection reset by peer",                   # a literal
])
def test_a_regex_hyperscan_does_well_with_or_one_not_read_surely_has_no_gate(regex):
    assert gate(regex.encode(), False) is None


def test_a_caseless_pattern_or_part_is_gated_caseless():
    assert literals(r"\d+ out of memory error", caseless=True) == ([b" out of memory error"], True)
    assert literals(r"(?i)\d+ out of memory error") == ([b" out of memory error"], True)
    assert literals(r"\d+ out of (?i:MEMORY) error")[1] is True


# -- soundness: a line a regex matches holds one of its gate's literals ------------------------------

_ATOMS = st.sampled_from(["a", "b", ":", " ", r"\d", r"\S", "[ab]", "[Aa]", ".", r"\b", "^"])


def _regexes(depth: int = 2):
    atom = _ATOMS if depth == 0 else st.one_of(_ATOMS, st.deferred(lambda: _regexes(depth - 1)).map(lambda r: f"({r})"))
    piece = st.tuples(atom, st.sampled_from(["", "", "", "?", "*", "+", "{2}", "{1,3}", "{0,2}"])).map(
        lambda p: p[0] + p[1] if p[0] not in (r"\b", "^") else p[0])
    branch = st.lists(piece, min_size=1, max_size=6).map("".join)
    return st.lists(branch, min_size=1, max_size=3).map("|".join)


@settings(max_examples=400, deadline=None)
@given(regex=_regexes(), lines=st.lists(st.text("ab: 1xA", max_size=12), min_size=1, max_size=12))
def test_every_line_a_regex_matches_holds_a_literal_of_its_gate(monkeypatch_gates, regex, lines):
    """The reading itself, with every literal long enough and no lead too long (the bounds in
    force would gate almost none of these small regexes). The lines are matched by RE2, as the
    matcher re-checks a gated hit: Python's ``re`` backtracks exponentially on some of these
    regexes (nested repeats that fail, ``((\\S*)*)*:``), and one such example once ran for
    minutes. RE2 reads them alike on these lines (ASCII, no ``\\v``, no newline); one it refuses
    is no example."""
    found = gate(regex.encode(), False)
    if found is None:
        return
    try:
        compiled = re2.compile(regex.encode())
    except re2.error:
        return
    for line in lines:
        data = line.encode()
        if compiled.search(data):
            assert any(literal in data for literal in found.literals), (regex, line, found.literals)


@pytest.fixture(scope="module")
def monkeypatch_gates():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gates, "MIN_GATE_BYTES", 1)
        mp.setattr(gates, "MIN_LEAD_BYTES", 1_000)
        yield


# -- the matcher's gated scan ---------------------------------------------------------------------

GATED = [Pattern(r"\S+: line \d+: \S+: command not found", regex=True),
         Pattern(r"(\.mm?|\]):\d+: failed assertion", regex=True),
         Pattern(r"\w\s+Traceback \(most recent call last\)\s*$", regex=True),     # may span: re-checked
         Pattern("plain keyword"),
         Pattern(r"\d+ [Cc]onnection reset by peer", regex=True, caseless=True)]


@needs_hs
def test_a_gated_pattern_hits_the_lines_it_matches_and_not_those_that_only_hold_its_literal():
    m = Matcher(GATED, cache=False)
    assert m._verify is not None                  # these are gated
    data = (b"run.sh: line 3: foo: command not found\n"            # 0
            b"just: command not found\n"                            # literal, no match
            b"x.mm:12: failed assertion `y` plain keyword\n"        # 1 and 3 on one line
            b"step 7 done  Traceback (most recent call last)\n"     # 2
            b"Traceback (most recent call last)\n"                  # literal, no match
            b"7 CONNECTION RESET BY PEER")                          # 4 (caseless), no newline at the end
    starts = [0, data.index(b"x.mm"), data.index(b"step 7"), data.index(b"7 CONN")]
    assert m.scan(data) == [(starts[0], 0), (starts[1], 1), (starts[1], 3), (starts[2], 2), (starts[3], 4)]
    assert m.scan(b"nothing here\n: command not found\n") == []


def _as_written(db, data: bytes, recheck: dict) -> list[tuple[int, int]]:
    """One database of the patterns as written, scanned over ``data`` alone (no gate, no newline
    before it, ``ftwatch.rules.anchors``), each match's line found from its end, the lines of a
    pattern that may span re-checked with RE2: what the matcher answered before either."""
    hits = set()

    def on_match(pattern_id, _start, end, _flags, _context):
        hits.add((data.rfind(b"\n", 0, end) + 1, pattern_id))

    db.scan(data, match_event_handler=on_match)
    for start, pattern_id in [h for h in hits if h[1] in recheck]:
        stop = data.find(b"\n", start)
        if recheck[pattern_id].search(data[start:stop if stop >= 0 else len(data)]) is None:
            hits.discard((start, pattern_id))
    return sorted(hits)


@needs_hs
def test_the_gated_scan_answers_as_the_regexes_themselves_on_every_log_of_the_tests():
    """The built-in rules over every recorded log the tests hold (goldens, the evaluation corpus):
    the same (line, pattern) pairs as one database of the patterns as written (the scan's is
    gated and its ``^`` read as newlines)."""
    m = Matcher([p for r in load_rules() for p in r.patterns], cache=False)
    assert m._verify is not None
    exprs = [matcher_mod._translate(p) for p in m.patterns]
    assert sum(newline_led(e.hs) is not None for e in exprs) > 20
    plain = matcher_mod._hs_compile(exprs)
    logs = sorted(p for p in (TESTS / "golden").rglob("*") if p.suffix in (".log", ".err", ".out"))
    logs += sorted((TESTS / "corpus").rglob("*.log"))
    assert len(logs) > 1000
    hits = 0
    for path in logs:
        data = path.read_bytes()
        expected = _as_written(plain, data, m._recheck)
        assert m.scan(data) == expected, path
        hits += len(expected)
    assert hits > 10_000
