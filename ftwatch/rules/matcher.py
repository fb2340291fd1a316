"""Finds which patterns match which lines of a chunk, with one multi-pattern database.

All literal keywords and regexes of all rules are compiled together, once. A chunk of complete
lines is scanned in one call, and Python only sees the (line, pattern) pairs that matched: it never
loops over non-matching lines or over rules (DESIGN.md, "Speed on the hot path").

Backends:
    ``hyperscan`` (primary): block mode over the whole chunk (a newline before it, for the
        ``^`` read as newlines, ``ftwatch.rules.anchors``), ``HS_FLAG_MULTILINE``; a match's end
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

Compiled databases are cached on disk (``ftwatch.rules.diskcache``: ``$FTWATCH_CACHE_DIR``, else
``$XDG_CACHE_HOME/ftwatch`` or ``~/.cache/ftwatch``; ``FTWATCH_CACHE_DIR=off`` turns it off),
keyed by the patterns' content, their flags, the Hyperscan version and the machine type (a file
whose database this CPU cannot run is compiled over), so a start with the same
rules deserializes the database instead of compiling it (10,000 rules: seconds -> tens of ms).
A database is only stored once every pattern passed both engines' checks, so a cached one is a
valid one; an unreadable or stale file is compiled over.

A regex Hyperscan scans slowly, one that begins with a class run and reaches its rare literal
only later, is *gated* (``ftwatch.rules.gates``): the scan looks for its literals instead, and
the lines holding one are scanned again, joined, with a second database of the gated regexes
themselves. The answer is the same; the scan of ``make bench``'s corpus is ~30 % faster.

Hyperscan reports every end offset of every pattern, so a pattern that can match a newline
(``\\s``, ``[^x]``, ``\\W`` ...) may produce a hit that spans two lines; such patterns are found
when compiling (conservatively, from their syntax) and their hits are re-checked on the one line
with RE2. That costs only on hits, and keeps the answer exact.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
from collections.abc import Sequence
from itertools import accumulate

import msgpack
import re2

from ftwatch.rules import anchors, diskcache, gates
from ftwatch.rules.model import Pattern
from ftwatch.rules.patterns import _BadPattern, _Expr, _re2_compile, _re2_options, _translate, escape_bytes

try:  # hyperscan wheels exist for x86_64 only (pyproject.toml)
    import hyperscan as _hs
except ImportError:  # pragma: no cover - depends on the host
    _hs = None

BACKENDS: tuple[str, ...] = ("hyperscan", "re2")
"""The backend names ``Matcher`` accepts."""

ENV_VAR = "FTWATCH_MATCHER"
"""Environment variable that picks the backend when none is passed (``re2`` or ``hyperscan``)."""

_RE2_SET_MAX_MEM = 256 << 20  # bytes; RE2::Set silently fails a match when its DFA runs out
_TRIM_PATTERNS = 1000   # a set this large: its compile (or load) and the rules' loading leave tens of MiB free


def _trim_heap() -> None:
    """Hand the C heap's free memory back to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    A large set's Hyperscan compile, its deserialization and the loading of its rules before it
    free tens of MiB that glibc keeps mapped: 10,000 rules, 100 -> 64 MiB RSS after the engine is
    built (``watch``'s goal is 150 MB with 1,000 instances, issue 16). Takes microseconds.
    """
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):    # not glibc (musl, macOS): nothing to trim with
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


def _hs_compile(exprs: Sequence[_Expr], ids: Sequence[int] | None = None):
    """Compiles a Hyperscan block-mode database of ``exprs``, each reported as its id in ``ids``
    (default: its index). Raises ``hyperscan.error``."""
    db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
    flags = [_hs.HS_FLAG_MULTILINE | (_hs.HS_FLAG_CASELESS if e.caseless else 0) for e in exprs]
    db.compile(expressions=[e.hs for e in exprs], ids=list(range(len(exprs))) if ids is None else list(ids),
               flags=flags)
    return db


def _hs_compile_gated(exprs: Sequence[_Expr]):
    """The scan's databases (module doc, ``ftwatch.rules.gates``): (main, verify). ``main`` holds
    every pattern not gated, each reported as its index and led by a newline where it begins
    with ``^`` (``ftwatch.rules.anchors``: it scans a chunk with a newline before it), and the
    gated ones' literals, all reported as ``len(exprs)``; ``verify`` the gated patterns
    themselves, each reported as its index (None: none is gated). Raises ``hyperscan.error``."""
    plan = {i: g for i, g in enumerate(gates.gate(e.hs, e.caseless) for e in exprs) if g is not None}
    main = [e for i, e in enumerate(exprs) if i not in plan]
    ids = [i for i in range(len(exprs)) if i not in plan]
    literals = {(literal, g.caseless) for g in plan.values() for literal in g.literals}
    for literal, caseless in sorted(literals):
        main.append(_Expr(escape_bytes(literal), b"", caseless, False))
        ids.append(len(exprs))
    led = [e if (hs := anchors.newline_led(e.hs)) is None else dataclasses.replace(e, hs=hs) for e in main]
    try:
        main_db = _hs_compile(led, ids)
    except _hs.error:       # a rewrite Hyperscan refuses: as written (a newline-led buffer scans those alike)
        main_db = _hs_compile(main, ids)
    return main_db, (_hs_compile([exprs[i] for i in plan], list(plan)) if plan else None)


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


class PatternError(ValueError):
    """A pattern the matcher refuses: ``index`` in the patterns given, ``reason`` its text and why;
    ``str()`` is ``pattern <index>: <reason>``."""

    def __init__(self, index: int, reason: str):
        super().__init__(f"pattern {index}: {reason}")
        self.index, self.reason = index, reason


MATCH_TEXT_CACHE = 4096  # texts whose match_text answers a Matcher keeps
MATCH_TEXT_CHARS = 2048  # longer texts are scanned each time (a cache of them could hold megabytes)
_SURE_LITERAL = 4096    # bytes of a literal's escaped form that RE2 surely compiles


def _needs_re2_check(pattern: Pattern, expr: _Expr) -> bool:
    """Whether RE2 must compile ``pattern`` to know it valid (``_check_re2``): a regex, or a
    literal longer than ``_SURE_LITERAL``."""
    return pattern.regex or len(expr.re2) > _SURE_LITERAL


@functools.lru_cache(maxsize=8192)
def _check_re2(pattern: Pattern) -> str | None:
    """Returns why ``pattern`` is outside the subset or invalid on RE2, or None.

    A literal of up to ``_SURE_LITERAL`` bytes is only translated (which refuses an empty one,
    a newline, a lone surrogate): its form is word bytes and ``\\xNN`` escapes, which RE2 always
    compiles to a non-empty match, so compiling it would only cost time (10,000 rules, mostly
    literals: ~0.25 s per pass); a longer one is compiled (RE2's memory bound)."""
    try:
        expr = _translate(pattern)
        if _needs_re2_check(pattern, expr):
            _re2_compile(expr, _re2_options())
    except _BadPattern as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=8192)
def _check(pattern: Pattern) -> str | None:
    """Returns why ``pattern`` is invalid on either engine, or None (see ``Matcher.check``)."""
    problem = _check_re2(pattern)
    if problem is None and _hs is not None:
        first = _hs_first_error([_translate(pattern)])
        if first is not None:
            return first[1]
    return problem


def _hs_bad(exprs: Sequence[_Expr], index: Sequence[int]) -> list[tuple[int, str]]:
    """(index, reason) of each expression Hyperscan rejects alone, found by halving the set:
    one compile per half that fails, so a set with one bad pattern costs ~2 log2(n) compiles."""
    try:
        _hs_compile([exprs[i] for i in index])
        return []
    except _hs.error:
        pass
    if len(index) == 1:
        first = _hs_first_error([exprs[index[0]]])
        return [] if first is None else [(index[0], first[1])]
    half = len(index) // 2
    return _hs_bad(exprs, index[:half]) + _hs_bad(exprs, index[half:])


# -- the on-disk database cache (ftwatch.rules.diskcache) ------------------------------------

def _db_key(exprs: Sequence[_Expr]) -> str:
    """The cache key of a database: the expressions, their flags, the Hyperscan version (and the
    gates' bounds: the stored pair is the gated one, ``_hs_compile_gated``)."""
    digest = hashlib.sha256(f"ftwatch-hs-3 {getattr(_hs, '__version__', '?')} {platform.machine()} "
                            f"{gates.MIN_GATE_BYTES} {gates.MIN_LEAD_BYTES} {len(exprs)}\n".encode())
    for e in exprs:
        digest.update(b"%d %d %d\n" % (len(e.hs), e.caseless, e.may_span))
        digest.update(e.hs)
    return digest.hexdigest()


def database_key(tag: str, parts: Sequence[bytes]) -> str:
    """The cache key of another Hyperscan database than the matcher's (``tag`` names whose, e.g.
    ``ftwatch.policy.progresslines``'): its parts (expressions, ids, flags, as bytes), the
    Hyperscan version and the machine."""
    digest = hashlib.sha256(f"{tag} {getattr(_hs, '__version__', '?')} {platform.machine()} {len(parts)}\n".encode())
    for part in parts:
        digest.update(b"%d\n" % len(part))
        digest.update(part)
    return digest.hexdigest()


def store_database(key: str, db) -> None:
    """Keep compiled ``db`` on disk under ``key`` (``ftwatch.rules.diskcache``; never raises)."""
    diskcache.store("hyperscan", key, "hsdb", _hs.dumpb(db))


def _store_pair(key: str, main, verify) -> None:
    """Keep the matcher's databases (``_hs_compile_gated``) on disk under ``key``, in one file."""
    diskcache.store("hyperscan", key, "hsdb",
                    msgpack.packb([_hs.dumpb(main), None if verify is None else _hs.dumpb(verify)]))


def _load_pair(key: str):
    """The matcher's cached (main, verify) databases for ``key``, or None (missing, unreadable,
    or not loadable here)."""
    data = diskcache.read("hyperscan", key, "hsdb")
    if data is None:
        return None
    try:
        main, verify = msgpack.unpackb(data)
        pair = [None if blob is None else _hs.loadb(blob, _hs.HS_MODE_BLOCK) for blob in (main, verify)]
        for db in pair:
            if db is not None:
                _hs.Scratch(db)     # refused for a database built for another CPU (a cache on a shared home)
        return tuple(pair) if pair[0] is not None else None
    except (_hs.error, TypeError, ValueError, msgpack.UnpackException):
        return None


def load_database(key: str):
    """The cached database ``store_database`` kept for ``key``, or None (missing, unreadable, or
    not loadable). The matcher's own are a pair (``_load_pair``)."""
    data = diskcache.read("hyperscan", key, "hsdb")
    if data is None:
        return None
    try:
        db = _hs.loadb(data, _hs.HS_MODE_BLOCK)
        _hs.Scratch(db)     # refused for a database built for another CPU (a cache on a shared home)
        return db
    except (_hs.error, TypeError, ValueError):
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

    def __init__(self, patterns: Sequence[Pattern], backend: str | None = None, cache: bool = True):
        """Compiles the patterns.

        Args:
            patterns: what to look for; a pattern's id is its index here. May be empty.
            backend: ``"hyperscan"``, ``"re2"``, or None for ``$FTWATCH_MATCHER`` else the best
                available.
            cache: look the database up in, and store it to, the disk cache (False: a few
                patterns, compiled in milliseconds, that would only push out the files of the
                large sets a start reads).

        Raises:
            PatternError (a ValueError): ``pattern {i}: {text!r}: {reason}`` for the first pattern that is invalid
                on either engine (checked on both whenever hyperscan is installed, whichever
                backend is used); a set too large for Hyperscan; an unknown backend name.
            ImportError: ``backend="hyperscan"`` where hyperscan is not installed.
        """
        self.backend: str = _choose_backend(backend)
        self.patterns: tuple[Pattern, ...] = tuple(patterns)
        opts = _re2_options()
        pair = key = None
        exprs: list[_Expr] = []
        try:
            exprs = [_translate(pattern) for pattern in self.patterns]
        except _BadPattern:
            pass                        # reported in order with RE2's problems below
        if _hs is not None and exprs and cache:   # a cached database: every pattern passed both engines
            key = _db_key(exprs)
            pair = _load_pair(key)
        if pair is None:
            exprs, pair = self._compile(opts)
            if pair is not None and key is not None:
                _store_pair(key, *pair)

        self._texts: dict[str, frozenset[int]] = {}   # match_text's answers
        self._db = self._scratch = self._set = self._verify = self._verify_scratch = None
        self._gate_id = len(exprs)          # what ``_db`` reports for a gated pattern's literal
        self._recheck: dict[int, object] = {}
        if not exprs:
            return
        if self.backend == "hyperscan":
            self._db, self._verify = pair
            self._scratch = _hs.Scratch(self._db)
            if self._verify is not None:
                self._verify_scratch = _hs.Scratch(self._verify)
            self._recheck = {i: _re2_compile(e, opts) for i, e in enumerate(exprs) if e.may_span}
        else:
            self._set = re2.Set.SearchSet(_re2_options(_RE2_SET_MAX_MEM))
            for e in exprs:
                self._set.Add(e.re2)
            self._set.Compile()
        if len(exprs) >= _TRIM_PATTERNS:
            _trim_heap()

    def _compile(self, opts) -> tuple[list[_Expr], tuple | None]:
        """Validates every pattern on both engines and compiles the Hyperscan databases
        (``_hs_compile_gated``'s pair; None without hyperscan). Raises ValueError as
        ``__init__`` documents."""
        exprs: list[_Expr] = []
        bad: tuple[int, str] | None = None
        for i, pattern in enumerate(self.patterns):
            try:
                expr = _translate(pattern)
                if _needs_re2_check(pattern, expr):
                    _re2_compile(expr, opts)
            except _BadPattern as exc:
                bad = (i, str(exc))
                break
            exprs.append(expr)
        pair = None
        if _hs is not None and exprs:  # validate on Hyperscan too, up to the first RE2 failure
            try:
                pair = _hs_compile_gated(exprs)
            except _hs.error as exc:
                bad = _hs_first_error(exprs)
                if bad is None:  # each compiles alone; the set as a whole does not
                    raise ValueError(f"patterns: Hyperscan cannot compile the set: {exc}") from None
        if bad is not None:
            i, reason = bad
            raise PatternError(i, f"{self.patterns[i].text!r}: {reason}")
        return exprs, pair

    @staticmethod
    def engines() -> str:
        """What ``check`` answers depend on besides the pattern: ``"re2"``, or ``"re2+hyperscan
        <version>"`` when Hyperscan is installed (part of the rule cache's key)."""
        return "re2" if _hs is None else f"re2+hyperscan {getattr(_hs, '__version__', '?')}"

    @staticmethod
    def check_many(patterns: Sequence[Pattern], hyperscan: bool = True) -> list[str | None]:
        """``check`` for many patterns at once (the rule loader's): RE2 per pattern, then one
        Hyperscan compile of all that passed (none when the cache has seen this set valid);
        only when that fails is the set halved to find the patterns Hyperscan rejects.

        Args:
            patterns: the patterns.
            hyperscan: False: RE2's side only (the built-in packs: their Hyperscan side is the
                engine's compile, ``ftwatch.rules.loader.load_rules``).

        Returns:
            Per pattern, an error message or None.
        """
        out = [_check_re2(p) for p in patterns]
        if _hs is None or not hyperscan:
            return out
        index = [i for i, problem in enumerate(out) if problem is None]
        if not index:
            return out
        exprs = [_translate(patterns[i]) for i in index]
        key = _db_key(exprs)
        if diskcache.has("hyperscan", key, "ok"):
            return out
        bad = _hs_bad(exprs, list(range(len(exprs))))
        for k, reason in bad:
            out[index[k]] = reason
        if not bad:
            diskcache.store("hyperscan", key, "ok", b"")
        return out

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

    def match_text(self, text: str) -> frozenset[int]:
        """Returns the ids of the patterns that match any line of ``text`` (lines joined by ``\\n``).

        Answers are kept (up to ``MATCH_TEXT_CACHE`` texts of at most ``MATCH_TEXT_CHARS``
        characters, then forgotten all at once): the judge
        asks about a traceback's lines again for each rule it weighs, and the ranks of a job print
        the same lines."""
        if len(text) > MATCH_TEXT_CHARS:
            return self._match_text(text)
        found = self._texts.get(text)
        if found is None:
            if len(self._texts) >= MATCH_TEXT_CACHE:
                self._texts.clear()
            found = self._texts[text] = self._match_text(text)
        return found

    def _match_text(self, text: str) -> frozenset[int]:
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "replace")
        return frozenset(pattern_id for _, pattern_id in self.scan(data))

    def _scan_hs(self, data: bytes) -> list[tuple[int, int]]:
        """Scans the whole chunk with Hyperscan, a newline before it (``ftwatch.rules.anchors``:
        the newline before each line at offset ``o`` of the chunk is at offset ``o`` of what is
        scanned); Python runs once per match, never per line."""
        hits: set[tuple[int, int]] = set()
        add = hits.add
        led = b"\n" + data
        rfind = led.rfind

        def on_match(pattern_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
            add((rfind(b"\n", 0, end), pattern_id))

        self._db.scan(led, match_event_handler=on_match, scratch=self._scratch)
        del led
        if self._verify is not None and hits:
            self._verify_gated(data, hits)
        if self._recheck and hits:
            recheck = self._recheck
            for hit in [h for h in hits if h[1] in recheck]:
                start, pattern_id = hit
                stop = data.find(b"\n", start)
                if recheck[pattern_id].search(data[start : stop if stop >= 0 else len(data)]) is None:
                    hits.discard(hit)
        return sorted(hits)

    def _verify_gated(self, data: bytes, hits: set[tuple[int, int]]) -> None:
        """Replaces the gate hits in ``hits`` (lines holding a gated pattern's literal) by the
        gated patterns' matches on those lines: the lines, joined, scanned with ``_verify``. A
        line that matches a gated pattern holds its literal (``ftwatch.rules.gates``), so this
        finds every such match; each keeps the line its end falls on, as ``_scan_hs`` does."""
        gate = self._gate_id
        starts = sorted(start for start, pattern_id in hits if pattern_id == gate)
        if not starts:
            return
        hits.difference_update([(start, gate) for start in starts])
        find, size = data.find, len(data)
        lines = [data[start:end if (end := find(b"\n", start)) >= 0 else size] for start in starts]
        joined = b"\n".join(lines)
        where = dict(zip(accumulate([len(line) + 1 for line in lines[:-1]], initial=0), starts))
        add, rfind = hits.add, joined.rfind

        def on_match(pattern_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
            add((where[rfind(b"\n", 0, end) + 1], pattern_id))

        self._verify.scan(joined, match_event_handler=on_match, scratch=self._verify_scratch)

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
