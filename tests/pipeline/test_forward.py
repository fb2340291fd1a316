"""The Forward listener over real sockets, with raw frames and the real fluent-logger client (SPEC S3)."""

from __future__ import annotations

import contextlib
import os
import queue
import select
import socket
import ssl
import threading
import time

import msgpack
import pytest
from fluent import asyncsender
from fluent import sender as syncsender

from ftwatch.errors import SourceError
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.forward import ForwardSource
from ftwatch.pipeline.sources.forward_protocol import (
    MODES, event_time, pack_request, ping, shared_key_digest,
)

DEADLINE = 20.0   # seconds any single wait may take before the test fails


@contextlib.contextmanager
def listening(out: queue.Queue | None = None, **kw):
    src = ForwardSource(out if out is not None else queue.Queue(), port=0, **kw)
    src.start()
    try:
        yield src
    finally:
        src.stop()
        while Client.opened:
            Client.opened.pop().close()


class Client:
    """A raw Forward client: sends bytes, reads msgpack replies (closed when ``listening`` ends)."""

    opened: list[Client] = []

    def __init__(self, port: int, tls: ssl.SSLContext | None = None):
        sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        self.sock = tls.wrap_socket(sock, server_hostname="localhost") if tls else sock
        Client.opened.append(self)
        self.unpacker = msgpack.Unpacker(raw=False)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = DEADLINE):
        self.sock.settimeout(timeout)
        for obj in self.unpacker:
            return obj
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("server closed the connection")
            self.unpacker.feed(data)
            for obj in self.unpacker:
                return obj

    def closed_by_server(self) -> bool:
        self.sock.settimeout(DEADLINE)
        try:
            while self.sock.recv(65536):
                pass
        except (ConnectionResetError, ssl.SSLError):
            pass
        return True

    def close(self) -> None:
        self.sock.close()


def batch(out: queue.Queue) -> list[Shipped]:
    return out.get(timeout=DEADLINE)


# ---- every mode, shape, time form; ack only with chunk ----

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_meta", [False, True], ids=["[time,record]", "[[time,meta],record]"])
@pytest.mark.parametrize("chunk", [None, "9f86d081884c7d659a2feaa0c55ad015"], ids=["no-chunk", "chunk"])
def test_modes_over_a_socket(mode, with_meta, chunk):
    meta = {"trace_id": "abc"} if with_meta else None
    entries = [(1_700_000_000, {"log": "first\n", "stream": "stderr"}, meta),
               (event_time(1_700_000_001.5), {"log": "second", "stream": "stdout"}, meta)]
    if mode == "message":
        entries = entries[:1]
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        c = Client(src.port)
        c.send(pack_request("kube.w0", entries, mode, chunk=chunk))
        got = batch(out)
        # A second request that asks for an ack: the first reply must be its ack, so the
        # request without chunk got none.
        c.send(pack_request("kube.w0", [(1, {"log": "probe"}, None)], "message", chunk="probe"))
        if chunk is not None:
            assert c.recv() == {"ack": chunk}
        assert c.recv() == {"ack": "probe"}
        c.close()
    assert [s.line for s in got] == [b"first", b"second"][:len(entries)]
    assert [s.time for s in got] == [1_700_000_000.0, 1_700_000_001.5][:len(entries)]
    assert all(s.meta["tag"] == "kube.w0" for s in got)
    assert got[0].meta["stream"] == "stderr"
    if with_meta and mode != "message":
        assert got[0].meta["fluentbit_metadata"] == {"trace_id": "abc"}
    else:
        assert "fluentbit_metadata" not in got[0].meta


def test_packed_forward_as_str_and_two_gzip_members_over_a_socket():
    entries = [(i, {"log": f"line {i}"}, None) for i in range(6)]
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        c = Client(src.port)
        c.send(pack_request("t", entries, "packed_forward", chunk="s", as_str=True))
        c.send(pack_request("t", entries, "compressed_packed_forward", chunk="z", gzip_members=2))
        assert [c.recv(), c.recv()] == [{"ack": "s"}, {"ack": "z"}]
    for _ in range(2):
        assert [s.line for s in batch(out)] == [f"line {i}".encode() for i in range(6)]


@pytest.mark.parametrize("ext", [b"\xd7\x00", b"\xc7\x08\x00"], ids=["fixext8", "ext8"])
def test_event_time_forms_over_a_socket(ext):
    frame = (b"\x94" + msgpack.packb("t") + ext + (1_700_000_000).to_bytes(4, "big")
             + (123_000_000).to_bytes(4, "big") + msgpack.packb({"log": "x"}) + msgpack.packb({"chunk": "c"}))
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        c = Client(src.port)
        c.send(b"\xc0" + frame + b"\xc0")   # nil heartbeats around it
        assert c.recv() == {"ack": "c"}
    (s,) = batch(out)
    assert s.time == pytest.approx(1_700_000_000.123, abs=1e-6)
    assert out.empty() and src.stats["messages"] == 1


def test_line_and_meta_rules():
    records = [{"message": "from message", "level": "E"},
               {"log": b"\xffraw\xfe bytes\n"},   # str type (use_bin_type=False) holding invalid UTF-8
               {"log": 42},
               {"kubernetes": {"pod_name": "w-1"}, "tag": "record's own"}]
    frame = msgpack.packb(["t", [[1, r] for r in records], {"chunk": "c"}], use_bin_type=False)
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        c = Client(src.port)
        c.send(frame)
        assert c.recv() == {"ack": "c"}
    got = batch(out)
    assert got[0].line == b"from message" and got[0].meta == {"level": "E", "tag": "t"}
    assert got[1].line == b"\xffraw\xfe bytes"          # invalid UTF-8 kept byte for byte
    assert got[2].line == b"42"
    assert got[3].line == b'{"kubernetes": {"pod_name": "w-1"}, "tag": "record\'s own"}'
    assert got[3].meta == {"kubernetes": {"pod_name": "w-1"}, "tag": "t"}


def test_ack_only_after_the_batch_is_on_the_queue():
    out: queue.Queue = queue.Queue(maxsize=1)
    out.put("blocker")
    with listening(out) as src:
        c = Client(src.port)
        c.send(pack_request("t", [(1, {"log": "x"}, None)], "forward", chunk="c1"))
        with pytest.raises(socket.timeout):   # the queue is full: no ack yet
            c.recv(timeout=0.5)
        assert out.get_nowait() == "blocker"
        assert c.recv() == {"ack": "c1"}
        assert [s.line for s in out.get_nowait()] == [b"x"]   # already there when the ack came


def test_stop_while_blocked_drops_the_request_unacked():
    out: queue.Queue = queue.Queue(maxsize=1)
    out.put("blocker")
    src = ForwardSource(out, port=0)
    src.start()
    c = Client(src.port)
    c.send(pack_request("t", [(1, {"log": "x"}, None)], "forward", chunk="c1"))
    with pytest.raises(socket.timeout):   # blocked in put
        c.recv(timeout=0.5)
    src.stop()
    with pytest.raises((EOFError, ConnectionResetError)):   # closed with no ack: the client resends
        c.recv()
    c.close()
    assert out.get_nowait() == "blocker" and out.empty()


def test_port_in_use_is_a_source_error():
    with listening() as src:
        with pytest.raises(SourceError, match="cannot listen"):
            ForwardSource(queue.Queue(), port=src.port).start()


# ---- the real fluent-logger client ----

def test_fluent_logger_sync_sender():
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        logger = syncsender.FluentSender("train", host="127.0.0.1", port=src.port)
        assert logger.emit("rank0", {"log": "step 1", "rank": 0})
        logger.close()
        ns = syncsender.FluentSender("train", host="127.0.0.1", port=src.port, nanosecond_precision=True)
        assert ns.emit_with_time("rank1", 1_700_000_000.123456, {"message": "step 2", "rank": 1})
        ns.close()
        # two connections, one reader thread each: which one queues first is not fixed
        first, second = sorted((batch(out)[0], batch(out)[0]), key=lambda s: s.line)
    assert (first.line, first.meta) == (b"step 1", {"rank": 0, "tag": "train.rank0"})
    assert first.time == int(first.time)                      # integer seconds
    assert (second.line, second.meta) == (b"step 2", {"rank": 1, "tag": "train.rank1"})
    assert second.time == pytest.approx(1_700_000_000.123456, abs=1e-6)   # EventTime arrived


def test_fluent_logger_async_sender_delivers_everything():
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        logger = asyncsender.FluentSender("job", host="127.0.0.1", port=src.port, nanosecond_precision=True)
        for i in range(200):
            logger.emit("w", {"log": f"line {i}"})
        logger.close()   # flushes its queue
        lines = [s.line for _ in range(200) for s in batch(out)]
    assert lines == [f"line {i}".encode() for i in range(200)]


# ---- shared key and TLS ----

def handshake(c: Client, key: str, hostname: str = "client.example") -> list:
    helo = c.recv()
    assert helo[0] == "HELO" and helo[1]["auth"] == "" and helo[1]["keepalive"] is True
    nonce, salt = helo[1]["nonce"], os.urandom(16)
    c.send(ping(hostname, salt, shared_key_digest(salt, hostname, nonce, key)))
    reply = c.recv()
    if reply[1]:
        assert reply[4] == shared_key_digest(salt, "srv.example", nonce, key)   # PONG digest
    return reply


def test_shared_key_right_key_works():
    out: queue.Queue = queue.Queue()
    with listening(out, shared_key="s3cret", self_hostname="srv.example") as src:
        c = Client(src.port)
        assert handshake(c, "s3cret")[:4] == ["PONG", True, "", "srv.example"]
        c.send(pack_request("t", [(1, {"log": "authed"}, None)], "forward", chunk="c"))
        assert c.recv() == {"ack": "c"}
    assert [s.line for s in batch(out)] == [b"authed"]


def test_shared_key_wrong_key_is_refused_and_data_before_ping_too():
    out: queue.Queue = queue.Queue()
    with listening(out, shared_key="s3cret", self_hostname="srv.example") as src:
        c = Client(src.port)
        assert handshake(c, "wrong")[:3] == ["PONG", False, "shared_key mismatch"]
        assert c.closed_by_server()
        c2 = Client(src.port)
        assert c2.recv()[0] == "HELO"
        c2.send(pack_request("t", [(1, {"log": "sneaky"}, None)], "forward", chunk="c"))
        assert c2.closed_by_server()
        assert src.stats["errors"] == 2
    assert out.empty()


def test_tls_with_shared_key(cert):
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(*cert)
    client = ssl.create_default_context(cafile=str(cert[0]))
    out: queue.Queue = queue.Queue()
    with listening(out, tls=server, shared_key="k", self_hostname="srv.example") as src:
        c = Client(src.port, tls=client)
        assert handshake(c, "k")[1] is True
        c.send(pack_request("t", [(1, {"log": "over tls"}, None)], "compressed_packed_forward", chunk="c"))
        assert c.recv() == {"ack": "c"}
        plain = Client(src.port)            # a client that does not speak TLS is refused
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            plain.send(pack_request("t", [(1, {"log": "plain"}, None)], "forward"))
        assert plain.closed_by_server()
        assert src.stats["errors"] == 1
    assert [s.line for s in batch(out)] == [b"over tls"] and out.empty()


# ---- bad input on one connection leaves the others alone (SPEC Q1) ----

def test_malformed_frame_closes_only_its_connection():
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        good, bad = Client(src.port), Client(src.port)
        good.send(pack_request("good", [(1, {"log": "g1"}, None)], "forward", chunk="g1"))
        bad.send(pack_request("bad", [(1, {"log": "b1"}, None)], "forward", chunk="b1"))
        assert good.recv() == {"ack": "g1"} and bad.recv() == {"ack": "b1"}
        bad.send(pack_request("bad", [(1, {"log": "b2"}, None)], "message", chunk="b2") + b"\xc1 garbage")
        assert bad.recv() == {"ack": "b2"}   # the good request before the garbage is still taken
        assert bad.closed_by_server()
        good.send(pack_request("good", [(2, {"log": "g2"}, None)], "packed_forward", chunk="g2"))
        assert good.recv() == {"ack": "g2"}
        stats = src.stats
    assert stats["errors"] == 1 and stats["connections"] == 2 and stats["acks"] == 4
    lines = sorted(s.line for _ in range(4) for s in batch(out))
    assert lines == [b"b1", b"b2", b"g1", b"g2"]


def test_frame_over_max_connection_buffer_closes_the_connection():
    out: queue.Queue = queue.Queue()
    with listening(out, max_connection_buffer=64 * 1024) as src:
        c = Client(src.port)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):   # closed mid-send is fine
            c.send(pack_request("t", [(i, {"log": "x" * 1000}, None) for i in range(200)], "forward", chunk="big"))
        assert c.closed_by_server()
        other = Client(src.port)
        other.send(pack_request("t", [(1, {"log": "small"}, None)], "forward", chunk="s"))
        assert other.recv() == {"ack": "s"}
        assert src.stats["errors"] == 1
    assert [s.line for s in batch(out)] == [b"small"] and out.empty()


# ---- backpressure: a full queue stops reading; nothing is lost ----

def test_backpressure_bounds_memory_and_loses_nothing():
    per, frames, bound = 100, 800, 1024 * 1024
    body = "y" * 500
    payloads = [pack_request("bp", [(1, {"log": f"{f}:{i}:{body}"}, None) for i in range(per)],
                             "forward", chunk=f"c{f}") for f in range(frames)]
    frame_len = len(payloads[0])
    out: queue.Queue = queue.Queue(maxsize=2)
    blocked, done = threading.Event(), threading.Event()
    progress = {"sent": 0, "acks": set()}

    def sender(port: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.setblocking(False)
        data, unpacker = memoryview(b"".join(payloads)), msgpack.Unpacker(raw=False)
        while len(progress["acks"]) < frames:
            want_write = [sock] if progress["sent"] < len(data) else []
            readable, writable, _ = select.select([sock], want_write, [], 1.0)
            if want_write and not writable and not readable:
                blocked.set()   # a whole second without room to send: the listener stopped reading
            if writable:
                progress["sent"] += sock.send(data[progress["sent"]:progress["sent"] + 65536])
            if readable:
                unpacker.feed(sock.recv(65536))
                progress["acks"].update(a["ack"] for a in unpacker)
        sock.close()
        done.set()

    with listening(out, max_connection_buffer=bound) as src:
        thread = threading.Thread(target=sender, args=(src.port,), daemon=True)
        thread.start()
        assert blocked.wait(60), "the sender was never blocked"
        read_by_ftwatch, sent = src.stats["bytes"], progress["sent"]
        print(f"\nbackpressure: sender blocked after {sent / 1e6:.1f} MB sent; ftwatch had read "
              f"{read_by_ftwatch / 1e6:.2f} MB, {src.buffered} bytes of it in a partial request")
        # ftwatch holds: 2 queued + 1 waiting batch, and at most a bounded partial request
        assert read_by_ftwatch <= 3 * frame_len + bound + 2 * 65536
        assert src.buffered <= bound + 65536
        assert sent > read_by_ftwatch                     # the rest waits in the kernel, not in ftwatch
        assert len(progress["acks"]) <= 3
        seen = []
        while not (done.is_set() and out.empty()):
            with contextlib.suppress(queue.Empty):
                seen.extend(s.line for s in out.get(timeout=0.2))
        thread.join(DEADLINE)
    assert len(seen) == per * frames
    assert seen == [f"{f}:{i}:{body}".encode() for f in range(frames) for i in range(per)]


# ---- speed (printed, never asserted) ----

def test_end_to_end_speed_is_printed():
    """One client sends fluent-bit-like Forward requests of 1000 entries, one ack in flight."""
    rec = {"log": "I1121 09:36:03.735000 step 100 loss 2.31 lr 1e-4 " + "x" * 60, "stream": "stderr",
           "kubernetes": {"pod_name": "w-0", "namespace_name": "ns", "host": "node-1"}}
    for mode in ("forward", "compressed_packed_forward"):
        n_req, per = 200, 1000
        frames = [pack_request("kube.t", [(event_time(1.7e9 + i), rec, None) for i in range(per)], mode,
                               chunk=f"{k:032x}") for k in range(n_req)]
        out: queue.Queue = queue.Queue(maxsize=64)
        with listening(out) as src:
            count = [0]
            consumer = threading.Thread(target=lambda: [count.__setitem__(0, count[0] + len(out.get(timeout=DEADLINE)))
                                                        for _ in range(n_req)], daemon=True)
            c = Client(src.port)
            start = time.perf_counter()
            consumer.start()
            for f in frames:
                c.send(f)
                c.recv()
            consumer.join(DEADLINE)
            elapsed = time.perf_counter() - start
        assert count[0] == n_req * per
        print(f"\nend to end {mode} over loopback, 1 client: {n_req * per / elapsed:,.0f} records/s")


# ---- connection limits and idle timeout (issue 17) ----

def until(cond, what: str) -> None:
    """Waits for an observable condition (never for time), failing after DEADLINE."""
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def acked(c: Client, tag: str) -> bool:
    c.send(pack_request("kube.w0", [(1, {"log": tag}, None)], "message", chunk=tag))
    return c.recv() == {"ack": tag}


def test_the_connection_over_max_connections_is_closed_while_the_others_are_served():
    from ftwatch.telemetry import Metrics
    metrics = Metrics()
    with listening(max_connections=2, count=metrics.count_connection) as src:
        first, second = Client(src.port), Client(src.port)
        until(lambda: src.stats["active"] == 2, "two connections open")
        third = Client(src.port)
        assert third.closed_by_server()
        assert src.stats["refused"] == 1 and src.stats["active"] == 2
        assert acked(first, "a") and acked(second, "b")      # the two open ones are served
        first.close()
        until(lambda: src.stats["active"] == 1, "the first connection released")
        assert acked(Client(src.port), "c")                  # its slot is free again
        assert src.stats["connections"] == 3
    value = metrics.connections.labels
    assert (value("forward", "accepted")._value.get(), value("forward", "refused")._value.get()) == (3, 1)


def test_an_idle_connection_is_closed_after_idle_timeout():
    with listening(idle_timeout=0.2) as src:
        silent = Client(src.port)
        assert silent.closed_by_server()                      # nothing sent at all
        talked = Client(src.port)
        assert acked(talked, "x")
        assert talked.closed_by_server()                      # idle after a request
        assert src.stats["idle_closed"] == 2 and src.stats["errors"] == 0
        until(lambda: src.stats["active"] == 0, "both released")


def test_shared_key_file_is_read_for_the_handshake_and_a_missing_one_is_a_source_error(tmp_path):
    """deploy/ftwatch mounts the key from a Secret: ``shared_key_file`` (whitespace stripped)."""
    import queue as _queue
    import pytest
    from ftwatch.config.watch import ForwardSourceConfig
    from ftwatch.errors import SourceError
    from ftwatch.pipeline.sources import build_source
    key = tmp_path / "shared_key"
    key.write_text("s3cret\n")
    source = build_source(ForwardSourceConfig(type="forward", port=0, shared_key_file=key), _queue.Queue(), tmp_path)
    assert source.shared_key == "s3cret"
    with pytest.raises(SourceError, match="shared_key_file"):
        build_source(ForwardSourceConfig(type="forward", port=0, shared_key_file=tmp_path / "none"),
                     _queue.Queue(), tmp_path)
