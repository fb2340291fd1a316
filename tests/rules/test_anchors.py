"""Line-start anchors read as the newline before them (``ftwatch.rules.anchors``): the rewrite,
where it is taken and refused, and the proof that a newline-led scan finds the same lines."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from ftwatch.rules import anchors
from ftwatch.rules import matcher as matcher_mod
from ftwatch.rules.anchors import newline_led
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern

needs_hs = pytest.mark.skipif(matcher_mod._hs is None, reason="hyperscan not installed")


@pytest.mark.parametrize("regex, expected", [
    (rb"^\| +\d+ +.*\| +On", rb"\n\| +\d+ +.*\| +On"),                   # nvidia-smi's table row
    (rb"(^|[\]>] ?|: ?)F\d{4} ", rb"(\n|[\]>] ?|: ?)F\d{4} "),           # a branch where a match begins
    (rb"^Killed *$|\]Killed *$|^\[\d+\] +Killed", rb"\nKilled *$|\]Killed *$|\n\[\d+\] +Killed"),
    (rb"^a|^b", rb"\na|\nb"),                                           # Python's parser factors the ^ out
    (rb"(^|[\s\]|(])E\d{3}: ", rb"(\n|[\s\]|(])E\d{3}: "),             # nor makes a class of the branch
    (rb"(?:^x)y", rb"(?:\nx)y"),
    (rb"(?i)^error:", rb"(?i)\nerror:"),
    (rb"(?i:^error:)", rb"(?i:\nerror:)"),
    (rb"^[^A-Za-z]*Use ctrl", rb"\n[^A-Za-z]*Use ctrl"),               # a negated class is not an anchor
    (rb"^[]^]x", rb"\n[]^]x"),                                          # nor a ^ inside a class
])
def test_each_anchor_where_a_match_begins_is_written_as_a_newline(regex, expected):
    assert newline_led(regex) == expected


@pytest.mark.parametrize("regex", [
    rb"connection reset",          # no anchor
    rb"\^x", rb"[^x]y",            # an escaped ^, a negated class
    rb"x^y", rb"\s^y", rb"a(^b|c)",  # a byte of the match may come before it
    rb"^^y",                       # two anchors at one place: one newline, not two
    rb"(^a)+b", rb"(^a)?b",        # repeated: a second copy does not begin the match
    rb"(?=^a)", rb"(?m)^a", rb"(?P<n>^a)",   # lookarounds, other inline flags, named groups
    rb"[[:alpha:]]^x",             # a POSIX class: Python's parser reads it otherwise
])
def test_an_anchor_the_rewrite_could_change_leaves_the_expression_as_written(regex):
    assert newline_led(regex) is None


# -- exactness: the rewritten expression on a newline-led buffer finds the lines the original does ----

_ATOMS = st.sampled_from(["a", "b", " ", r"\s", r"\d", "[ab]", ".", "1"])


def _plain(depth: int = 1):
    """Small regexes without ``^`` over the lines' alphabet."""
    atom = _ATOMS if depth == 0 else st.one_of(_ATOMS, _ATOMS, _plain(depth - 1).map(lambda r: f"({r})"))
    piece = st.tuples(atom, st.sampled_from(["", "", "", "", "+", "?", "*", "{2}"])).map("".join)
    branch = st.lists(piece, min_size=1, max_size=3).map("".join)
    return st.lists(branch, min_size=1, max_size=2).map("|".join)


def _branch(inner):
    """``^`` then pieces (most), pieces alone, or pieces with ``^`` among them; ``inner`` may be a
    group of such branches, repeated or not, before the pieces."""
    pieces = st.lists(_plain().map(lambda p: f"({p})"), min_size=1, max_size=3)
    where = st.sampled_from(["^", "^", "^", "", "mid", "^^"])
    head = st.one_of(st.just(""), st.just(""), inner.flatmap(
        lambda r: st.sampled_from(["", "", "?", "+", "*"]).map(lambda q: f"({r}){q}")))
    return st.tuples(where, head, pieces).map(
        lambda b: (b[1] + b[2][0] + "^" + "".join(b[2][1:]) if b[0] == "mid" else b[0] + b[1] + "".join(b[2])))


def _regexes(depth: int = 1):
    """Alternations of :func:`_branch`: most rewritten, some left as written (a ``^`` after a
    byte, two at one place, one in a repeated group)."""
    inner = st.just("a") if depth == 0 else _regexes(depth - 1)
    return st.lists(_branch(inner), min_size=1, max_size=3).map("|".join)


def _lines(db, data: bytes, led: bool) -> set[int]:
    """Line starts of ``data`` where the single pattern of ``db`` has a match's end, as the matcher
    maps them (``led``: ``data`` scanned with a newline before it)."""
    scanned = b"\n" + data if led else data
    found: set[int] = set()

    def on_match(_id, _start, end, _flags, _context):
        found.add(scanned.rfind(b"\n", 0, end) + (0 if led else 1))

    db.scan(scanned, match_event_handler=on_match)
    return found


def _compile(expression: bytes):
    hs = matcher_mod._hs
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(expressions=[expression], ids=[0], flags=[hs.HS_FLAG_MULTILINE])
    return db


@needs_hs
@settings(max_examples=400, deadline=None)
@given(regex=_regexes(), lines=st.lists(st.text("ab 1", max_size=6), min_size=1, max_size=8))
def test_a_newline_led_scan_finds_the_lines_the_regex_as_written_finds(regex, lines):
    led = newline_led(regex.encode())
    if led is None or re.search(regex, ""):   # the matcher refuses a regex matching an empty line
        return
    try:
        original = _compile(regex.encode())
    except matcher_mod._hs.error:          # one Hyperscan refuses (it may match an empty buffer)
        return
    data = "\n".join(lines).encode()
    found, expected = _lines(_compile(led), data, True), _lines(original, data, False)
    if matcher_mod._translate(Pattern(regex, regex=True)).may_span:   # the matcher re-checks its lines
        compiled = re.compile(regex.encode())
        found, expected = ({s for s in lines_ if compiled.search(data[s:].split(b"\n", 1)[0])}
                           for lines_ in (found, expected))
    assert found == expected, (regex, led)


# -- the matcher -----------------------------------------------------------------------------------

@needs_hs
def test_a_line_start_pattern_hits_the_first_line_of_a_chunk_and_later_ones_never_mid_line():
    m = Matcher([Pattern(r"^\| +\d+ +Tesla", regex=True), Pattern(r"(^|\] )F\d{4} ", regex=True)], cache=False)
    data = (b"|   0  Tesla V100 | Off\n"         # 0 on the chunk's first line
            b"x |   1  Tesla V100\n"             # not at a line's start
            b"F1126 12:00:00 fatal\n"            # 1 at a line's start
            b"[w] F1126 12:00:00 fatal\n"        # 1 after "] "
            b"|   2  Tesla A100")                # 0, no newline at the end
    starts = [0, data.index(b"F1126"), data.index(b"[w]"), data.index(b"|   2")]
    assert m.scan(data) == [(starts[0], 0), (starts[1], 1), (starts[2], 1), (starts[3], 0)]


@needs_hs
def test_a_rewrite_hyperscan_refuses_is_compiled_as_written(monkeypatch):
    monkeypatch.setattr(anchors, "newline_led", lambda expression: b"(" if expression.startswith(b"^") else None)
    m = Matcher([Pattern(r"^\| +\d+", regex=True), Pattern("Tesla")], cache=False)
    assert m.scan(b"|  0 Tesla\nx |  1\n") == [(0, 0), (0, 1)]
