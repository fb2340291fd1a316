"""The pure Forward protocol v1 decoder and encoders (SPEC S3, Q1): no sockets."""

from __future__ import annotations

import gzip
import hashlib
import struct
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftwatch.errors import SourceError
from ftwatch.pipeline.sources.forward_protocol import (
    MODES, Entries, ForwardDecoder, ForwardProtocolError, Ping, event_time, helo, pack_ack,
    pack_request, password_digest, ping, pong, shared_key_digest,
)


def decode_all(data: bytes, **kw) -> list:
    return ForwardDecoder(**kw).feed(data)


def ext8_time(seconds: int, nanos: int) -> bytes:
    return b"\xc7\x08\x00" + struct.pack(">II", seconds, nanos)


def fixext8_time(seconds: int, nanos: int) -> bytes:
    return b"\xd7\x00" + struct.pack(">II", seconds, nanos)


# ---- modes, entry shapes, times ----

@pytest.mark.parametrize("encode", [fixext8_time, ext8_time], ids=["fixext8", "ext8"])
def test_event_time_in_message_mode_both_ext_forms(encode):
    frame = b"\x93" + msgpack.packb("app.x") + encode(1_700_000_000, 250_000_000) + msgpack.packb({"log": "hi"})
    (ev,) = decode_all(frame)
    assert ev == Entries("app.x", [(1_700_000_000.25, {"log": "hi"}, {})], None, "message", {})


def test_event_time_inside_forward_entries_with_metadata():
    entry = b"\x92\x92" + ext8_time(5, 500_000_000) + msgpack.packb({"m": 1}) + msgpack.packb({"log": "a"})
    frame = b"\x93" + msgpack.packb("t") + b"\x91" + entry + msgpack.packb({"chunk": "c"})
    (ev,) = decode_all(frame)
    assert ev.entries == [(5.5, {"log": "a"}, {"m": 1})] and ev.chunk == "c" and ev.mode == "forward"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_meta", [False, True], ids=["[time,record]", "[[time,meta],record]"])
def test_every_mode_both_shapes(mode, with_meta):
    meta = {"otel": {"trace": "x"}} if with_meta else None
    entries = [(1_700_000_001, {"log": "one"}, meta), (event_time(1_700_000_002.5), {"log": "two"}, meta)]
    if mode == "message":
        entries = entries[1:]
    (ev,) = decode_all(pack_request("kube.a", entries, mode, chunk="abc"))
    assert ev.mode == mode and ev.tag == "kube.a" and ev.chunk == "abc"
    want_meta = (meta or {}) if mode != "message" else {}
    expected = [(1_700_000_001.0, {"log": "one"}, want_meta), (1_700_000_002.5, {"log": "two"}, want_meta)]
    assert ev.entries == (expected[1:] if mode == "message" else expected)


def test_packed_forward_as_str_with_invalid_utf8_inside():
    entries = [(1, {"log": "\u00ff\u20ac"}, None), (2, {"b": b"\xff\xfe\x00"}, None)]
    frame = pack_request("t", entries, "packed_forward", as_str=True)
    assert frame[1 + 2] in (0xD9, 0xDA, 0xDB) or (frame[3] & 0xE0) == 0xA0   # a str, not bin
    (ev,) = decode_all(frame)
    assert ev.mode == "packed_forward"
    assert ev.entries == [(1.0, {"log": "\u00ff\u20ac"}, {}), (2.0, {"b": b"\xff\xfe\x00"}, {})]


def test_compressed_packed_forward_with_two_gzip_members():
    entries = [(i, {"log": f"line {i}"}, None) for i in range(10)]
    frame = pack_request("t", entries, "compressed_packed_forward", gzip_members=2)
    payload = msgpack.unpackb(frame)[1]
    assert payload.count(b"\x1f\x8b\x08") == 2
    (ev,) = decode_all(frame)
    assert [r["log"] for _, r, _ in ev.entries] == [f"line {i}" for i in range(10)]
    assert ev.option["compressed"] == "gzip"


def test_nil_heartbeat_is_skipped_between_requests():
    a = pack_request("a", [(1, {"log": "x"}, None)], "message")
    events = decode_all(b"\xc0" + a + b"\xc0\xc0" + a + b"\xc0")
    assert [e.tag for e in events] == ["a", "a"]


def test_ping_is_its_own_event():
    (ev,) = decode_all(ping("client.example", b"salt", "d" * 128, "", ""))
    assert ev == Ping("client.example", b"salt", "d" * 128, "", "")


def test_integer_and_float_times_and_msgpack_timestamp():
    frames = [msgpack.packb(["t", 7, {}]), msgpack.packb(["t", 7.5, {}]),
              msgpack.packb(["t", msgpack.Timestamp(8, 250_000_000), {}], datetime=False)]
    assert [e.entries[0][0] for e in decode_all(b"".join(frames))] == [7.0, 7.5, 8.25]


# ---- errors ----

@pytest.mark.parametrize("frame, words", [
    (msgpack.packb(42), "array or nil"),
    (msgpack.packb(["t"]), "2 to 4"),
    (msgpack.packb([1, 2, {}]), "tag must be a string"),
    (msgpack.packb(["t", 1, "not a map"]), "record must be a map"),
    (msgpack.packb(["t", 1]), "Message"),
    (msgpack.packb(["t", [[1]]]), "entry must be"),
    (msgpack.packb(["t", [["x", {}]]]), "time must be"),
    (msgpack.packb(["t", [[[1, "m"], {}]]]), "entry header"),
    (msgpack.packb(["t", [], "opt"]), "option must be a map"),
    (msgpack.packb(["t", [], {"chunk": 5}]), "chunk option"),
    (msgpack.packb(["t", b"\x92\x01", {}]), "end in the middle"),
    (msgpack.packb(["t", b"not gzip", {"compressed": "gzip"}]), "gzip"),
    (msgpack.packb(["t", gzip.compress(b"\x92\x01\x80")[:-5], {"compressed": "gzip"}]), "gzip"),
    (b"\x93\xa1t\xd6\x00\x00\x00\x00\x01\x81\xa1a\x01", "EventTime"),   # fixext4
    (b"\x93\xa1t\xc7\x04\x00\x00\x00\x00\x01\x80", "EventTime"),
    (b"\xc1", "malformed msgpack"),
    (msgpack.packb(["t", float("nan"), {}]), "not finite"),
])
def test_malformed_requests_name_the_problem(frame, words):
    with pytest.raises(ForwardProtocolError, match=words) as info:
        decode_all(frame)
    assert isinstance(info.value, SourceError)


def test_error_keeps_the_good_requests_before_it_and_the_decoder_stays_failed():
    good = pack_request("t", [(1, {"log": "ok"}, None)], "message", chunk="c1")
    decoder = ForwardDecoder()
    with pytest.raises(ForwardProtocolError) as info:
        decoder.feed(good + b"\xc1" + good)
    assert [e.chunk for e in info.value.events] == ["c1"]
    with pytest.raises(ForwardProtocolError, match="already failed"):
        decoder.feed(good)


def test_request_longer_than_max_frame_size_is_refused_even_in_small_pieces():
    big = pack_request("t", [(i, {"log": "x" * 100}, None) for i in range(100)], "forward")
    decoder = ForwardDecoder(max_frame_size=4096)
    with pytest.raises(ForwardProtocolError, match="max_frame_size"):
        for i in range(0, len(big), 1000):
            decoder.feed(big[i:i + 1000])
    assert decoder.buffered <= 4096 + 64 * 1024
    # many small requests adding up to far more than the bound are fine
    small = pack_request("t", [(1, {"log": "x" * 100}, None)], "message")
    decoder = ForwardDecoder(max_frame_size=4096)
    assert len(decoder.feed(small * 1000)) == 1000 and decoder.buffered == 0


def test_gzip_expansion_is_bounded():
    bomb = gzip.compress(msgpack.packb([1, {"log": "a" * 1_000_000}]))
    frame = msgpack.packb(["t", bomb, {"compressed": "gzip"}])
    with pytest.raises(ForwardProtocolError, match="expand past"):
        decode_all(frame, max_decompressed_size=100_000)
    assert len(decode_all(frame)[0].entries[0][1]["log"]) == 1_000_000


# ---- handshake messages and digests (spec "Handshake Messages") ----

def test_digests_follow_the_spec_field_order():
    salt, nonce = b"\x01salt", b"\x02nonce"
    want = hashlib.sha512(salt + b"client" + nonce + b"key").hexdigest()
    assert shared_key_digest(salt, "client", nonce, "key") == want
    assert password_digest(b"auth", "user", "pw") == hashlib.sha512(b"authuserpw").hexdigest()


def test_helo_pong_ack_shapes():
    assert msgpack.unpackb(helo(b"n", b"", keepalive=True)) == ["HELO", {"nonce": b"n", "auth": "", "keepalive": True}]
    assert msgpack.unpackb(pong(True, "", "srv", "ab")) == ["PONG", True, "", "srv", "ab"]
    assert msgpack.unpackb(pack_ack("0123abcd")) == {"ack": "0123abcd"}


# ---- hypothesis: round trips in arbitrary splits, garbage only ever raises our error ----

text = st.text(max_size=12)
values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | text
                      | st.binary(max_size=12) | st.floats(allow_nan=False),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                      max_leaves=8)
records = st.dictionaries(text, values, max_size=4)
times = st.one_of(st.integers(0, 2**32 - 1).map(lambda s: (s, float(s))),
                  st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 999_999_999)).map(
                      lambda p: (msgpack.ExtType(0, struct.pack(">II", *p)), p[0] + p[1] / 1e9)))
entries = st.tuples(times, records, st.none() | st.dictionaries(text, values, min_size=1, max_size=2))


@st.composite
def requests(draw):
    mode = draw(st.sampled_from(MODES))
    es = draw(st.lists(entries, min_size=1, max_size=1 if mode == "message" else 5))
    chunk = draw(st.none() | st.text(alphabet="0123456789abcdef", min_size=1, max_size=32))
    kw = {}
    if mode == "packed_forward":
        kw["as_str"] = draw(st.booleans())
    if mode == "compressed_packed_forward":
        kw["gzip_members"] = draw(st.integers(1, 3))
    tag = draw(st.text(min_size=1, max_size=10))
    frame = pack_request(tag, [(t, r, m) for (t, _), r, m in es], mode, chunk=chunk, **kw)
    want = [(f, r, (m or {}) if mode != "message" else {}) for (_, f), r, m in es]
    return frame, Entries(tag, want, chunk, mode)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=4), st.lists(st.integers(0, 10**6), max_size=8),
       st.booleans())
def test_round_trip_in_any_split(reqs, cuts, heartbeats):
    stream = (b"\xc0" if heartbeats else b"").join(f for f, _ in reqs)
    decoder = ForwardDecoder()
    got = [e for piece in split(stream, cuts) for e in decoder.feed(piece)]
    assert len(got) == len(reqs)
    for ev, (_, want) in zip(got, reqs):
        assert (ev.tag, ev.mode, ev.chunk) == (want.tag, want.mode, want.chunk)
        assert len(ev.entries) == len(want.entries)
        for (t, r, m), (wt, wr, wm) in zip(ev.entries, want.entries):
            assert t == pytest.approx(wt, abs=1e-6) and r == wr and dict(m) == wm
    assert decoder.buffered == 0


@settings(max_examples=500)
@given(st.binary(max_size=400), st.lists(st.integers(0, 10**6), max_size=5))
def test_random_bytes_raise_only_forward_protocol_error(data, cuts):
    decoder = ForwardDecoder(max_frame_size=256)
    try:
        for piece in split(data, cuts):
            decoder.feed(piece)
    except ForwardProtocolError:
        pass


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupted_requests_raise_only_forward_protocol_error(req, flips):
    frame = bytearray(req[0])
    for pos, byte in flips:
        frame[pos % len(frame)] = byte
    try:
        decode_all(bytes(frame))
    except ForwardProtocolError:
        pass


def test_decode_speed_is_printed():
    """Records/s of the pure decoder, request by request (best of 3; printed, never asserted)."""
    rec = {"log": "I1121 09:36:03.735000 step 100 loss 2.31 lr 1e-4 " + "x" * 60, "stream": "stderr",
           "kubernetes": {"pod_name": "w-0", "namespace_name": "ns", "host": "node-1"}}
    for mode in ("forward", "packed_forward", "compressed_packed_forward"):
        frame = pack_request("kube.t", [(event_time(1.7e9 + i), rec, None) for i in range(1000)], mode)
        best = 0.0
        for _ in range(3):
            decoder, n = ForwardDecoder(), 0
            start = time.perf_counter()
            for _ in range(100):
                n += sum(len(e.entries) for e in decoder.feed(frame))
            best = max(best, n / (time.perf_counter() - start))
        print(f"\ndecode {mode} (EventTime, 1000 entries/request): {best:,.0f} records/s, "
              f"{best * len(frame) / 1000 / 1e6:,.1f} MB/s on the wire")
