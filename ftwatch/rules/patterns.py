"""Pattern translation and validation for the matcher's two engines (see ``ftwatch.rules.matcher``).

A rule ``Pattern`` (literal keyword or regex, optionally caseless) becomes one :class:`_Expr`: the
bytes regex Hyperscan compiles and the RE2 regex that re-checks a hit on one line, plus whether a
hit may span two lines. Regexes outside the subset both engines share, or that match an empty
line, are rejected with a reason (``_BadPattern``). Only RE2 is needed here; compiling for
Hyperscan stays in the matcher, which owns the optional ``hyperscan`` import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import re2

from ftwatch.rules.model import Pattern

_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Escapes that cannot match "\n" (beside escaped punctuation). All others count as "may".
_SAFE_ESCAPES = frozenset("dwSbBtrfae")
_FORBIDDEN_ESCAPES = {
    "A": "\\A anchors at a chunk start in Hyperscan; use ^ (a pattern matches one line)",
    "z": "\\z anchors at a chunk end in Hyperscan; use $ (a pattern matches one line)",
    "Z": "\\Z is not in the RE2/Hyperscan subset; use $ (a pattern matches one line)",
    "G": "\\G is not supported; use ^",
    "v": "\\v means a vertical tab in RE2 but any vertical space in Hyperscan; write \\x0b",
}
_NEWLINE_POSIX = frozenset(("space", "cntrl", "ascii"))
# Each byte as _escape_literal writes it: itself when a word byte, else "\\xHH".
_ESCAPED = tuple(bytes((b,)) if b in _WORD else b"\\x%02x" % b for b in range(256))
# A regex _rewrite_regex's walk would give back as it is, never spanning: no class, ``(?`` group or
# control character, and only escapes of ASCII punctuation or of the _SAFE_ESCAPES it keeps as they are.
_PLAIN_REGEX = re.compile(r"(?:[^\\\[\x00-\x1f(]|\((?!\?)|\\[dwbBtrfae]|\\[!-/:-@\[-`{-~])*")


class _BadPattern(Exception):
    """A pattern outside the shared subset; the message says why."""


@dataclass(frozen=True, slots=True)
class _Expr:
    """One pattern, translated for both engines.

    Attributes:
        hs: the Hyperscan expression (bytes); caseless goes in its flags.
        re2: the RE2 expression (bytes, Latin-1 semantics), with ``(?i)`` when caseless.
        caseless: as in the Pattern.
        may_span: True when a hit could span two lines (re-check hits with RE2).
    """

    hs: bytes
    re2: bytes
    caseless: bool
    may_span: bool


def _re2_options(max_mem: int | None = None) -> re2.Options:
    """Returns RE2 options for byte-wise matching (Latin-1), quiet on errors."""
    opts = re2.Options()
    opts.encoding = re2.Options.Encoding.LATIN1
    opts.log_errors = False
    if max_mem is not None:
        opts.max_mem = max_mem
    return opts


def _escape_literal(text: str) -> bytes:
    """Returns a regex (bytes) matching exactly the UTF-8 bytes of ``text`` on both engines.

    A table lookup per byte in C (``_ESCAPED``): every replay translates every pattern to find
    its cached database, and the generator this replaced cost ~0.06 s of a 0.93 s profiled
    replay at 10,000 rules (issue 16).
    """
    return escape_bytes(text.encode("utf-8"))


def escape_bytes(data: bytes) -> bytes:
    """A regex matching exactly ``data`` on both engines: each word byte itself, any other ``\\xHH``."""
    return b"".join(map(_ESCAPED.__getitem__, data))


def _rewrite_regex(text: str) -> tuple[str, bool]:
    """Checks a regex for the constructs the engines disagree on and translates it for RE2.

    Args:
        text: the regex as written in the rule.

    Returns:
        (the RE2 form, may_span): ``\\s``/``\\S`` become POSIX ``space`` classes so that RE2 agrees
        with Hyperscan on ``\\v``; ``may_span`` is True when the regex might match a newline.

    Raises:
        _BadPattern: a forbidden escape or a raw newline.
    """
    if _PLAIN_REGEX.fullmatch(text) is not None:
        return text, False
    return _rewrite_walk(text)


def _rewrite_walk(text: str) -> tuple[str, bool]:
    """:func:`_rewrite_regex`, character by character. A regex of ``_PLAIN_REGEX`` comes out as
    it went in, never spanning, so :func:`_rewrite_regex` skips this walk for it (issue 16: the
    walk over every regex of 10,000 rules cost ~0.05 s of a 0.93 s profiled replay; each replay
    translates every pattern to find its cached database).

    Raises:
        _BadPattern: as :func:`_rewrite_regex`.
    """
    out: list[str] = []
    may_span = False
    in_class = False
    class_first = False  # just after "[" or "[^": a "]" here is a literal
    negated = False      # the open class is "[^...]": it may match a newline unless it lists "\n"
    lists_newline = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            raise _BadPattern("contains a newline (a pattern matches one line)")
        if c == "\\" and i + 1 < n:
            e = text[i + 1]
            if e == "Q":  # \Q...\E quotes a literal
                end = text.find("\\E", i + 2)
                stop = n if end < 0 else end + 2
                if any(ord(ch) < 0x20 for ch in text[i + 2 : stop]):
                    may_span = True
                out.append(text[i:stop])
                i = stop
                class_first = False
                continue
            if e in _FORBIDDEN_ESCAPES:
                raise _BadPattern(_FORBIDDEN_ESCAPES[e])
            if e == "s":
                out.append("[:space:]" if in_class else "[[:space:]]")
                may_span = True
            elif e == "S":
                out.append("[:^space:]" if in_class else "[[:^space:]]")
            elif negated and e == "n" and not text.startswith("-", i + 2):
                out.append(c + e)
                lists_newline = True                          # [^...\n...] never matches a newline
            else:
                out.append(c + e)
                if e.isalnum() and e not in _SAFE_ESCAPES:
                    may_span = True
                if in_class and text.startswith("-", i + 2):  # a range from an escape: [\t-~]
                    may_span = True
            i += 2
            class_first = False
            continue
        if ord(c) < 0x20:
            may_span = True
        if in_class:
            if c == "]" and not class_first:
                in_class = False
                if negated and not lists_newline:
                    may_span = True
                negated = lists_newline = False
            elif c == "[" and text.startswith("[:", i):
                end = text.find(":]", i + 2)
                if end >= 0:
                    name = text[i + 2 : end]
                    if name.startswith("^") or name in _NEWLINE_POSIX:
                        may_span = True
                    out.append(text[i : end + 2])
                    i = end + 2
                    class_first = False
                    continue
            class_first = False
        elif c == "[":
            in_class = class_first = True
            if text.startswith("^", i + 1):
                negated, lists_newline = True, False
                out.append("[^")
                i += 2
                continue
        elif c == "(" and text.startswith("(?", i):
            j = i + 2
            while j < n and (text[j].isalpha() or text[j] == "-"):
                j += 1
            if "s" in text[i + 2 : j]:
                may_span = True
        out.append(c)
        i += 1
    if in_class and negated:
        may_span = True                                      # an unclosed class: RE2 refuses it anyway
    return "".join(out), may_span


def _translate(pattern: Pattern) -> _Expr:
    """Returns the expressions for both engines.

    Raises:
        _BadPattern: empty, a newline in it, or a construct outside the shared subset.
    """
    if not pattern.text:
        raise _BadPattern("empty pattern")
    try:
        pattern.text.encode("utf-8")
    except UnicodeEncodeError:
        raise _BadPattern("not valid Unicode text (a lone surrogate)") from None
    if pattern.regex:
        re2_text, may_span = _rewrite_regex(pattern.text)
        hs_expr, re2_expr = pattern.text.encode("utf-8"), re2_text.encode("utf-8")
    else:
        if "\n" in pattern.text:
            raise _BadPattern("contains a newline (a pattern matches one line)")
        hs_expr = re2_expr = _escape_literal(pattern.text)
        may_span = False
    if pattern.caseless:
        re2_expr = b"(?i)" + re2_expr
    return _Expr(hs_expr, re2_expr, pattern.caseless, may_span)


def _re2_error(exc: Exception) -> str:
    """Returns RE2's reason as text (google-re2 gives it as bytes)."""
    reason = exc.args[0] if exc.args else exc
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    return f"RE2: {reason}"


def _re2_compile(expr: _Expr, opts: re2.Options):
    """Compiles the RE2 side of a pattern.

    Raises:
        _BadPattern: RE2 rejects it, or it matches an empty line (Hyperscan accepts ``^``, ``$``,
            ``\\B`` ... that match nothing but an empty string; they would hit every blank line).
    """
    try:
        regex = re2.compile(expr.re2, opts)
    except re2.error as exc:
        raise _BadPattern(_re2_error(exc)) from None
    if regex.search(b"") is not None:
        raise _BadPattern("matches an empty line (a pattern must match at least one byte)")
    return regex
