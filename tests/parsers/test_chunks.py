"""A chunk read as a whole (``ftwatch.parsers.chunks``): its line count and its last time of day,
each against the plain reading it makes faster (issue 16)."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftwatch.parsers import chunks

# what ``chunks.last_clock`` replaced (issue 16): the greedy regex that backtracks from the span's end
_BACKTRACKING_LAST_CLOCK = re.compile(rb"(?s).*(\d\d:\d\d:\d\d)")


@given(st.binary(max_size=80).map(lambda b: bytes(b"0123456789:: \na"[x % 15] for x in b)),
       st.integers(0, 80), st.integers(0, 80), st.sampled_from([1, 2, 3, 5, 8, 256]))
def test_last_clock_finds_what_the_backtracking_regex_finds(data, a, b, first):
    """Every span of text dense with digits and colons (overlapping clocks), its first window
    ``first`` bytes (so that clocks fall across the windows' borders at every width): the same
    offset as the regex's group 1, -1 for its None."""
    lo, hi = sorted((min(a, len(data)), min(b, len(data))))
    m = _BACKTRACKING_LAST_CLOCK.match(data, lo, hi)
    kept = chunks._FIRST_LOOK
    chunks._FIRST_LOOK = first
    try:
        assert chunks.last_clock(data, lo, hi) == (-1 if m is None else m.start(1))
    finally:
        chunks._FIRST_LOOK = kept


@pytest.mark.parametrize("first", [1, 2, 3, 5, 8, 13])
def test_last_clock_finds_one_clock_at_every_place_about_the_windows_borders(first):
    """One clock at every offset of 60 bytes of text without one, the first window ``first`` bytes,
    the span cut at every end: the clock is found exactly where it ends by the span's end."""
    kept = chunks._FIRST_LOOK
    chunks._FIRST_LOOK = first
    try:
        for at in range(53):
            data = b"a: 1" * 4 + b"x" * at + b"12:34:56" + b" :9" * 10
            data = data[16:16 + 60]
            for hi in range(len(data) + 1):
                m = _BACKTRACKING_LAST_CLOCK.match(data, 0, hi)
                assert chunks.last_clock(data, 0, hi) == (-1 if m is None else m.start(1)), (at, hi)
    finally:
        chunks._FIRST_LOOK = kept


@pytest.mark.parametrize("far", [0, 250, 256, 257, 1_300, 5_000, 40_000])
def test_last_clock_reaches_a_clock_far_back_across_the_windows(far):
    """A clock ``far`` bytes of untimed lines before the span's end (the windows grow 4x from 256
    bytes): found wherever it falls, and not one of them before ``lo``."""
    head = b"[default0]:12:00:01 started\n"
    lines = b"".join(b"[default0]:step %d/9 loss 0.5\n" % i for i in range(far // 30 + 1))[:far]
    data = head + lines
    assert chunks.last_clock(data, 0, len(data)) == head.index(b"12:00:01")
    assert chunks.last_clock(data, head.index(b"12:00:01") + 1, len(data)) == -1
    assert chunks.last_clock(data, 0, head.index(b"12:00:01") + 7) == -1     # it must end by ``hi``


@given(st.binary(max_size=6000).map(lambda b: bytes(b"\nab"[x % 3] for x in b)),
       st.integers(-50, 6100), st.one_of(st.none(), st.integers(-50, 6100)))
def test_newlines_counts_as_bytes_count_does(data, start, end):
    """Short and long spans (a replace from ``_REPLACE_FROM`` bytes on), whole data, negative and
    past-the-end offsets: ``bytes.count``'s answer."""
    assert chunks.newlines(data, start, end) == data.count(b"\n", start, end)
    assert chunks.newlines(data) == data.count(b"\n")


def test_newlines_counts_long_spans_as_bytes_count_does():
    rnd = random.Random(16)
    data = bytes(rnd.choice(b"\n\nabc ") for _ in range(20_000))
    for start, end in [(0, None), (0, len(data)), (1, None), (0, 2048), (1, 2049), (100, 19_999), (0, 99_999),
                       (5_000, 7_047), (5_000, 7_048), (5_000, 7_049), (-3_000, None), (20_000, None)]:
        assert chunks.newlines(data, start, end) == data.count(b"\n", start, end), (start, end)
