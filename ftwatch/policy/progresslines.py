"""Which lines of a chunk a progress match may start on, of the ranks whose errors wait
(``ftwatch.policy.progress.marks`` reads those lines; issue 16 item 1).

Found in one pass per chunk without per-line Python for the other lines: where hyperscan is
installed and the waiting rank set lasts (:func:`_use_database`), one scan of a small database
built for it (:func:`_database`: cached per rank set), which reports each line once (every pattern ends at the line's end, and hyperscan
reports an end once per pattern): the lines of a waiting rank's prefix, the lines without a rank
prefix that hold a literal (:data:`LITERALS`; the exact complement of :data:`PREFIX` at a line's
start, spelt out by how such a line starts, each form holding the literal anywhere on the line),
and the lines :data:`UNSURE` may give a rank; else one ``re`` pass (:func:`finder`). Either
reports a superset of the lines whose rank (``fields.split_rank_prefix``) is waiting and that hold
a literal; the rank and, where the pattern did not say, the literal are then read per reported
line (:func:`lines`). The rank-prefix lines of other ranks (a 256-rank job's output, most of a
combined log) and the quiet lines cost nothing per line. Measured on the bench corpus (35 MB,
ranks {1, None} waiting, CPU s per replay): the ``re`` pass 0.27 s as first written, 0.19 s now;
the hyperscan scan ~0.09 s (the lines of no prefix: ~0.06 s of it) and ~0.12 s with its per-line
reads; ~0.067 s and ~0.09 s with the literals' first letters (:data:`LITERALS`); ~0.034 s and
~0.058 s with one expression where there were ten for the lines of no prefix (:func:`_unprefixed`:
hyperscan checks every literal it finds once per expression, and every step line holds several).
Why not the engine's own scan: the progress patterns hit every step line (28 % of the corpus)
several times; in the engine's database their callbacks cost ~0.22 s per replay on every chunk,
errors waiting or not (measured), for ~0.27 s saved only while errors wait.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Container, Iterator

from ftwatch.parsers import fields
from ftwatch.rules import diskcache
from ftwatch.rules.matcher import database_key, load_database, store_database

try:  # as in ftwatch.rules.matcher: hyperscan wheels exist for x86_64 only
    import hyperscan as _hs
except ImportError:  # pragma: no cover - depends on the platform
    _hs = None

#: Where a progress match can start: each alternative of :data:`PATTERNS` holds one of these on the
#: line its match starts on, at the match's start (``[Ee]poch``: epoch and Lightning's ``Epoch``;
#: ``[Ii]ter``: iteration and Megatron; ``[Ll]oss``: loss; ``[Ss]tep``: the plain step and DeepSpeed's
#: ``step=``; ``%|``: tqdm; ``MnRtt/Rnk: ``). With their first letters (not ``ter``, ``oss``...):
#: ``after``, ``parameter``, ``across`` hold none, and the scan of :func:`_database` verifies fewer
#: hits (bench corpus, ranks {1, None}: 0.067 s a replay against 0.091 s).
LITERALS = rb"(?:[Ee]poch|[Ii]ter|[Ll]oss|[Ss]tep|%\||MnRtt/Rnk: )"
#: :data:`LITERALS` with their first letters looked behind for, so that each starts with one of
#: ``%Mopt`` (:data:`_HOLDS_LITERAL`; ``re`` only: hyperscan has no lookbehind).
_LITERALS_BEHIND = rb"(?:(?<=[Ee])poch|(?<=[Ii])ter|(?<=[Ll])oss|(?<=[Ss])tep|%\||MnRtt/Rnk: )"
#: One rank prefix as ``fields.rank_prefix_at`` reads it; a line starting with :data:`UNSURE` may
#: carry a rank that only ``fields.split_rank_prefix`` reads (Ray's prefix, an escape, non-ASCII).
PREFIX = rb"(?:%s|\d{1,6}: )" % (fields.RANK_BRACKET_HS % (r"\d{1,7}", r"\d{1,7}")).encode()
UNSURE = PREFIX + rb"{0,4}(?:[(\x1b\x80-\xff]|\[[A-Za-z_][A-Za-z_-]*[0-9]*[\x80-\xff]|[0-9]+[\x80-\xff])"
#: The end of a line a progress match may run on past (its ``\s`` reaching the next line).
TAIL = re.compile(rb"(?:poch|ter|tion|ters|tions|oss|tep|\(train\)|\d/|['\":=(\[])[ \t\r\f\v]*\Z")
HAS_LITERAL = re.compile(LITERALS)
_MAY_RUN_ON = frozenset(b"hrnsp)'\":=([/ \t\r\f\v")      # the bytes a line that may end in it ends with
#: The first byte of a line that may carry a rank prefix (``fields.split_rank_prefix``) or an escape.
_PREFIXED = frozenset(b"[(0123456789\x1b")
#: "The rest of the line holds one of :data:`LITERALS`", as a run of bytes that start none
#: (possessive: never tried again) and single bytes that start one where none begins: the same
#: lines as ``[^\n]*?`` + the literals, without trying the six literals at every byte (~30 % of
#: :func:`finder`'s pass). Each literal of :data:`_LITERALS_BEHIND` starts with one of ``%Mopt``.
_HOLDS_LITERAL = rb"(?:[^\n%Mopt]++|(?!" + _LITERALS_BEHIND + rb")[%Mopt])*+" + _LITERALS_BEHIND
#: The first byte of a line that a rank prefix (``PREFIX``) or :data:`UNSURE` can start with: a
#: line starting with another is read no further for a prefix.
_PREFIX_FIRST = rb"(?=[\[(0-9\x1b\x80-\xff])"


def _bracket_of(numbers: bytes) -> bytes:
    """The bracketed rank prefix (``[rank3]:``, mpirun's ``[1,3]<stdout>:``) of one of ``numbers``
    (``b"1|3"``), leading zeros allowed."""
    digits = b"0*(?:%s)" % numbers
    return fields.RANK_BRACKET_HS.encode() % (digits, digits)


@functools.lru_cache(maxsize=64)
def finder(ranks: frozenset[int | None] | None) -> re.Pattern[bytes]:
    """The newline before each line that holds one of :data:`LITERALS` and may be of ``ranks``
    (None: any rank): one ``re`` pass per chunk, in C, led by the ``\\n`` (a memchr search)."""
    if ranks is None:
        return re.compile(rb"\n(?=" + _HOLDS_LITERAL + rb")")
    numbers = b"|".join(b"%d" % k for k in sorted(k for k in ranks if k is not None))
    starts = [_PREFIX_FIRST + PREFIX + rb"{0,3}(?:%s|0*(?:%s): )"
              % (_bracket_of(numbers), numbers)] * bool(numbers)
    starts += [b"(?!" + PREFIX + b")"] * (None in ranks) + [_PREFIX_FIRST + UNSURE]   # the rarest last
    return re.compile(rb"\n(?=" + b"|".join(starts) + rb")(?=" + _HOLDS_LITERAL + rb")")


_LINE_END = rb"[^\n]*$"      # every pattern ends at its line's end: hyperscan reports one end per line


def _unprefixed_forms() -> list[bytes]:
    """Lines that do not start with :data:`PREFIX` (rank None unless :data:`UNSURE`) and hold a
    literal anywhere (where a form takes a byte the literal may start with, the literal there is
    an alternative): by their first byte, then for ``[`` and digits each way the prefix fails.
    The reference that :func:`_unprefixed` must equal (``tests/policy/test_progress_scan.py``)."""
    lit = LITERALS
    return [rb"^(?:" + lit + rb"|[^\[0-9\n][^\n]*" + lit + rb")",               # another first byte
            rb"^\[[A-Za-z_-]*" + lit,                                               # a literal in a bracket's name
            rb"^\[[^A-Za-z_\n][^\n]*" + lit,                                        # "[" and no name
            rb"^\[[A-Za-z_][A-Za-z_-]*[^A-Za-z_\-0-9\n][^\n]*" + lit,              # a name and no number
            rb"^\[[A-Za-z_][A-Za-z_-]*[0-9]{8}[^\n]*" + lit,                        # a number of 8+ digits
            rb"^\[[A-Za-z_][A-Za-z_-]*[0-9]{1,7}(?:" + lit + rb"|[^\]0-9\n][^\n]*" + lit + rb")",   # no "]"
            rb"^\[[A-Za-z_][A-Za-z_-]*[0-9]{1,7}\](?:" + lit + rb"|[^:\n][^\n]*" + lit + rb")",    # no ":"
            rb"^[0-9]{7}[^\n]*" + lit,                                              # 7+ digits
            rb"^[0-9]{1,6}(?:" + lit + rb"|[^0-9:\n][^\n]*" + lit + rb")",          # digits and no ":"
            rb"^[0-9]{1,6}:(?:" + lit + rb"|[^ \n][^\n]*" + lit + rb")"]            # digits, ":" and no " "


def _unprefixed() -> list[bytes]:
    """:func:`_unprefixed_forms` as one expression for :func:`_database` (the same lines): each form
    is a head and then the literal either right after it or after ``[^\\n]*`` past one more byte,
    so the heads are grouped by which of the two follows, and the literal is written once.
    Hyperscan starts a check at every literal it finds (they are dense: every step line holds
    several), once per expression: ten expressions cost ~0.050 s a bench replay (ranks {None}),
    this one ~0.019 s (issue 16)."""
    name = rb"\[[A-Za-z_][A-Za-z_-]*"
    more = [rb"[^\[0-9\n]", rb"\[[^A-Za-z_\n]", name + rb"[^A-Za-z_\-0-9\n]", name + rb"[0-9]{8}",
            name + rb"[0-9]{1,7}[^\]0-9\n]", name + rb"[0-9]{1,7}\][^:\n]", rb"[0-9]{7}", rb"[0-9]{1,6}[^0-9:\n]",
            rb"[0-9]{1,6}:[^ \n]"]
    right_after = [rb"", rb"\[[A-Za-z_-]*", name + rb"[0-9]{1,7}\]?", rb"[0-9]{1,6}:?"]
    return [rb"^(?:(?:" + b"|".join(more) + rb")[^\n]*|" + b"|".join(right_after) + rb")" + LITERALS]


#: A rank set's own database is compiled (20-150 ms) once it was asked for this many times (a set
#: that lasts: a replay's, a job's whose errors wait for many chunks); before, and past
#: :data:`MAX_COMPILED_RANKS` ranks, the ``re`` pass reads the chunk (a set that changes with each
#: chunk, as errors of a large job arrive rank by rank, would compile for every chunk).
COMPILE_AFTER = 3
MAX_COMPILED_RANKS = 64
_asked: dict[frozenset[int | None], int] = {}      # rank set -> times asked (cleared past 256 sets)


def _use_database(ranks: frozenset[int | None] | None) -> bool:
    """Whether :func:`lines` scans ``ranks``' hyperscan database (else the ``re`` pass): at once
    where it is kept on disk already (no compile to wait for: a replay of the same rank set in a
    new process read its first chunks with the ``re`` pass, 3-4x the scan's cost, issue 16)."""
    if _hs is None:
        return False
    if ranks is None or ranks == {None}:
        return True                                 # one database for any chunk: compiled once
    if len(ranks) > MAX_COMPILED_RANKS:
        return False
    if len(_asked) > 256:
        _asked.clear()
    asked = _asked[ranks] = _asked.get(ranks, 0) + 1
    if asked == 1 and diskcache.has("hyperscan", _expressions(ranks)[2], "hsdb"):
        asked = _asked[ranks] = COMPILE_AFTER + 1   # (counted as a set that lasts)
    return asked > COMPILE_AFTER


@functools.lru_cache(maxsize=16)
def _database(ranks: frozenset[int | None] | None):
    """The hyperscan database of :func:`lines` for ``ranks`` (None: every line), compiled once per
    machine and rank set (kept on disk: ``ftwatch.rules.matcher.store_database``, so a replay that
    reads progress does not pay the 20-150 ms compile again): id 0, a line that
    holds a literal (a waiting rank's, one without a rank prefix, or one with a literal in the name
    of one of its first rank prefixes: :func:`lines` reads the rank); id 1, a line that may hold
    one, not looked for: :data:`UNSURE`."""
    exprs, ids, key = _expressions(ranks)
    db = load_database(key)
    if db is None:
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        db.compile(expressions=exprs, ids=ids, flags=[_hs.HS_FLAG_MULTILINE] * len(exprs))
        store_database(key, db)
    return db


@functools.lru_cache(maxsize=64)
def _expressions(ranks: frozenset[int | None] | None) -> tuple[list[bytes], list[int], str]:
    """:func:`_database`'s expressions, their ids and its cache key."""
    if ranks is None:
        sure, maybe = [LITERALS], []
    else:
        numbers = b"|".join(b"%d" % k for k in sorted(k for k in ranks if k is not None))
        sure = _unprefixed() if None in ranks else []
        maybe = [rb"^" + UNSURE]
        if numbers:
            # the waiting rank's prefix and a literal, or a literal in the name of one of the first
            # prefixes (the waiting rank's or one before it: its rank is read), as one expression
            # (each expression checks every literal again; two cost ~0.005 s more a bench replay)
            sure.append(rb"^" + PREFIX + rb"{0,3}(?:(?:%s|0*(?:%s): )[^\n]*|\[[A-Za-z_-]*)%s"
                        % (_bracket_of(numbers), numbers, LITERALS))
    exprs = [e + _LINE_END for e in sure + maybe]
    ids = [0] * len(sure) + [1] * len(maybe)
    return exprs, ids, database_key("ftwatch-progresslines-1", exprs + [bytes(ids), b"%d" % _hs.HS_FLAG_MULTILINE])


_SCRATCH = threading.local()       # per thread: database -> its scratch


def _ends(data: bytes, ranks: frozenset[int | None] | None) -> tuple[set[int], set[int]]:
    """The ends of the lines :func:`_database` reports: (holding a literal, not looked at)."""
    db = _database(ranks)
    scratches = _SCRATCH.__dict__.setdefault("by_db", {})
    scratch = scratches.get(id(db))
    if scratch is None or scratch[0] is not db:
        if len(scratches) >= 16:                    # (as many as ``_database`` keeps)
            scratches.clear()
        scratch = scratches[id(db)] = (db, _hs.Scratch(db))
    sure: set[int] = set()
    maybe: set[int] = set()
    adders = (sure.add, maybe.add)
    db.scan(data, match_event_handler=lambda pid, _from, end, _flags, _ctx: adders[pid](end), scratch=scratch[1])
    return sure, maybe


#: Bytes of a chunk :func:`iter_lines` scans at a time (cut at a line's end): its caller stops reading
#: once nothing waits (``progress.Survival.outlived``), and the chunk's rest is then never scanned nor
#: its lines read (bench replay: the work stopped at ~70 % of each 1 MiB chunk on average, issue 16;
#: since the reader begins ``progress.LOOKBACK`` before the errors found in the chunk, ``begin``, it
#: scans about one piece per group of errors: 0.043 -> 0.007 s CPU of scans a bench replay, with
#: 64 KiB pieces; 128 KiB pieces scanned twice the bytes for the same lines).
#: Every expression of :func:`_database` stays on one line, so a scan of whole lines finds what the
#: chunk's scan finds there.
PIECE_BYTES = 64 * 1024


def lines(data: bytes, ranks: Container[int | None] | None) -> list[tuple[int, int, bool, int | None, int]]:
    """The lines of ``data`` a progress match may start on that matter, in order, as (start, end,
    wanted, rank, text): wanted, those of ``ranks`` (None: all); not wanted, those a match may run
    on from into a wanted line (through lines ending in :data:`TAIL`), which must be followed for
    it. Where ``text`` >= 0, ``fields.split_rank_prefix(fields.clean(data[start:end]))`` is
    ``(rank, fields.clean(data[text:end]))`` (read here already: the caller need not split the
    line again); where -1 (``ranks`` None, a line not wanted, one :func:`_rank` reads whole), the
    caller reads both itself. :func:`iter_lines`, all at once."""
    return list(iter_lines(data, ranks))


def iter_lines(data: bytes, ranks: Container[int | None] | None,
               piece: int = PIECE_BYTES, begin: int = 0) -> Iterator[tuple[int, int, bool, int | None, int]]:
    """:func:`lines`, found and read as they are asked for: ``data`` is scanned :data:`PIECE_BYTES`
    at a time (the hyperscan pass; the ``re`` pass reads it whole), so a caller that stops early
    leaves the rest unscanned. The lines a match may run on from into a wanted line are found
    walking back from it, no further than the wanted line before it (whose own walk went on from
    there, as in reading the wanted lines all first). ``begin`` (a line's start): the lines
    before it are neither scanned nor handed out, not even one a match may run on from."""
    known: dict[bytes, int | None] = {}             # a rank prefix's bytes -> its rank
    last = begin - 1                                # the start of the last wanted line handed out
    for start, end, sure in _candidates(data, None if ranks is None else frozenset(ranks), piece, begin):
        if not sure and HAS_LITERAL.search(data, start, end) is None:
            continue                                # (one C search: cheaper than the rank's read)
        if ranks is None:
            yield start, end, True, None, -1
            continue
        first = data[start] if start < end else 32
        rank, text = (None, start) if first < 128 and first not in _PREFIXED else _rank(data, start, end, known)
        if rank not in ranks:
            continue
        before = []
        end_before = start - 1                      # walk back while a match could run on from there
        while end_before >= 0:
            prev = data.rfind(b"\n", 0, end_before) + 1
            if prev <= last:                        # the wanted line before: its walk went on from it
                break
            if end_before > prev and data[end_before - 1] not in _MAY_RUN_ON:
                break                               # no space and no tail's last byte at its end: no tail
            if data[prev:end_before].strip():
                if not TAIL.search(data, prev, end_before):
                    break
                if HAS_LITERAL.search(data, prev, end_before):
                    before.append((prev, end_before, False, None, -1))
            end_before = prev - 1
        yield from reversed(before)
        last = start
        yield start, end, True, rank, text


def _rank(data: bytes, start: int, end: int, known: dict[bytes, int | None]) -> tuple[int | None, int]:
    """``fields.split_rank_prefix``'s rank of the line ``data[start:end]`` (``fields.clean``ed) and
    where its text after the prefixes starts (-1: not read from the bytes), read from its prefix
    bytes alone (the rank cached in ``known``) where that reads the same: an ASCII line (``\\d``
    and the decoding agree) without escapes (whose removal could join a prefix) whose prefixes no
    Ray prefix follows."""
    off = fields.rank_prefix_at(data, start)[1]
    if (off >= end or data[off] != 40) and data.find(b"\x1b", start, end) < 0 and data[start:end].isascii():   # 40: "("
        if off == start:
            return None, start
        key = data[start:off]
        if key not in known:
            known[key] = fields.split_rank_prefix(fields.clean(key))[0]
        return known[key], off
    return fields.split_rank_prefix(fields.clean(data[start:end]))[0], -1


def _candidates(data: bytes, ranks: frozenset[int | None] | None,
                piece: int = PIECE_BYTES, begin: int = 0) -> Iterator[tuple[int, int, bool]]:
    """The lines :func:`lines` reads the rank of, in order, as (start, end, whether it surely
    holds a literal): from the hyperscan database (:func:`_use_database`), ``piece`` bytes of
    whole lines a scan, else from :func:`finder`'s pass over the whole of ``data``; from
    ``begin`` on (a line's start)."""
    size = len(data)
    if not data or not _use_database(ranks):
        find = data.find
        for m in finder(ranks).finditer(b"\n" + data, begin):
            start = m.start()                       # (``data`` shifted by the newline put before it)
            end = find(b"\n", start)
            yield start, size if end < 0 else end, True
        return
    lo = begin
    while lo < size:
        hi = size
        if size - lo > piece:                       # cut after a line's end (a longer line: whole)
            hi = data.rfind(b"\n", lo, lo + piece) + 1 or data.find(b"\n", lo + piece) + 1 or size
        part = data[lo:hi] if lo or hi < size else data
        sure, maybe = _ends(part, ranks)
        rfind = part.rfind
        for end in sorted(sure | maybe):
            yield lo + rfind(b"\n", 0, end) + 1, lo + end, end in sure
        lo = hi
