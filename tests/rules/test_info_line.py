"""``judge.INFO_LINE``, written literal first for speed (issue 16), finds what ``\\bNCCL INFO\\b`` finds."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from ftwatch.rules.judge import INFO_LINE

_WORDS = re.compile(r"\bNCCL INFO\b")
_PIECES = ["NCCL INFO", "NCCL", " INFO", "INFO", "xNCCL", "INFOx", "_", " ", "\n", "é", "1", "[", "NCCL INFO_", "ÉNCCL INFO"]


@given(st.lists(st.sampled_from(_PIECES), max_size=12))
def test_the_literal_first_pattern_matches_as_the_word_pattern(pieces):
    text = "".join(pieces)
    want, got = _WORDS.search(text), INFO_LINE.search(text)
    assert (want and want.span()) == (got and got.span())


def test_an_info_line_and_its_look_alikes():
    assert INFO_LINE.search("host:1:2 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so")
    assert not INFO_LINE.search("XNCCL INFO") and not INFO_LINE.search("NCCL INFOS") and not INFO_LINE.search("NCCL WARN")
