"""Matcher: per-line semantics on whole chunks, both backends identical, errors named."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftwatch.rules import matcher as matcher_mod
from ftwatch.rules.added_rules import LayeredMatcher
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern

HAVE_HS = matcher_mod._hs is not None
BACKENDS = ["hyperscan", "re2"] if HAVE_HS else ["re2"]
needs_hs = pytest.mark.skipif(not HAVE_HS, reason="hyperscan not installed")

NCCL_ERR = (b"[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
            b"c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)")
GLOO_ERR = (b"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
            b"peer [127.0.0.1]:29500")
WATCHDOG = (b"[rank1]:[E1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
            b"collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            b"Timeout(ms)=600000) ran for 600010 milliseconds before timing out.")
INFO = b"node3:1234:1234 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"

# The fixed set the property tests run: literals, caseless, anchors, regexes that could span a
# newline in a chunk (\s, [^...], \W), non-ASCII.
PATTERNS = [
    Pattern("unhandled system error"),
    Pattern("connection closed by peer", caseless=True),
    Pattern(r"^Traceback \(most recent call last\):", regex=True),
    Pattern(r"OpType=(\w+), NumelIn=\d+", regex=True),
    Pattern(r"timing out\.$", regex=True),
    Pattern(r"NCCL\s+WARN", regex=True),
    Pattern(r"error[^:]*:\s*\d", regex=True, caseless=True),
    Pattern(r"\W\w+\Wpeer", regex=True),
    Pattern("中文"),
    Pattern("\x00nul"),
    Pattern(r"\bKilled\b", regex=True),
    Pattern(r"a\sb", regex=True),
    Pattern(r"x[^|\n]*y", regex=True),
    Pattern(r"p[^\S\n]+q", regex=True),
]


def oracle(patterns: list[Pattern], data: bytes) -> list[tuple[int, int]]:
    """Per-line reference with Python's re on bytes (same semantics as the shared subset here)."""
    compiled = []
    for p in patterns:
        body = p.text.encode() if p.regex else re.escape(p.text.encode())
        compiled.append(re.compile((b"(?i)" if p.caseless else b"") + body))
    out, offset = [], 0
    for line in data.split(b"\n"):
        out.extend((offset, i) for i, rx in enumerate(compiled) if rx.search(line))
        offset += len(line) + 1
    return sorted(out)


def lines_of(data: bytes, hits: list[tuple[int, int]]) -> list[tuple[bytes, int]]:
    """Returns (line text, pattern id) for each hit, for readable assertions."""
    return [(data[s:].split(b"\n", 1)[0], i) for s, i in hits]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def test_a_layered_matcher_answers_as_one_matcher_of_both_sets_and_caches_nothing(backend, tmp_path, monkeypatch):
    """The first 8 patterns compiled, the other 6 added beside them: every scan and match_text
    answer is the one Matcher of all 14 gives (ids of the added after the base's), and the small
    set's database is never stored in the disk cache (it would push out the large sets')."""
    monkeypatch.setenv("FTWATCH_CACHE_DIR", str(tmp_path))
    base = Matcher(PATTERNS[:8], backend=backend)
    cached = sorted(tmp_path.rglob("*"))
    layered = LayeredMatcher(base, PATTERNS[8:])
    assert sorted(tmp_path.rglob("*")) == cached
    whole = Matcher(PATTERNS, backend=backend)
    data = b"\n".join([INFO, NCCL_ERR, "中文 was Killed".encode(), GLOO_ERR, b"a b, x..y and p  q",
                       WATCHDOG, b"\x00nul"]) + b"\n"
    assert layered.patterns == whole.patterns and layered.backend == backend
    assert layered.scan(data) == whole.scan(data) == oracle(PATTERNS, data)
    assert {i for _, i in layered.scan(data)} & set(range(8)) and {i for _, i in layered.scan(data)} - set(range(8))
    for text in (data.decode("utf-8", "replace"), INFO.decode(), "nothing here"):
        assert layered.match_text(text) == whole.match_text(text)


def test_scan_reports_line_starts_of_matching_lines(backend):
    data = b"\n".join([INFO, NCCL_ERR, INFO, GLOO_ERR, WATCHDOG]) + b"\n"
    m = Matcher(PATTERNS, backend=backend)
    hits = m.scan(data)
    assert hits == sorted(hits)
    assert lines_of(data, hits) == [(NCCL_ERR, 0), (GLOO_ERR, 1), (GLOO_ERR, 7), (WATCHDOG, 3), (WATCHDOG, 4)]
    assert hits[0][0] == len(INFO) + 1
    assert hits == oracle(PATTERNS, data)


def test_a_pattern_repeated_in_a_line_is_reported_once(backend):
    m = Matcher([Pattern("NCCL"), Pattern("INFO")], backend=backend)
    assert m.scan(b"NCCL NCCL NCCL INFO\nNCCL") == [(0, 0), (0, 1), (20, 0)]


def test_edges_chunk_start_end_no_final_newline_empty_and_crlf(backend):
    m = Matcher([Pattern("Killed"), Pattern(r"error$", regex=True), Pattern(r"^x", regex=True)], backend=backend)
    data = b"Killed\n\n\nan error\r\nan error\nx\nKilled"
    assert lines_of(data, m.scan(data)) == [(b"Killed", 0), (b"an error", 1), (b"x", 2), (b"Killed", 0)]
    assert m.scan(b"") == []
    assert m.scan(b"\n\n") == []


def test_never_matches_across_a_newline(backend):
    m = Matcher([Pattern(r"foo\s+bar", regex=True), Pattern(r"a[^z]+b", regex=True),
                 Pattern(r"x\Wy", regex=True), Pattern(r"c(?s:.)d", regex=True)], backend=backend)
    assert m.scan(b"foo\nbar\na\nb\nx\ny\nc\nd\n") == []
    assert m.scan(b"foo \tbar\na-b\nx.y\ncXd") == [(0, 0), (9, 1), (13, 2), (17, 3)]


def test_anchors_are_per_line(backend):
    m = Matcher([Pattern(r"^Traceback", regex=True), Pattern(r"last\):$", regex=True)], backend=backend)
    data = b"[rank0]: Traceback (most recent call last):\nTraceback (most recent call last):\n"
    assert m.scan(data) == [(0, 1), (44, 0), (44, 1)]


def test_invalid_utf8_nul_and_non_ascii_literals(backend):
    m = Matcher([Pattern("中文"), Pattern("\x00nul"), Pattern("ÉCHEC", caseless=True),
                 Pattern(r"\xff\xfe", regex=True)], backend=backend)
    data = b"\xff\xfe garbage \xc3\n\xe4\xb8\xad\xe6\x96\x87 log\nx\x00nul\n\xc3\x89chec"
    assert lines_of(data, m.scan(data)) == [(b"\xff\xfe garbage \xc3", 3), (b"\xe4\xb8\xad\xe6\x96\x87 log", 0),
                                            (b"x\x00nul", 1), (b"\xc3\x89chec", 2)]
    # ASCII-only case folding: the É byte pair is not folded to é
    assert m.scan("échec".encode()) == []


def test_caseless_literal_and_regex(backend):
    m = Matcher([Pattern("Connection Closed", caseless=True), Pattern(r"cuda error: \w+", regex=True, caseless=True)],
                backend=backend)
    assert m.scan(b"connection closed by peer\nCUDA ERROR: OOM\ncuda error:") == [(0, 0), (26, 1)]


def test_backslash_s_includes_vertical_tab_on_both_backends(backend):
    m = Matcher([Pattern(r"a\sb", regex=True), Pattern(r"c[\S]d", regex=True)], backend=backend)
    assert m.scan(b"a\x0bb\nc\x0bd\ncxd") == [(0, 0), (8, 1)]


def test_literals_are_escaped(backend):
    m = Matcher([Pattern("Timeout(ms)=600000"), Pattern("a.b"), Pattern("[rank1]:")], backend=backend)
    assert m.scan(b"Timeout(ms)=600000\naxb\na.b\nrank1:\n[rank1]:") == [(0, 0), (23, 1), (34, 2)]


def test_empty_pattern_list(backend):
    m = Matcher([], backend=backend)
    assert m.scan(NCCL_ERR) == []
    assert m.match_text("anything") == set()


def test_match_text_over_several_lines(backend):
    m = Matcher(PATTERNS, backend=backend)
    text = (NCCL_ERR + b"\n" + GLOO_ERR).decode()
    assert m.match_text(text) == {0, 1, 7}
    assert m.match_text("中文 and a\x0bb") == {8, 11}
    assert m.match_text("unhandled system\nerror") == set()


@pytest.mark.parametrize(
    "pattern, reason",
    [
        (Pattern(""), "empty"),
        (Pattern("two\nlines"), "newline"),
        (Pattern(r"a(", regex=True), "RE2"),
        (Pattern(r"\h", regex=True), "RE2"),  # Hyperscan accepts \h, RE2 does not
        (Pattern(r"(a)\1", regex=True), ""),  # backreference
        (Pattern(r"(?=a)b", regex=True), ""),  # lookahead
        (Pattern(r"\A\w", regex=True), "use ^"),
        (Pattern(r"\w\z", regex=True), "use $"),
        (Pattern(r"a\vb", regex=True), "\\x0b"),
        (Pattern(r"^$", regex=True), "empty line"),
        (Pattern(r"x?$", regex=True), "empty line"),
    ],
)
def test_check_names_the_problem(pattern, reason):
    problem = Matcher.check(pattern)
    assert problem is not None and reason in problem


@needs_hs
@pytest.mark.parametrize("text", [r"(?U)a+", r"\p{Greek}"])
def test_check_rejects_what_only_hyperscan_rejects(text):
    problem = Matcher.check(Pattern(text, regex=True))
    assert problem is not None and "Hyperscan" in problem


@pytest.mark.parametrize("pattern", PATTERNS + [Pattern(r"Xid \(PCI:[0-9a-f:.]+\): (\d+)", regex=True)])
def test_check_accepts_valid_patterns(pattern):
    assert Matcher.check(pattern) is None


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_constructor_names_the_first_bad_pattern(backend_name):
    pats = [Pattern("ok"), Pattern(r"\h+", regex=True), Pattern("a(", regex=True)]
    with pytest.raises(ValueError, match=r"^pattern 1: '\\\\h\+': RE2: invalid escape"):
        Matcher(pats, backend=backend_name)


@needs_hs
def test_constructor_reports_a_hyperscan_only_error_before_a_later_re2_error():
    pats = [Pattern("ok"), Pattern("(?U)x", regex=True), Pattern("a(", regex=True)]
    with pytest.raises(ValueError, match=r"^pattern 1: '\(\?U\)x': Hyperscan"):
        Matcher(pats, backend="re2")


def test_backend_selection(monkeypatch):
    monkeypatch.setenv("FTWATCH_MATCHER", "re2")
    assert Matcher([Pattern("x")]).backend == "re2"
    monkeypatch.delenv("FTWATCH_MATCHER")
    assert Matcher([Pattern("x")]).backend == ("hyperscan" if HAVE_HS else "re2")
    assert Matcher([Pattern("x")], backend="re2").backend == "re2"
    with pytest.raises(ValueError, match="unknown matcher backend"):
        Matcher([Pattern("x")], backend="pcre")


def test_without_hyperscan_the_re2_backend_is_used(monkeypatch):
    monkeypatch.setattr(matcher_mod, "_hs", None)
    monkeypatch.delenv("FTWATCH_MATCHER", raising=False)
    m = Matcher(PATTERNS)
    assert m.backend == "re2"
    assert m.scan(GLOO_ERR) == [(0, 1), (0, 7)]
    with pytest.raises(ImportError):
        Matcher(PATTERNS, backend="hyperscan")


# -- properties ---------------------------------------------------------------------------

FRAGMENTS = [b"unhandled system error", b"Connection closed by peer", b"Traceback (most recent call last):",
             b"OpType=ALLREDUCE, NumelIn=12", b"timing out.", b"NCCL", b"WARN", b"Error", b": 3", b"peer",
             "中文".encode(), b"\x00nul", b"Killed", b"a", b"b", b" ", b"\t", b"\r", b"\x0b", b"\xff", b"\xc3",
             b":", b"-", b"a\nb", b" by\npeer", b"Error\n: 3", b"NCCL\r\nWARN", b"\n", b"\n"]
chunk_st = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=6)), max_size=40).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(chunk_st)
def test_backends_agree_with_each_other_and_with_a_per_line_reference(data):
    expected = oracle(PATTERNS, data)
    for name in BACKENDS:
        assert Matcher(PATTERNS, backend=name).scan(data) == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FRAGMENTS + [b"x", b"."]).filter(lambda b: b"\n" not in b),
                          st.booleans()), min_size=1, max_size=5),
       chunk_st)
def test_random_literal_sets_agree_with_substring_search(specs, data):
    pats = [Pattern(frag.decode("utf-8", "surrogateescape"), caseless=ci) for frag, ci in specs]
    pats = [p for p in pats if Matcher.check(p) is None]
    offset, expected = 0, []
    for line in data.split(b"\n"):
        for i, p in enumerate(pats):
            needle = p.text.encode("utf-8", "surrogateescape")
            hay = line.lower() if p.caseless else line
            if (needle.lower() if p.caseless else needle) in hay:
                expected.append((offset, i))
        offset += len(line) + 1
    for name in BACKENDS:
        assert Matcher(pats, backend=name).scan(data) == sorted(expected)


@pytest.mark.parametrize("text, may_span", [
    (r"x[^|\n]*y", False), (r"[^\S\n]+", False), (r"a[^]\n]b", False),
    (r"x[^|]*y", True), (r"[^\n-x]", True), (r"a\sb", True), (r"[^[:space:]]", True),
])
def test_a_negated_class_listing_the_newline_never_spans_lines(text, may_span):
    """Only patterns that may match a newline get their hits re-checked with RE2 (one call per
    hit): a negated class that lists ``\\n`` cannot, so step lines and tqdm bars skip it."""
    assert matcher_mod._translate(Pattern(text, regex=True)).may_span is may_span


def test_match_text_answers_are_kept_and_equal_a_fresh_scan(monkeypatch):
    """``match_text`` keeps its answers (the judge asks about one traceback's lines again per rule):
    a second ask scans nothing; a text past ``MATCH_TEXT_CHARS`` is scanned each time, and the
    answers kept are forgotten past ``MATCH_TEXT_CACHE`` texts."""
    m = Matcher([Pattern("KeyError"), Pattern(r"NCCL error \d+", regex=True)])
    scans = []
    real = m.scan
    monkeypatch.setattr(m, "scan", lambda data: scans.append(data) or real(data))
    assert m.match_text("x KeyError: 'a'") == {0}
    assert m.match_text("x KeyError: 'a'") == {0} and len(scans) == 1
    assert m.match_text("ok\nNCCL error 3") == {1} and len(scans) == 2
    long = "KeyError " + "y" * matcher_mod.MATCH_TEXT_CHARS
    assert m.match_text(long) == m.match_text(long) == {0} and len(scans) == 4
    monkeypatch.setattr(matcher_mod, "MATCH_TEXT_CACHE", 2)
    m.match_text("a")
    assert len(m._texts) == 1 and m.match_text("x KeyError: 'a'") == {0}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_large_set_hands_the_freed_heap_back(backend, monkeypatch):
    """A set of 1,000 patterns or more trims the C heap once it is compiled (issue 16: the compile
    and the rules' loading leave tens of MiB that watch's RSS goal counts); a small one does not."""
    calls = []
    monkeypatch.setattr(matcher_mod, "_malloc_trim", lambda pad: calls.append(pad))
    Matcher([Pattern(f"E{i:05d} failed") for i in range(10)], backend=backend)
    assert calls == []
    m = Matcher([Pattern(f"E{i:05d} failed") for i in range(matcher_mod._TRIM_PATTERNS)], backend=backend)
    assert calls == [0]
    assert m.scan(b"ok\nE00007 failed\n") == [(3, 7)]
