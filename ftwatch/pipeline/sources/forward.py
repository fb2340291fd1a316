"""A TCP listener for fluent-bit's ``out_forward`` (and any Forward protocol v1 client) (SPEC S3).

Decoding lives in :mod:`ftwatch.pipeline.sources.forward_protocol` (pure); this module owns the
sockets. One thread accepts connections, one thread per connection reads it, decodes each request
(Message, Forward, PackedForward, CompressedPackedForward, per "Fluentd Forward Protocol
Specification (v1)") and puts ONE ``list[Shipped]`` per request on ``out``. Only once ``put``
has returned does it answer ``{"ack": chunk}`` to a request that carried a ``chunk`` option, so an
ack means the data is on ftwatch's queue (at-least-once: a client that gets no ack sends again).

Exactly once (``require_ack``, ``ftwatch watch``, issue 17): a request with a ``chunk`` option is
answered only once the consumer has acknowledged its batch, and one sent again (its id stored, or
in flight on another connection) is acked without queueing its records again, counted in
``stats["repeated"]`` (:mod:`ftwatch.pipeline.sources.chunkacks`). Requests without a ``chunk``
option carry no id and stay at-most-once across a kill.

Each entry becomes a ``Shipped``: ``log`` (else ``message``) is the line, as UTF-8 bytes with
invalid input kept byte for byte (surrogateescape), one trailing newline removed, a non-string
value JSON-encoded; a record with neither is JSON-encoded whole as the line. ``meta`` is the
record's other fields plus ``tag`` (the request's tag; it wins over a record field of that name)
and, for fluent-bit >= 2.1 ``[[time, metadata], record]`` entries with non-empty metadata,
``fluentbit_metadata``. ``time`` is the entry's time (EventTime keeps its fraction).

Shared key (spec "Handshake Messages"): with ``shared_key`` set the server sends HELO on connect
(no user authentication: ``auth`` is empty), expects PING, checks its digest and answers PONG
(``auth_result`` false, then close, when the key is wrong). ``tls`` wraps every connection.

Errors: a malformed request, a request longer than ``max_connection_buffer`` bytes, a failed
handshake, or data before PING closes that connection, counted in ``stats["errors"]`` and logged;
requests decoded before the bad one are still queued and acked; other connections go on.

Memory bound (backpressure): a full ``out`` blocks the connection's thread in ``put``, so it stops
reading and TCP pushes back on the sender. Per connection ftwatch then holds at most
``max_connection_buffer`` + 64 KiB bytes of a request in progress, a 64 KiB read buffer, the
decoded requests of one read, and the batch waiting to be queued (a gzip request expands to at
most ``MAX_DECOMPRESSED_SIZE`` bytes). Decoded Python objects take typically 3-5x their bytes.

Connections (issue 17, :mod:`ftwatch.pipeline.sources.connlimit`): at most ``max_connections``
at once (one more is closed as soon as it is accepted, counted ``refused``), and one that sends
nothing for ``idle_timeout`` seconds once its handshakes are done is closed (``idle_closed``);
the TLS and shared-key handshakes have their own ``HANDSHAKE_TIMEOUT``.

Binds to 127.0.0.1 unless told otherwise (SPEC Q2).

A little over 400 lines: the sockets, the handshakes and the fast entry conversion are one
request's path, read top to bottom.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import operator
import os
import queue
import selectors
import socket
import ssl
import threading
from collections import deque
from itertools import repeat
from typing import Any, Callable, Mapping

from ftwatch.errors import SourceError
from ftwatch.pipeline.sources.base import Shipped, put_until_stopped, record_line
from ftwatch.pipeline.sources.chunkacks import KEEP_CHUNK_SECONDS, KEEP_CHUNKS, ChunkAcks
from ftwatch.pipeline.sources.connlimit import ConnectionGate
from ftwatch.pipeline.sources.forward_protocol import (
    MAX_FRAME_SIZE, Entries, ForwardDecoder, ForwardProtocolError, Ping, helo, pack_ack, pong,
    shared_key_digest,
)

__all__ = ["ForwardSource", "to_shipped"]

log = logging.getLogger(__name__)

RECV_SIZE = 64 * 1024 # bytes per recv
HANDSHAKE_TIMEOUT = 10.0  # seconds for the TLS and shared-key handshakes
JOIN_TIMEOUT = 5.0        # seconds stop() waits for each thread
MAX_CONNECTIONS = 512     # the config's default (ftwatch.config.watch.ListenerLimits says why)
IDLE_TIMEOUT = 120.0      # seconds; the config's default, as above


class ForwardSource:
    """Receives Forward protocol v1 requests over TCP and queues them as ``list[Shipped]``.

    Args:
        out: the bounded queue batches go to; a full one blocks the connection (backpressure).
        host: address to bind; 127.0.0.1 unless told otherwise (SPEC Q2).
        port: TCP port (24224 is Forward's default); 0 picks a free one (see ``.port``).
        shared_key: enables the HELO/PING/PONG handshake with this key.
        self_hostname: the server hostname sent in PONG (and hashed into its digest).
        tls: a server-side SSL context; every connection is TLS when given.
        max_connection_buffer: bytes one request may span (fluent-bit in_forward's
            ``buffer_max_size`` default, 6 MiB); a longer one closes the connection.
        name: the source's name in logs.
        max_connections: connections held at once; one more is closed at once (module doc).
        idle_timeout: seconds a connection may send nothing before it is closed.
        count: called with ``(name, event)`` per connection event (``ConnectionGate``), or None.
        require_ack: answer a request's ``chunk`` only once the consumer acknowledged its batch,
            and skip a chunk sent again (module doc, "Exactly once"); False: ack once queued.
        seen: ``(name, chunk) -> bool``: whether the consumer's store holds that chunk id
            (``SqliteStore.chunk_seen``); None: none is stored.
        keep_chunks: how many chunk ids the store keeps (``ChunkMark.keep``).
        keep_chunk_seconds: how long the store keeps a chunk id (``ChunkMark.keep_seconds``).
        repeated: called with ``(name, records)`` for each request skipped as sent before, or None.

    Attributes:
        stats: a snapshot dict: ``connections`` (accepted), ``active``, ``messages`` (data
            requests queued), ``entries``, ``bytes`` (received), ``acks``, ``errors``,
            ``refused`` (over ``max_connections``), ``idle_closed``, ``repeated`` (requests
            acked and skipped: their chunk was handled before).
    """

    def __init__(self, out: queue.Queue, host: str = "127.0.0.1", port: int = 24224,
                 shared_key: str | None = None, self_hostname: str = "ftwatch",
                 tls: ssl.SSLContext | None = None, max_connection_buffer: int = MAX_FRAME_SIZE,
                 name: str = "forward", max_connections: int = MAX_CONNECTIONS,
                 idle_timeout: float = IDLE_TIMEOUT, count: Any = None, require_ack: bool = False,
                 seen: Callable[[str, str], bool] | None = None, keep_chunks: int = KEEP_CHUNKS,
                 keep_chunk_seconds: float = KEEP_CHUNK_SECONDS,
                 repeated: Callable[[str, int], None] | None = None):
        self.out = out
        self.require_ack = require_ack
        self.host = host
        self._port = port
        self.shared_key = shared_key
        self.self_hostname = self_hostname
        self.tls = tls
        self.max_connection_buffer = max_connection_buffer
        self.name = name
        self.gate = ConnectionGate(name, max_connections, idle_timeout, count)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.acks = ChunkAcks(name, out, self._stopping, self._count, seen, keep_chunks, keep_chunk_seconds,
                              repeated)
        self._stats = dict.fromkeys(("connections", "active", "messages", "entries", "bytes",
                                     "acks", "errors", "repeated"), 0)
        self._conns: dict[int, tuple[socket.socket, ForwardDecoder, threading.Thread]] = {}
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._acceptor: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one after ``start()`` with port 0)."""
        return self._port

    @property
    def stats(self) -> dict[str, int]:
        """A copy of the counters (see the class doc)."""
        gate = self.gate.stats
        with self._lock:
            return {**self._stats, "refused": gate["refused"], "idle_closed": gate["idle_closed"]}

    @property
    def buffered(self) -> int:
        """Bytes of requests in progress held by all connections' decoders right now."""
        with self._lock:
            decoders = [d for _, d, _ in self._conns.values()]
        return sum(d.buffered for d in decoders)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for key, n in deltas.items():
                self._stats[key] += n

    def start(self) -> None:
        """Binds, listens and starts the accept thread; returns at once.

        Raises:
            SourceError: the address cannot be bound, or the source was started before.
        """
        if self._acceptor is not None:
            raise SourceError(f"{self.name}: already started")
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            listener = socket.create_server((self.host, self._port), family=family, backlog=128)
        except OSError as err:
            raise SourceError(f"{self.name}: cannot listen on {self.host}:{self._port}: {err}") from err
        listener.setblocking(False)
        self._listener = listener
        self._port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"{self.name}-accept",
                                          daemon=True)
        self._acceptor.start()
        log.info("%s: listening for Forward on %s:%d%s%s", self.name, self.host, self._port,
                 " (TLS)" if self.tls else "", " (shared key)" if self.shared_key else "")

    def stop(self) -> None:
        """Stops accepting, closes every connection and joins the threads; idempotent.

        A request whose batch was not yet queued is dropped unacked (its client sends it again).
        """
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        if self._acceptor is not None:
            self._acceptor.join(JOIN_TIMEOUT)
        with self._lock:
            conns = list(self._conns.values())
        for sock, _, _ in conns:
            _shutdown(sock)
        for _, _, thread in conns:
            thread.join(JOIN_TIMEOUT)
        for s in (self._listener, self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    # ---- accepting ----

    def _accept_loop(self) -> None:
        assert self._listener is not None and self._wake_r is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r or self._stopping.is_set():
                        return
                    try:
                        conn, peer = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as err:
                        log.warning("%s: accept failed: %s", self.name, err)
                        continue
                    if not self.gate.admit():
                        log.warning("%s: refused a connection from %s: %d connections open already",
                                    self.name, peer, self.gate.max_connections)
                        conn.close()
                        continue
                    try:
                        self._spawn(conn, peer)
                    except Exception:     # no thread: give its slot back (SPEC Q1: go on)
                        self.gate.release()
                        conn.close()
                        log.exception("%s: cannot serve a connection from %s", self.name, peer)

    def _spawn(self, conn: socket.socket, peer: Any) -> None:
        conn.settimeout(self.gate.idle_timeout)   # blocking reads that end when it is idle
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        decoder = ForwardDecoder(self.max_connection_buffer)
        thread = threading.Thread(target=self._serve, args=(conn, peer, decoder),
                                  name=f"{self.name}-conn-{peer}", daemon=True)
        with self._lock:
            self._stats["connections"] += 1
            self._stats["active"] += 1
            self._conns[id(conn)] = (conn, decoder, thread)
        thread.start()

    # ---- one connection ----

    def _serve(self, sock: socket.socket, peer: Any, decoder: ForwardDecoder) -> None:
        key = id(sock)
        try:
            if self.tls is not None or self.shared_key is not None:
                sock.settimeout(HANDSHAKE_TIMEOUT)
            if self.tls is not None:
                tls_sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                with self._lock:   # stop() must shut down the socket that is read from
                    self._conns[key] = (tls_sock, decoder, self._conns[key][2])
                sock = tls_sock
                if self._stopping.is_set():
                    return
                sock.do_handshake()
                if self.shared_key is None:
                    sock.settimeout(self.gate.idle_timeout)
            self._read(sock, peer, decoder)
        except ForwardProtocolError as err:
            self._count(errors=1)
            log.warning("%s: closing connection from %s: %s", self.name, peer, err)
        except (OSError, ValueError) as err:   # ssl.SSLError is an OSError
            if not self._stopping.is_set():
                if isinstance(err, (ssl.SSLError, socket.timeout)):
                    self._count(errors=1)
                    log.warning("%s: connection from %s failed: %s", self.name, peer, err)
                else:
                    log.info("%s: connection from %s dropped: %s", self.name, peer, err)
        except Exception:   # a bug here must not take the monitor down (SPEC Q1)
            self._count(errors=1)
            log.exception("%s: connection from %s failed unexpectedly", self.name, peer)
        finally:
            _shutdown(sock)
            sock.close()
            with self._lock:
                self._conns.pop(key, None)
                self._stats["active"] -= 1
            self.gate.release()

    def _read(self, sock: socket.socket, peer: Any, decoder: ForwardDecoder) -> None:
        nonce = None
        if self.shared_key is not None:
            nonce = os.urandom(16)
            sock.sendall(helo(nonce, b"", keepalive=True))
        buf = bytearray(RECV_SIZE)
        view = memoryview(buf)
        while not self._stopping.is_set():
            try:
                n = sock.recv_into(buf)
            except TimeoutError:
                if nonce is not None:     # the shared-key handshake timed out: an error
                    raise
                self.gate.idle_closed()
                log.info("%s: closing the connection from %s: idle for %gs", self.name, peer,
                         self.gate.idle_timeout)
                return
            if n == 0:
                return
            self._count(bytes=n)
            try:
                events = decoder.feed(view[:n])
            except ForwardProtocolError as err:
                for event in err.events:
                    nonce = self._handle(sock, peer, event, nonce)
                raise
            for event in events:
                nonce = self._handle(sock, peer, event, nonce)

    def _handle(self, sock: socket.socket, peer: Any, event: Entries | Ping,
                nonce: bytes | None) -> bytes | None:
        """Acts on one request; returns the nonce still awaiting a PING (None once authenticated)."""
        if isinstance(event, Ping):
            if nonce is None:
                raise ForwardProtocolError("unexpected PING (no handshake pending)")
            assert self.shared_key is not None
            expected = shared_key_digest(event.shared_key_salt, event.client_hostname, nonce,
                                         self.shared_key)
            if not hmac.compare_digest(expected.encode(), event.shared_key_hexdigest.encode("utf-8", "replace")):
                sock.sendall(pong(False, "shared_key mismatch", self.self_hostname, ""))
                raise ForwardProtocolError(f"shared key mismatch (client {event.client_hostname!r})")
            sock.sendall(pong(True, "", self.self_hostname, shared_key_digest(
                event.shared_key_salt, self.self_hostname, nonce, self.shared_key)))
            sock.settimeout(self.gate.idle_timeout)
            log.info("%s: %s authenticated as %r", self.name, peer, event.client_hostname)
            return None
        if nonce is not None:
            raise ForwardProtocolError("data before the PING of the shared-key handshake")
        if self.require_ack and event.chunk is not None and event.entries:
            self.acks.deliver(sock, event.chunk, len(event.entries), lambda: _shipped(event.tag, event.entries))
            return None
        batch = _shipped(event.tag, event.entries)
        if batch and not put_until_stopped(self.out, batch, self._stopping):
            raise OSError("stopping")   # not queued: no ack; the client sends it again
        self._count(messages=1, entries=len(batch), acks=event.chunk is not None)
        if event.chunk is not None:   # counted first, so a client holding its ack sees it counted
            sock.sendall(pack_ack(event.chunk))
        return None


def to_shipped(tag: str, time: float, record: dict, metadata: Mapping[str, Any]) -> Shipped:
    """One Forward entry as a ``Shipped`` (rules in the module doc)."""
    meta = dict(record)
    text = meta.pop("log", None)
    if text is None:
        text = meta.pop("message", None)
    line = record_line(record, text, "surrogateescape")
    meta["tag"] = tag
    if metadata:
        meta["fluentbit_metadata"] = dict(metadata)
    return Shipped(time, line, meta)


def _shipped(tag: str, entries: list[tuple[float, dict, Mapping[str, Any]]]) -> list[Shipped]:
    """A request's entries as Shipped, exactly as :func:`to_shipped` makes them, but faster.

    The decoder's record maps are fresh and used only here, so when every record has a string
    ``log`` (fluent-bit's usual records) each record becomes its Shipped's ``meta`` itself:
    ``log`` deleted and ``tag`` set in place (the same keys in the same order as the copy
    ``to_shipped`` makes), a whole column at a time with C-level ``map`` passes. Any other
    request goes through :func:`to_shipped` entry by entry.
    """
    if not entries:
        return []
    times, records, metas = zip(*entries)
    logs = list(map(_get, records, _LOG))
    if set(map(type, logs)) != _STR:
        return [to_shipped(tag, t, record, metadata) for t, record, metadata in entries]
    try:
        lines = list(map(bytes.removesuffix, map(str.encode, logs, _UTF8, _ESCAPE), _NEWLINE))
    except UnicodeEncodeError:
        return [to_shipped(tag, t, record, metadata) for t, record, metadata in entries]
    _drain(map(operator.delitem, records, _LOG))
    _drain(map(operator.setitem, records, _TAG, repeat(tag)))
    if any(metas):                      # fluent-bit >= 2.1 metadata: rare
        for record, metadata in zip(records, metas):
            if metadata:
                record["fluentbit_metadata"] = dict(metadata)
    # Shipped(t, line, record) each, without its Python __init__: the objects made in C and
    # their three slots filled through the slot descriptors, a column at a time
    batch = list(map(_new, repeat(Shipped, len(lines))))
    _drain(map(_SET_TIME, batch, times))
    _drain(map(_SET_LINE, batch, lines))
    _drain(map(_SET_META, batch, records))
    return batch


_get, _new = dict.get, object.__new__
_drain = deque(maxlen=0).extend
_STR = {str}
_UTF8, _ESCAPE, _NEWLINE = repeat("utf-8"), repeat("surrogateescape"), repeat(b"\n")
_LOG, _TAG = repeat("log"), repeat("tag")
# Shipped's slots, set as its generated __init__ sets them (a frozen slots dataclass of exactly
# these three fields, no __post_init__: checked here, so a change to it cannot go unseen)
if [f.name for f in dataclasses.fields(Shipped)] != ["time", "line", "meta"] or hasattr(Shipped, "__post_init__"):
    raise TypeError("forward._shipped fills Shipped's three slots itself: update it with Shipped")
_SET_TIME, _SET_LINE, _SET_META = Shipped.time.__set__, Shipped.line.__set__, Shipped.meta.__set__


def _shutdown(sock: socket.socket) -> None:
    """Wakes a thread blocked on the socket (plain socket call, also under TLS)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass
