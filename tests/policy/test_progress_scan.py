"""The progress check's cost while an error waits (issue 16 item 1): ``ftwatch.policy.progress.marks``
finds a chunk's progress lines of the waiting ranks in one C pass; other lines get no per-line
Python (no regex, no decode, no timestamp), and what it reads equals the per-line reading."""

from __future__ import annotations

import random
import re

import pytest

from ftwatch.events import Origin
from ftwatch.parsers import chunks, fields
from ftwatch.policy import progress, progresslines
from ftwatch.rules import diskcache
from ftwatch.testing import T0, finding


def reference_marks(data: bytes, time: float, sim_step: float, year: int | None):
    """The per-line reading ``marks`` replaced (``_PROGRESS.finditer`` over the chunk, then every
    progress line of every rank decoded, vetoed, dated and counted): the oracle (the dating of
    untimed lines, ``progress.Clock``, is shared: it did not change)."""
    clock, last_line = progress.Clock(data, time, sim_step, year), -1
    for m in progress._PROGRESS.finditer(data):
        start = data.rfind(b"\n", 0, m.start()) + 1
        if start == last_line:
            continue
        last_line = start
        end = data.find(b"\n", start)
        rank, text = fields.split_rank_prefix(fields.clean(data[start:] if end < 0 else data[start:end]))
        if progress._VETO.search(text):
            continue
        own = fields.parse_timestamp(text, year)
        if own is None and sim_step:
            own = clock.at(start)
        line = data[start:] if end < 0 else data[start:end]
        counters = {kind: int(re.search(rb"\d+", hit.group()).group())
                    for kind, pattern in progress._COUNTERS if (hit := pattern.search(line)) is not None}
        yield rank, time if own is None else own, counters


LINES = [
    "[rank{r}]: [2026-11-21 09:00:{s:02d}] iteration {n:>8}/ 1000 | consumed samples: 9 | "
    "elapsed time per iteration (ms): 12.5 | lm loss: 2.1E+00 |",
    "[default{r}]:step {n} loss 0.{n:03d}", "[default{r}]:[rank{r}]: Epoch {n}/9 some text", "{r}: iters: {n}",
    "2026-11-21 10:00:{s:02d},000 INFO reading shard {n}", "nothing at all {n}",
    "[rank{r}]: RuntimeError: failed at step {n}", "[rank{r}]: epoch", " {n} loss", "[rank{r}]: iteration",
    "", "   ", "[rank{r}]: loss =", "{n}.5 step=3, skipped=0", "\x1b[31m[rank{r}]: step {n}\x1b[0m",
    "(pid=4{r}) [rank{r}]: step {n}", "[rank\u0663]: step {n}", "[a{r}]:[rank{r}]:[b1]:[c{r}]:[d2]: step {n}",
    " 45%|####5     | {n}/100 [00:10<00:12,  4.50it/s]", "{{'loss': 0.12, 'epoch': {r}.5}}",
    "Epoch(train) [1][{n}/500]", "[2026-11-21 09:00:{s:02d}] global_step={n}", "[W1121 09:36:03] step {n} x",
    "[{r}]<stdout>:Epoch {n} step {n} loss 0.5", "[1,{r}]<stderr>:iteration {n}",    # horovodrun's, mpirun's
]


def chunk(seed: int, count: int = 400) -> bytes:
    rng = random.Random(seed)
    out = [rng.choice(LINES).format(r=rng.randrange(4), n=rng.randrange(1, 999), s=rng.randrange(60))
           for _ in range(count)]
    return ("\n".join(out) + ("\n" if seed % 2 else "")).encode()


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("sim_step", [0.0, 0.001])
def test_marks_equal_the_per_line_reading_for_every_rank_set(seed, sim_step):
    data = chunk(seed)
    want = list(reference_marks(data, T0, sim_step, 2026))
    assert list(progress.marks(data, T0, sim_step, 2026)) == want
    for ranks in ({1}, {None}, {None, 1}, {0, 3}, {3}, set()):
        assert list(progress.marks(data, T0, sim_step, 2026, ranks)) == [m for m in want if m[0] in ranks]


def test_a_match_running_on_into_a_waiting_ranks_line_is_followed():
    # rank 0's "iteration" runs on (\s) into rank 1's line and takes its "7" (so no "7.5" loss there)
    data = b"[rank0]: epoch\n\n 3 x\n[rank0]: iteration\n7.5 loss\n[rank1]: loss =\n 2.5\n"
    want = list(reference_marks(data, T0, 0.0, 2026))
    assert list(progress.marks(data, T0, 0.0, 2026, {None})) == [m for m in want if m[0] is None]
    assert list(progress.marks(data, T0, 0.0, 2026, {1})) == [m for m in want if m[0] == 1]


class Counting:
    """A compiled pattern whose ``search`` / ``match`` calls are counted."""

    def __init__(self, pattern, calls: list):
        self.pattern, self.calls = pattern, calls

    def search(self, *args):
        self.calls.append(self.pattern.pattern)
        return self.pattern.search(*args)

    def match(self, *args):
        self.calls.append(self.pattern.pattern)
        return self.pattern.match(*args)


@pytest.fixture
def per_line_calls(monkeypatch) -> list:
    """Every per-line regex, decode, rank read and timestamp parse of ``marks``, counted."""
    calls: list = []
    monkeypatch.setattr(progress, "_ON_LINE", Counting(progress._ON_LINE, calls))
    monkeypatch.setattr(progress, "_VETO", Counting(progress._VETO, calls))
    monkeypatch.setattr(progresslines, "TAIL", Counting(progresslines.TAIL, calls))
    monkeypatch.setattr(progresslines, "HAS_LITERAL", Counting(progresslines.HAS_LITERAL, calls))
    monkeypatch.setattr(progress, "_GATED_COUNTERS",
                        tuple((k, g, Counting(rx, calls)) for k, g, rx in progress._GATED_COUNTERS))
    for module, name in ((fields, "clean"), (fields, "split_rank_prefix"), (fields, "parse_timestamp"),
                         (chunks, "last_timestamp"), (fields, "rank_prefix_at")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    return calls


def held(instance: str = "corpus", rank: int | None = None) -> progress.Survival:
    s = progress.Survival(window=60, needed=2)
    s.wait(finding("python.exception", time=T0, at=Origin(instance, rank, "j", "n", "stderr", "replay")))
    return s


N = 5000


def test_non_progress_lines_cost_no_per_line_python_while_an_error_waits(per_line_calls):
    origin = Origin("corpus", None, "j", "n", "stderr", "replay")
    quiet = b"".join(b"2026-11-21 10:00:00,000 INFO reading shard %d of the data set\n" % i for i in range(N))
    assert held().outlived(origin, quiet, T0 + 1, 0.001, 2026) == []
    assert per_line_calls == []


def test_other_ranks_progress_lines_cost_no_per_line_python(per_line_calls):
    origin = Origin("corpus", None, "j", "n", "stderr", "replay")
    others = b"".join(b"[rank%d]: [2026-11-21 10:00:01] step %d loss 0.5\n" % (i % 4, i) for i in range(N))
    s = held("rank7")
    assert s.outlived(origin, others, T0 + 1, 0.001, 2026) == []
    assert per_line_calls == [] and s
    # an origin whose instance has no error waiting: not even the chunk pass
    assert held("worker-9", 9).outlived(Origin("worker-1", 1, "j", "n", "stderr", "process"),
                                        others, T0 + 1, 0.0, 2026) == []


def test_the_waiting_ranks_progress_still_outlives_its_error(per_line_calls):
    origin = Origin("corpus", None, "j", "n", "stderr", "replay")
    data = b"".join(b"[rank%d]: step %d loss 0.5\n" % (i % 4, i) for i in range(N))
    s = held("rank3")
    f = next(s._waiting.findings())
    outlived = s.outlived(origin, data, T0 + 1, 0.0, 2026)
    assert [g for g, _ in outlived] == [f] and not s
    assert per_line_calls.count("parse_timestamp") == 2        # rank 3's first two progress lines only
    assert per_line_calls.count("clean") == 3                  # those, and the "[rank3]: " prefix once


@pytest.mark.parametrize("seed", range(6))
def test_decisions_equal_the_per_line_path(seed):
    data = chunk(seed, 2000)
    origin = Origin("corpus", None, "j", "n", "stderr", "replay")
    for instance in ("rank1", "corpus", "rank3"):
        fast, slow = held(instance), held(instance)
        got = fast.outlived(origin, data, T0 - 3600, 0.001, 2026)
        want = []
        for rank, at, counters in reference_marks(data, T0 - 3600, 0.001, 2026):
            want += [(f, at) for f in slow.progress(origin.with_rank(rank).instance, at, counters)]
            if not slow:
                break
        assert got == want and bool(fast) == bool(slow)


def test_the_ranks_read_follow_the_waiting_set():
    origin = Origin("corpus", None, "j", "n", "stderr", "replay")
    data = b"".join(b"[rank%d]: step %d loss 0.5\n" % (i % 2, i) for i in range(8))
    s = held("rank0")
    assert len(s.outlived(origin, data, T0 + 1, 0.0, 2026)) == 1 and not s
    later = finding("python.exception", time=T0 + 1, at=Origin("rank1", None, "j", "n", "stderr", "replay"))
    s.wait(later)                                   # another rank waits now: its lines are read
    assert s.outlived(origin, data, T0 + 2, 0.0, 2026) == [(later, T0 + 2)]


def reference_finder(ranks):
    """``progresslines.finder`` as first written (a lazy ``[^\\n]*?`` before the literals, no first-byte
    guards): the faster form must find the same lines."""
    lit = rb"(?=[^\n]*?" + progresslines.LITERALS + rb")"
    if ranks is None:
        return re.compile(rb"\n" + lit)
    numbers = b"|".join(b"%d" % k for k in sorted(k for k in ranks if k is not None))
    starts = [progresslines.PREFIX + rb"{0,3}(?:\[[A-Za-z_][A-Za-z_-]*?0*(?:%s)\]: ?|0*(?:%s): )"
              % (numbers, numbers)] * bool(numbers)
    starts += [b"(?!" + progresslines.PREFIX + b")"] * (None in ranks) + [progresslines.UNSURE]
    return re.compile(rb"\n(?=" + b"|".join(starts) + rb")" + lit)


PIECES = [b"[rank1]: ", b"[rank01]:", b"[default3]:", b"2: ", b"0003: ", b"(pid=4) ", b"\x1b[31m", b"\xd9\xa1",
          b"[rank\xd9\xa3]: ", b"[a1]:", b"[2026-11-21 09:00:01] ", b"epoch", b"poch", b"ter", b"te", b"oss", b"os",
          b"tep", b"%|", b"%", b"MnRtt/Rnk: ", b"MnRtt", b"o", b"p", b"t", b"M", b" ", b"\t", b"x", b"1", b"\r", b"[",
          b"]: ", b"\xff", b"I", b"i", b"L", b"l", b"S", b"s", b"E", b"e", b"Iter", b"Loss", b"Step"]


@pytest.mark.parametrize("seed", range(20))
def test_the_finder_finds_the_lines_its_first_form_found(seed):
    rng = random.Random(seed)
    data = b"\n".join(b"".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 9))) for _ in range(3000))
    for ranks in (None, frozenset({1}), frozenset({None}), frozenset({None, 1}), frozenset({0, 3}), frozenset()):
        want = [m.start() for m in reference_finder(ranks).finditer(b"\n" + data)]
        assert [m.start() for m in progresslines.finder(ranks).finditer(b"\n" + data)] == want


@pytest.mark.skipif(progresslines._hs is None, reason="hyperscan not installed")
@pytest.mark.parametrize("seed", range(20))
def test_the_hyperscan_pass_reads_the_lines_the_re_pass_reads(seed, monkeypatch):
    # one report per line (every pattern ends at its line's end); the prefix forms' complement
    # spelt out by first bytes: the same lines as the re pass, on random prefixes and literals
    monkeypatch.setattr(progresslines, "COMPILE_AFTER", 0)
    rng = random.Random(seed)
    pieces = PIECES + [b"[ab", b"[m-", b"12", b"1234567", b"12345678", b"]", b":", b"-", b"_", b"M"]
    data = b"\n".join(b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 9))) for _ in range(3000))
    data += b"\n" if seed % 2 else b""
    rank_sets = (None, {1}, {None}, {None, 1}, {0, 3}, set(), {None, 0, 1, 2, 3, 12})
    fast = [progresslines.lines(data, ranks) for ranks in rank_sets]
    monkeypatch.setattr(progresslines, "_hs", None)
    assert fast == [progresslines.lines(data, ranks) for ranks in rank_sets]
    assert fast[0] and fast[3]                          # (some lines found)


@pytest.mark.skipif(progresslines._hs is None, reason="hyperscan not installed")
def test_the_hyperscan_pass_reads_a_line_whose_literal_is_in_a_prefix_name(monkeypatch):
    # ``[Step1]: x``: rank 1's line, and its only literal is in its prefix's name (as in one before
    # the rank's prefix): the database reports it as the re pass does
    monkeypatch.setattr(progresslines, "COMPILE_AFTER", 0)
    data = (b"[Step1]: x 12\n[rank0]: [Loss1]: y 3\n[Epoch2]: z\n[iters1]:\n[rank1]: plain\n"
            b"[Step1] no colon\n2: [Step1]: w\n")
    rank_sets = ({1}, {None, 1}, {1, 2}, {0})
    fast = [progresslines.lines(data, ranks) for ranks in rank_sets]
    monkeypatch.setattr(progresslines, "_hs", None)
    assert fast == [progresslines.lines(data, ranks) for ranks in rank_sets]
    assert [start for start, *_ in fast[0]] == [0, 14, 48, 90]


@pytest.mark.skipif(progresslines._hs is None, reason="hyperscan not installed")
@pytest.mark.parametrize("seed", range(8))
def test_the_one_unprefixed_expression_reports_the_lines_of_its_ten_forms(seed):
    # ``_unprefixed`` (one expression: hyperscan checks each dense literal once, not ten times,
    # issue 16) reports exactly the line ends of ``_unprefixed_forms``, the forms spelt out one by one
    hs = progresslines._hs
    rng = random.Random(seed)
    pieces = PIECES + [b"[ab", b"[m-", b"[-", b"[_", b"12", b"123456", b"1234567", b"12345678", b"]", b":", b"-",
                       b"_", b"M", b"a", b"9", b"]:", b": ", b"1:"]
    data = b"\n".join(b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 8))) for _ in range(5000))

    def ends(exprs):
        db = hs.Database(mode=hs.HS_MODE_BLOCK)
        exprs = [e + progresslines._LINE_END for e in exprs]
        db.compile(expressions=exprs, ids=[0] * len(exprs), flags=[hs.HS_FLAG_MULTILINE] * len(exprs))
        found = set()
        db.scan(data, match_event_handler=lambda _id, _from, end, _flags, _ctx: found.add(end))
        return found
    one, ten = ends(progresslines._unprefixed()), ends(progresslines._unprefixed_forms())
    assert len(progresslines._unprefixed()) == 1 and one == ten and len(ten) > 100


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("compile_after", [0, 10**9])      # the hyperscan pass, the re pass
def test_the_rank_and_text_handed_over_are_the_split_lines(seed, compile_after, monkeypatch):
    # ``lines`` hands each wanted line's rank and text start to ``marks`` (no second split): they are
    # ``split_rank_prefix(clean(line))``'s, escapes that cleaning removes inside a prefix included
    monkeypatch.setattr(progresslines, "COMPILE_AFTER", compile_after)
    rng = random.Random(seed)
    pieces = PIECES + [b"[ra\x1b[0mnk2]: ", b"[rank1]: [ra", b"\x1b[0mnk2]: ", b"(Actor pid=3) [rank1]: "]
    data = b"\n".join(b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 9))) for _ in range(3000))
    handed = 0
    for ranks in ({1}, {None}, {None, 1}, {2}, {0, 3}):
        for start, end, want, rank, text in progresslines.lines(data, ranks):
            if want and text >= 0:
                handed += 1
                assert fields.split_rank_prefix(fields.clean(data[start:end])) == (rank, fields.clean(data[text:end]))
            if want:
                assert fields.split_rank_prefix(fields.clean(data[start:end]))[0] == rank
    assert handed


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("compile_after", [0, 10**9])      # the hyperscan pass, the re pass
def test_marks_on_random_prefixes_equal_the_per_line_reading(seed, compile_after, monkeypatch):
    monkeypatch.setattr(progresslines, "COMPILE_AFTER", compile_after)
    rng = random.Random(seed)
    data = b"\n".join(b"".join(rng.choice(PIECES + [b" 12 ", b"step 4", b"Epoch 3/9", b"iters: 7", b"loss 0.5"])
                               for _ in range(rng.randrange(0, 7))) for _ in range(1500))
    want = list(reference_marks(data, T0, 0.001, 2026))
    for ranks in ({1}, {None}, {None, 1}, {0, 3}, {3}):
        assert list(progress.marks(data, T0, 0.001, 2026, ranks)) == [m for m in want if m[0] in ranks]


@pytest.mark.skipif(progresslines._hs is None, reason="hyperscan not installed")
def test_a_rank_set_gets_its_database_only_once_it_lasts(monkeypatch, tmp_path):
    monkeypatch.setenv(diskcache.CACHE_ENV, str(tmp_path / "cache"))   # none kept on disk yet
    compiled = []
    real = progresslines._database.__wrapped__
    monkeypatch.setattr(progresslines, "_database", lambda ranks: compiled.append(ranks) or real(ranks))
    monkeypatch.setattr(progresslines, "_asked", {})
    data = b"".join(b"[rank%d]: step %d loss 0.5\n" % (i % 4, i) for i in range(40))
    want = progresslines.lines(data, {1, 2})
    for _ in range(progresslines.COMPILE_AFTER - 1):
        assert progresslines.lines(data, {1, 2}) == want
    assert compiled == []                               # a set asked for once or twice: the re pass
    assert progresslines.lines(data, {1, 2}) == want and compiled == [frozenset({1, 2})]
    many = set(range(4096))                             # past MAX_COMPILED_RANKS: never compiled
    for _ in range(progresslines.COMPILE_AFTER + 1):
        assert [s for s, *_ in progresslines.lines(data, many)] == [s for s, *_ in progresslines.lines(data, None)]
    assert [ranks for ranks in compiled if ranks is not None] == [frozenset({1, 2})]


@pytest.mark.skipif(progresslines._hs is None, reason="hyperscan not installed")
def test_a_rank_sets_database_is_compiled_once_per_machine(monkeypatch, tmp_path):
    """The database of a rank set is kept on disk: a new process (here: its in-memory cache
    cleared) loads it instead of compiling it again, and reads the same lines with it."""
    monkeypatch.setenv(diskcache.CACHE_ENV, str(tmp_path / "cache"))
    ranks = frozenset({5, None})
    data = chunk(3)
    progresslines._database.cache_clear()
    want = progresslines._ends(data, ranks)
    progresslines._database.cache_clear()

    class NoCompile:
        def __init__(self, *args, **kwargs):
            raise AssertionError("compiled again")
    monkeypatch.setattr(progresslines._hs, "Database", NoCompile)
    assert progresslines._ends(data, ranks) == want
    progresslines._database.cache_clear()


@pytest.mark.skipif(progresslines._hs is None, reason="hyperscan not installed")
def test_a_rank_set_kept_on_disk_is_scanned_with_its_database_at_once(monkeypatch, tmp_path):
    """A database on disk costs no compile: a new process (its counts and in-memory cache
    cleared) scans with it from the rank set's first chunk, not with the re pass."""
    monkeypatch.setenv(diskcache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(progresslines, "_asked", {})
    ranks = frozenset({6, None})
    data = chunk(4)
    progresslines._database.cache_clear()
    progresslines._database(ranks)                       # compiled and kept on disk
    progresslines._database.cache_clear()
    want = progresslines.lines(data, ranks)
    monkeypatch.setattr(progresslines, "_asked", {})
    monkeypatch.setattr(progresslines, "finder", lambda _ranks: pytest.fail("re pass"))
    assert progresslines.lines(data, ranks) == want
    progresslines._database.cache_clear()


@pytest.mark.parametrize("seed", range(5))
def test_the_veto_by_substrings_equals_the_veto_regex(seed):
    """``_vetoed_lower`` (its words as substrings, then ``timed? ?out``) answers what the
    lower-case veto regex answers, on text made of its words' pieces."""
    rng = random.Random(seed)
    pieces = ["error", "err", "or", "exception", "traceback", "fail", "time", "timed", "out", " ", "d", "abort",
              "killed", "kill", "fatal", "fat", "step 3", "x", "t", "ime o", "ut"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 6)))
        assert progress._vetoed_lower(text) == (progress._VETO_LOWER.search(text) is not None), text


@pytest.mark.parametrize("line", [
    b"srun: Terminating job step 448213.0",
    b"srun: Force Terminated job step 448213.0",
    b"slurmstepd: error: *** STEP 448213.0 ON gpu-n07 CANCELLED AT 2020-11-12T21:40:03 ***",
])
def test_slurms_tear_down_of_a_job_step_is_no_training_progress(line: bytes):
    """Slurm's step id (``<jobid>.<stepid>``) in srun's and slurmstepd's tear-down lines names a step
    that ends: after a task's traceback, these lines must not read as the job going on past it."""
    assert not list(progress.marks(line + b"\n", T0, 0.0, 2026))


def test_a_plain_step_line_is_still_progress():
    assert list(progress.marks(b"step 120 loss 2.31\n", T0, 0.0, 2026))


def _all_at_once(data: bytes, ranks) -> list:
    """``progresslines.lines`` as first written: the whole chunk's candidates, then the walk back
    from every wanted line (the reference for the piecewise reader, ``iter_lines``)."""
    out = {}
    known: dict = {}
    for start, end, sure in progresslines._candidates(data, None if ranks is None else frozenset(ranks), 1 << 62):
        if not sure and progresslines.HAS_LITERAL.search(data, start, end) is None:
            continue
        rank, text = None, -1
        if ranks is not None:
            first = data[start] if start < end else 32
            rank, text = ((None, start) if first < 128 and first not in progresslines._PREFIXED
                          else progresslines._rank(data, start, end, {}))
            if rank not in ranks:
                continue
        out[start] = (start, end, True, rank, text)
    if ranks is not None:
        for start in list(out):
            end = start - 1
            while end >= 0:
                prev = data.rfind(b"\n", 0, end) + 1
                if end > prev and data[end - 1] not in progresslines._MAY_RUN_ON:
                    break
                if data[prev:end].strip():
                    if not progresslines.TAIL.search(data, prev, end):
                        break
                    if prev not in out and progresslines.HAS_LITERAL.search(data, prev, end):
                        out[prev] = (prev, end, False, None, -1)
                end = prev - 1
    return [out[start] for start in sorted(out)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("compile_after", [0, 10**9])      # the hyperscan pass, the re pass
def test_lines_read_piece_by_piece_are_those_of_the_whole_chunk(seed, compile_after, monkeypatch):
    # ``iter_lines`` scans a chunk a piece of whole lines at a time and walks back only to the wanted
    # line before (issue 16: a caller that stops early leaves the rest unread): the same lines as
    # the whole chunk read at once, whatever the piece size, run-on tails across pieces included
    monkeypatch.setattr(progresslines, "COMPILE_AFTER", compile_after)
    rng = random.Random(seed)
    pieces = PIECES + [b"iteration 3/", b"Epoch ", b"step:", b"loss=", b"(train)", b"\n", b"\n\n", b"'", b"=", b"("]
    data = b"\n".join(b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 9))) for _ in range(1500))
    data += b"\n" if seed % 2 else b""
    for ranks in (None, {1}, {None}, {None, 1}, {0, 3}, set(), {None, 0, 1, 2, 3, 12}):
        want = _all_at_once(data, ranks)
        for piece in (1, 7, 200, 4096, len(data) + 1):
            assert list(progresslines.iter_lines(data, ranks, piece)) == want, (ranks, piece)
    assert want
