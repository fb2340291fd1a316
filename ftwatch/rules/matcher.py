"""Finds which patterns match which lines of a chunk, with one multi-pattern database.

All literal keywords and regexes of all rules are compiled together, once. A chunk of complete
lines is scanned in one call, and Python only sees the (line, pattern) pairs that matched: it never
loops over non-matching lines or over rules (DESIGN.md, "Speed on the hot path").

Backends:
    ``hyperscan`` (primary): block mode over the whole chunk, ``HS_FLAG_MULTILINE``; a match's end
        offset is mapped to the start of its line. Several million lines/s.
    ``re2`` (fallback, when hyperscan cannot be imported, or ``backend="re2"``, or the environment
        variable ``FTWATCH_MATCHER=re2``): google-re2's ``re2.Set``, one call per line.

Semantics, identical on both backends:
    * A pattern matches within one line, never across ``\\n``; ``^`` and ``$`` anchor at the line's
      start and end (``$`` does not skip a ``\\r``: ``error$`` misses ``"error\\r"``).
    * Matching is byte-wise on the UTF-8 encoding of the pattern, so lines may hold invalid UTF-8,
      NUL or anything. Consequences: ``.`` matches one byte, a quantifier after a non-ASCII character
      repeats its last byte (write ``(?:中)+``), ``[中文]`` is a class of six bytes, and case folding
      (``caseless``, ``(?i)``) is ASCII-only. ``\\s`` also matches the vertical tab (as in PCRE).
    * A regex must compile on both engines (the subset shared by RE2 and Hyperscan), must not
      match an empty line (``^$``, ``x?$``), and must not use ``\\A``, ``\\z``, ``\\Z``, ``\\G``
      (use ``^`` and ``$``) nor ``\\v`` (RE2 and Hyperscan disagree on it; write ``\\x0b``).

Hyperscan reports every end offset of every pattern, so a pattern that can match a newline
(``\\s``, ``[^x]``, ``\\W`` ...) may produce a hit that spans two lines; such patterns are found
when compiling (conservatively, from their syntax) and their hits are re-checked on the one line
with RE2. That costs only on hits, and keeps the answer exact.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass

import re2

from ftwatch.rules.model import Pattern

try:  # hyperscan wheels exist for x86_64 only (pyproject.toml)
    import hyperscan as _hs
except ImportError:  # pragma: no cover - depends on the host
    _hs = None

BACKENDS: tuple[str, ...] = ("hyperscan", "re2")
"""The backend names ``Matcher`` accepts."""

ENV_VAR = "FTWATCH_MATCHER"
"""Environment variable that picks the backend when none is passed (``re2`` or ``hyperscan``)."""

_RE2_SET_MAX_MEM = 256 << 20  # bytes; RE2::Set silently fails a match when its DFA runs out
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
    """Returns a regex (bytes) matching exactly the UTF-8 bytes of ``text`` on both engines."""
    return b"".join(bytes((b,)) if b in _WORD else b"\\x%02x" % b for b in text.encode("utf-8"))


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
    out: list[str] = []
    may_span = False
    in_class = False
    class_first = False  # just after "[" or "[^": a "]" here is a literal
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
                may_span = True
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


def _hs_compile(exprs: Sequence[_Expr]):
    """Compiles a Hyperscan block-mode database (raises ``hyperscan.error``)."""
    db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
    flags = [_hs.HS_FLAG_MULTILINE | (_hs.HS_FLAG_CASELESS if e.caseless else 0) for e in exprs]
    db.compile(expressions=[e.hs for e in exprs], ids=list(range(len(exprs))), flags=flags)
    return db


def _hs_first_error(exprs: Sequence[_Expr]) -> tuple[int, str] | None:
    """Returns (index, reason) of the first expression Hyperscan rejects alone, else None."""
    for i, e in enumerate(exprs):
        try:
            _hs_compile([e])
        except _hs.error as exc:
            reason = str(exc)
            if "matches empty buffer" in reason:
                reason = "matches the empty string, so it would match every line"
            return i, f"Hyperscan: {reason}"
    return None


@functools.lru_cache(maxsize=8192)
def _check(pattern: Pattern) -> str | None:
    """Returns why ``pattern`` is invalid on either engine, or None (see ``Matcher.check``)."""
    try:
        expr = _translate(pattern)
        _re2_compile(expr, _re2_options())
    except _BadPattern as exc:
        return str(exc)
    if _hs is not None:
        first = _hs_first_error([expr])
        if first is not None:
            return first[1]
    return None


def _choose_backend(backend: str | None) -> str:
    """Returns the backend to use: the argument, else ``$FTWATCH_MATCHER``, else the best available.

    Raises:
        ValueError: an unknown backend name.
        ImportError: hyperscan asked for but not installed.
    """
    choice = backend or os.environ.get(ENV_VAR) or None
    if choice is None:
        return "hyperscan" if _hs is not None else "re2"
    if choice not in BACKENDS:
        raise ValueError(f"unknown matcher backend {choice!r}; expected one of {', '.join(BACKENDS)}")
    if choice == "hyperscan" and _hs is None:
        raise ImportError("matcher backend 'hyperscan' asked for, but hyperscan cannot be imported")
    return choice


class Matcher:
    """A compiled set of patterns that finds, per line of a chunk, every pattern that matches.

    Pattern ids are indexes into ``patterns``. Compiling takes about 0.15 s for 300 patterns and
    2-3 s for 10,000 (mostly Hyperscan; a 2-vCPU EPYC); scanning compiles nothing.

    Not to be scanned from two threads at once: a Matcher owns one Hyperscan scratch space. Give
    each thread its own Matcher (the re2 backend happens to be thread-safe; do not rely on it).

    Attributes:
        backend: ``"hyperscan"`` or ``"re2"``.
        patterns: the patterns, as given (a tuple).
    """

    def __init__(self, patterns: Sequence[Pattern], backend: str | None = None):
        """Compiles the patterns.

        Args:
            patterns: what to look for; a pattern's id is its index here. May be empty.
            backend: ``"hyperscan"``, ``"re2"``, or None for ``$FTWATCH_MATCHER`` else the best
                available.

        Raises:
            ValueError: ``pattern {i}: {text!r}: {reason}`` for the first pattern that is invalid
                on either engine (checked on both whenever hyperscan is installed, whichever
                backend is used); a set too large for Hyperscan; an unknown backend name.
            ImportError: ``backend="hyperscan"`` where hyperscan is not installed.
        """
        self.backend: str = _choose_backend(backend)
        self.patterns: tuple[Pattern, ...] = tuple(patterns)
        opts = _re2_options()
        exprs: list[_Expr] = []
        regexes: list = []
        bad: tuple[int, str] | None = None
        for i, pattern in enumerate(self.patterns):
            try:
                expr = _translate(pattern)
                regexes.append(_re2_compile(expr, opts))
            except _BadPattern as exc:
                bad = (i, str(exc))
                break
            exprs.append(expr)
        db = None
        if _hs is not None and exprs:  # validate on Hyperscan too, up to the first RE2 failure
            try:
                db = _hs_compile(exprs)
            except _hs.error as exc:
                bad = _hs_first_error(exprs)
                if bad is None:  # each compiles alone; the set as a whole does not
                    raise ValueError(f"patterns: Hyperscan cannot compile the set: {exc}") from None
        if bad is not None:
            i, reason = bad
            raise ValueError(f"pattern {i}: {self.patterns[i].text!r}: {reason}")

        self._db = self._scratch = self._set = None
        self._recheck: dict[int, object] = {}
        if not exprs:
            return
        if self.backend == "hyperscan":
            self._db = db
            self._scratch = _hs.Scratch(db)
            self._recheck = {i: rx for i, (e, rx) in enumerate(zip(exprs, regexes)) if e.may_span}
        else:
            self._set = re2.Set.SearchSet(_re2_options(_RE2_SET_MAX_MEM))
            for e in exprs:
                self._set.Add(e.re2)
            self._set.Compile()

    @staticmethod
    def check(pattern: Pattern) -> str | None:
        """Says why a pattern would not compile on both engines (for the rule loader's file:line).

        Without hyperscan installed, only the RE2 side and the subset rules are checked. Costs
        about 1 ms per new pattern (a Hyperscan compile); answers are cached.

        Args:
            pattern: one pattern.

        Returns:
            An error message, or None when the pattern is valid.
        """
        return _check(pattern)

    def scan(self, data: bytes) -> list[tuple[int, int]]:
        """Finds every (line, pattern) match in a chunk of lines.

        Args:
            data: complete lines separated by ``b"\\n"`` (the last may lack it); any bytes.

        Returns:
            Sorted, unique ``(line_start_offset, pattern_id)`` pairs, the offset in bytes into
            ``data`` of the first byte of the matching line.
        """
        if self._db is not None:
            return self._scan_hs(data)
        if self._set is not None:
            return self._scan_re2(data)
        return []

    def match_text(self, text: str) -> set[int]:
        """Returns the ids of the patterns that match any line of ``text`` (lines joined by ``\\n``)."""
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "replace")
        return {pattern_id for _, pattern_id in self.scan(data)}

    def _scan_hs(self, data: bytes) -> list[tuple[int, int]]:
        """Scans the whole chunk with Hyperscan; Python runs once per match, never per line."""
        hits: set[tuple[int, int]] = set()
        add = hits.add
        rfind = data.rfind

        def on_match(pattern_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
            add((rfind(b"\n", 0, end) + 1, pattern_id))

        self._db.scan(data, match_event_handler=on_match, scratch=self._scratch)
        if self._recheck and hits:
            recheck = self._recheck
            for hit in [h for h in hits if h[1] in recheck]:
                start, pattern_id = hit
                stop = data.find(b"\n", start)
                if recheck[pattern_id].search(data[start : stop if stop >= 0 else len(data)]) is None:
                    hits.discard(hit)
        return sorted(hits)

    def _scan_re2(self, data: bytes) -> list[tuple[int, int]]:
        """Scans line by line with the RE2 set (the fallback; Python loops over lines here)."""
        out: list[tuple[int, int]] = []
        match = self._set.Match
        offset = 0
        for line in data.split(b"\n"):
            if line:
                ids = match(line)
                if ids:
                    out.extend((offset, pattern_id) for pattern_id in sorted(ids))
            offset += len(line) + 1
        return out
