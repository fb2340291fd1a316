"""Container-runtime envelopes: CRI lines with P/F joining, docker json-file with 16 KiB pieces (SPEC S5, Q1)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftwatch.parsers.envelopes import CriLine, DockerLine, parse_cri, parse_docker, parse_rfc3339
from ftwatch.parsers.joiners import SPLIT_MARKER, CriJoiner, DockerJoiner, Joiners, unwrap
from ftwatch.pipeline.sources.base import Shipped

T0 = datetime(2026, 11, 21, 9, 36, 3, tzinfo=timezone.utc).timestamp()


def cri(stream: str, tag: str, msg: bytes, frac: str = "735123456") -> bytes:
    return b"2026-11-21T09:36:03.%s %s %s %s" % (frac.encode(), stream.encode(), tag.encode(), msg)


def docker(log: str, stream: str = "stderr", t: str = "2026-11-21T09:36:03.735123456Z") -> bytes:
    return json.dumps({"log": log, "stream": stream, "time": t}).encode()


# -- timestamps ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("2026-11-21T09:36:03Z", T0),
    ("2026-11-21T09:36:03.5Z", T0 + 0.5),
    ("2026-11-21T09:36:03.735123456Z", T0 + 0.735123456),
    ("2026-11-21T17:36:03.25+08:00", T0 + 0.25),
    ("2026-11-21T04:06:03-0530", T0),
    ("2026-11-21 09:36:03.000000", T0),          # out_http java_sql_timestamp: no zone, UTC
    (b"2026-11-21T09:36:03.1234567891234Z", T0 + 0.123456789),
])
def test_rfc3339(text, expected):
    assert parse_rfc3339(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("text", ["2026-02-30T00:00:00Z", "2026-11-21T25:00:00Z", "yesterday",
                                  "2026-11-21T09:36:03Zjunk", "", "2026-11-21"])
def test_rfc3339_rejects(text):
    assert parse_rfc3339(text) is None


# -- CRI -------------------------------------------------------------------------------------


def test_parse_cri_full_and_partial():
    line = parse_cri(cri("stderr", "F", b"KeyError: 'lr'"))
    assert line == CriLine(pytest.approx(T0 + 0.735123456), "stderr", False, b"KeyError: 'lr'")
    assert parse_cri(cri("stdout", "P", b"first half ")).partial is True
    assert parse_cri(cri("stdout", "F", b"")).message == b""
    assert parse_cri(b"2026-11-21T09:36:03Z stdout F").message == b""           # no space, no text
    assert parse_cri(cri("stdout", "F", b"  indented\tand  spaced ")).message == b"  indented\tand  spaced "
    assert parse_cri(cri("stdout", "F", b"ends\n")).message == b"ends"
    assert parse_cri(b"2026-11-21T09:36:03Z stdout F\n").message == b""
    assert parse_cri(b"2026-11-21T17:36:03+08:00 stdout P:X x").partial is True  # tags joined by ':'


@pytest.mark.parametrize("line", [
    b"", b"plain text", b"KeyError: 'lr'", b"2026-11-21T09:36:03Z stdlog F msg",
    b"2026-11-21T09:36:03Z stdout X msg", b"2026-11-21T09:36:03Z stdout f msg",
    b"2026-13-21T09:36:03Z stdout F msg", b"not-a-time stdout F msg", b"\xff\xfe\x00garbage",
    b"2026-11-21T09:36:03Z stdout Fmsg",
])
def test_parse_cri_rejects(line):
    assert parse_cri(line) is None


def test_cri_joiner_joins_partials_per_key_and_stream():
    j = CriJoiner()
    a_out, a_err, b_out = ("a", "stdout"), ("a", "stderr"), ("b", "stdout")
    assert j.push(a_out, parse_cri(cri("stdout", "P", b"a-out-1 "))) is None
    assert j.push(a_err, parse_cri(cri("stderr", "P", b"a-err-1 "))) is None
    assert j.push(b_out, parse_cri(cri("stdout", "P", b"b-out-1 "))) is None
    assert j.push(a_err, parse_cri(cri("stderr", "F", b"a-err-2"))) == b"a-err-1 a-err-2"
    assert j.push(a_out, parse_cri(cri("stdout", "P", b"a-out-2 "))) is None
    assert j.push(b_out, parse_cri(cri("stdout", "F", b"b-out-2"))) == b"b-out-1 b-out-2"
    assert j.push(a_out, parse_cri(cri("stdout", "F", b"a-out-3"))) == b"a-out-1 a-out-2 a-out-3"
    assert j.push(a_out, parse_cri(cri("stdout", "F", b"alone"))) == b"alone"
    assert j.joined == 3 and j.pending() == []


def test_cri_joiner_caps_a_runaway_partial_and_loses_nothing():
    j = CriJoiner(cap=10)
    key = ("p", "stdout")
    assert j.push(key, parse_cri(cri("stdout", "P", b"0123"))) is None
    assert j.push(key, parse_cri(cri("stdout", "P", b"456789"))) == b"0123456789" + SPLIT_MARKER
    assert j.push(key, parse_cri(cri("stdout", "F", b"end"))) == b"end"
    assert j.push(key, parse_cri(cri("stdout", "P", b"x" * 25))) == b"x" * 25 + SPLIT_MARKER
    assert j.split == 2


def test_cri_joiner_flush():
    j = CriJoiner()
    assert j.push("k", parse_cri(cri("stdout", "P", b"half"))) is None
    assert j.flush("k") == b"half" and j.flush("k") is None and j.flushed == 1


def test_unwrap_cri_sets_stream_time_and_drops_the_envelope():
    joiners = Joiners()
    meta = {"path": "/var/log/pods/ns_p_u/c/0.log", "envelope": "cri", "other": 1}
    out = unwrap(Shipped(1.0, cri("stderr", "P", b"Traceback (most "), meta), joiners)
    assert out == []
    out += unwrap(Shipped(1.0, cri("stdout", "F", b"step 3"), meta), joiners)
    out += unwrap(Shipped(1.0, cri("stderr", "F", b"recent call last):"), meta), joiners)
    assert [(s.line, s.meta["stream"]) for s in out] == [
        (b"step 3", "stdout"), (b"Traceback (most recent call last):", "stderr")]
    assert all(isinstance(s, Shipped) and s.time == pytest.approx(T0 + 0.735123456) for s in out)
    assert out[0].meta == {"path": meta["path"], "other": 1, "stream": "stdout"}
    assert meta["envelope"] == "cri"                     # the input is not changed


def test_unwrap_never_joins_two_files():
    joiners = Joiners()
    one, two = {"path": "/a/0.log", "envelope": "cri"}, {"path": "/b/0.log", "envelope": "cri"}
    assert unwrap(Shipped(0, cri("stdout", "P", b"A1 "), one), joiners) == []
    assert unwrap(Shipped(0, cri("stdout", "P", b"B1 "), two), joiners) == []
    assert unwrap(Shipped(0, cri("stdout", "F", b"B2"), two), joiners)[0].line == b"B1 B2"
    assert unwrap(Shipped(0, cri("stdout", "F", b"A2"), one), joiners)[0].line == b"A1 A2"


def test_unwrap_passes_malformed_lines_raw_and_counts_them():
    joiners = Joiners()
    for envelope, line in [("cri", b"not a cri line"), ("docker", b"{not json"), ("docker", b"[1,2]"),
                           ("docker", b'{"log": 3, "time": "2026-11-21T09:36:03Z"}'), ("gelf", b"x")]:
        s = Shipped(5.0, line, {"envelope": envelope})
        assert unwrap(s, joiners) == [s]
    assert joiners.malformed == {"cri": 1, "docker": 3, "gelf": 1}
    plain = Shipped(5.0, b"no envelope", {"path": "/x.log"})
    assert unwrap(plain, joiners) == [plain]
    assert joiners.counts()["malformed_docker"] == 3


def test_joiners_flush_hands_out_stale_partials_as_shipped():
    joiners = Joiners()
    meta = {"path": "/a/0.log", "envelope": "cri"}
    unwrap(Shipped(0, cri("stdout", "P", b"never finished"), meta), joiners)
    assert joiners.flush(before=T0) == []                       # not older than T0
    [s] = joiners.flush(before=T0 + 10)
    assert (s.line, s.meta, s.time) == (b"never finished", {"path": "/a/0.log", "stream": "stdout"},
                                         pytest.approx(T0 + 0.735123456))
    assert joiners.flush() == []


# -- docker json-file --------------------------------------------------------------------------


def test_parse_docker():
    d = parse_docker(docker("RuntimeError: CUDA error\n"))
    assert d == DockerLine(pytest.approx(T0 + 0.735123456), "stderr", b"RuntimeError: CUDA error\n")
    t, stream, message = d                      # a 3-tuple
    assert stream == "stderr" and not d.partial
    assert parse_docker(docker("x" * 10)).partial
    assert parse_docker(json.dumps({"log": "中文\n", "time": "2026-11-21T09:36:03Z"}).encode()).message == \
        "中文\n".encode()
    assert parse_docker(b'{"log":"bad \xff utf8\\n","stream":"stdout","time":"2026-11-21T09:36:03Z"}').message \
        == "bad \ufffd utf8\n".encode()


def test_docker_16k_pieces_are_joined():
    long = "E" * 40000
    pieces = [long[i:i + 16384] for i in range(0, len(long), 16384)]
    joiners = Joiners()
    meta = {"path": "/var/lib/docker/containers/abc/abc-json.log", "envelope": "docker"}
    out = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        out += unwrap(Shipped(0, docker(piece + ("\n" if last else "")), meta), joiners)
        out += unwrap(Shipped(0, docker("interleaved stdout\n", "stdout"), meta), joiners)
    assert [s.line for s in out] == [b"interleaved stdout"] * 2 + [long.encode()] + [b"interleaved stdout"]
    assert joiners.docker.joined == 1


def test_docker_joiner_direct():
    j = DockerJoiner()
    assert j.push("k", parse_docker(docker("abc"))) is None
    assert j.push("k", parse_docker(docker("def\n"))) == b"abcdef"
    assert j.push("k", parse_docker(docker("\n"))) == b""


def test_ten_megabyte_lines_and_garbage_never_raise():
    big = b"x" * (10 * 1024 * 1024)
    assert parse_cri(cri("stdout", "F", big)).message == big
    assert parse_cri(big) is None and parse_docker(big) is None
    assert parse_docker(b"\x00" * 1000 + b"\xff" * 1000) is None
    assert parse_docker(b"[" * 100000) is None                    # deep nesting
    joiners = Joiners()
    s = Shipped(0, b"\xff" * 1000, {"envelope": "docker"})
    assert unwrap(s, joiners) == [s]


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_parsers_never_raise(data):
    for line in (data, b"2026-11-21T09:36:03Z stdout F " + data, b'{"log":' + data):
        c = parse_cri(line)
        assert c is None or isinstance(c.message, bytes)
        d = parse_docker(line)
        assert d is None or isinstance(d.message, bytes)
        s = Shipped(0, line, {"envelope": "cri"})
        assert isinstance(unwrap(s, Joiners()), list)


pieces = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["stdout", "stderr"]),
                            st.booleans(), st.binary(max_size=40).filter(lambda b: b"\n" not in b)),
                  max_size=60)


@settings(max_examples=300, deadline=None)
@given(pieces, st.integers(min_value=1, max_value=64))
def test_cri_joiner_loses_no_bytes(items, cap):
    """Per (key, stream): every byte of every piece comes out once, in order, lines split at F."""
    j = CriJoiner(cap=cap)
    got: dict = {}
    want: dict = {}
    for key, stream, partial, msg in items:
        k = (key, stream)
        want.setdefault(k, [b""])
        want[k][-1] += msg
        if not partial:
            want[k].append(b"")
        out = j.push(k, CriLine(0.0, stream, partial, msg))
        if out is not None:
            got.setdefault(k, []).append(out)
    for k in want:
        rest = j.flush(k)
        if rest is not None:
            got.setdefault(k, []).append(rest)
        text = b"".join(got.get(k, []))
        assert text.replace(SPLIT_MARKER, b"") == b"".join(want[k])
        # a line that ended with F before reaching the cap comes out whole, as one message
        for line in want[k][:-1]:
            if len(line) < cap:
                assert line in got[k]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=30))
def test_docker_joiner_round_trip(lines):
    """Lines cut into arbitrary pieces and re-joined come back exactly."""
    j = DockerJoiner()
    out = []
    for text in lines:
        text = text.replace("\n", " ")
        cut = [text[i:i + 7] for i in range(0, len(text), 7)] or [""]
        for i, piece in enumerate(cut):
            last = i == len(cut) - 1
            d = parse_docker(docker(piece + ("\n" if last else "")))
            assert d is not None
            res = j.push("k", d)
            assert (res is None) != last
            if res is not None:
                out.append(res)
    assert out == [t.replace("\n", " ").encode("utf-8", "surrogatepass") for t in lines]
