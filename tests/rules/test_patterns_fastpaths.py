"""The translation shortcuts of ``ftwatch.rules.patterns`` (issue 16) give what the long way gives.

``_rewrite_regex`` skips its character walk for a regex with nothing to rewrite, and
``_escape_literal`` looks each byte up in a table; both must match the walk and the byte rule.
"""

from __future__ import annotations

import pytest

from ftwatch.rules.loader import load_rules
from ftwatch.rules.patterns import _WORD, _BadPattern, _escape_literal, _rewrite_regex, _rewrite_walk


def _walk_or_error(text: str):
    try:
        return _rewrite_walk(text)
    except _BadPattern as exc:
        return ("bad", str(exc))


def _fast_or_error(text: str):
    try:
        return _rewrite_regex(text)
    except _BadPattern as exc:
        return ("bad", str(exc))


HAND = [
    "plain words (no specials)", r"a\sb", r"[^x]", r"x(?s).y", "a\tb", "a\nb", r"[[:space:]]",
    "(?i)caseless", "(group)+ and .* and $", "[]]", r"\Qa.b\E", r"\v", "a|b{2,3}?", "",
    r"\bEI0001\b", r"a\.b\(c\)", r"\\b", r"\d+\s", r"\d+\S", "x\\", r"\(?x", "a\\\nb", r"\Aa", r"\wé\é",
    r"\p{L}", r"\x41", r"\1",
]


@pytest.mark.parametrize("text", HAND)
def test_rewrite_shortcut_matches_the_walk_by_hand(text):
    assert _fast_or_error(text) == _walk_or_error(text)


def test_rewrite_shortcut_matches_the_walk_on_every_builtin_regex():
    texts = {p.text for rule in load_rules() for p in rule.patterns if p.regex}
    assert len(texts) > 50
    for text in texts:
        assert _fast_or_error(text) == _walk_or_error(text), text


def test_rewrite_shortcut_taken_only_without_specials():
    assert _rewrite_regex("NCCL error.*unhandled") == ("NCCL error.*unhandled", False)
    assert _rewrite_regex(r"a\sb") == ("a[[:space:]]b", True)
    assert _rewrite_regex(r"\bEI0001\b") == (r"\bEI0001\b", False)


def test_escape_literal_table_keeps_the_byte_rule():
    text = "".join(chr(c) for c in range(1, 0x250) if not 0xD800 <= c < 0xE000)
    want = b"".join(bytes((b,)) if b in _WORD else b"\\x%02x" % b for b in text.encode("utf-8"))
    assert _escape_literal(text) == want
    assert _escape_literal("a.b é") == b"a\\x2eb\\x20\\xc3\\xa9"
