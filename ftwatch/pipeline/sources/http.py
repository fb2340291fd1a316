"""An HTTP receiver for fluent-bit's ``out_http`` output (SPEC S4).

fluent-bit posts batches of records (``out_http`` docs): ``format json`` (the default) sends a
JSON array of objects, ``json_lines`` one object per line, ``json_stream`` objects back to
back; all three are accepted here. Each object holds the record's fields plus its time under
``json_date_key`` (default ``date``) as ``json_date_format`` wrote it: ``double`` (epoch
float, the default), ``epoch`` (int), ``iso8601`` or ``java_sql_timestamp`` (no zone: UTC).
``compress gzip`` sends ``Content-Encoding: gzip``; other encodings get 415.

The tag: out_http sends it only when ``header_tag`` names a header (the docs' example is
``header_tag FLUENT-TAG``): that header is read (name configurable); else the request path
below ``path`` stands for the tag (``uri /ftwatch/kube.worker`` with ``path="/ftwatch"`` gives
``kube.worker``); else there is none.

Each record becomes one ``Shipped``: ``log`` (else ``message``) is the line (one trailing
newline removed; a non-string value is JSON-encoded), the date is the time (receipt time
when absent or unreadable), the other fields are ``meta`` with ``tag`` added. A record with
neither field is shipped whole, JSON-encoded, as the line. A request's records go on the
queue as one batch, and the answer is 200 only once they are on it: a full queue holds the
request (fluent-bit then retries, which is the backpressure), and a stopping source answers 503.
With ``require_ack`` (``ftwatch watch`` with its SQLite store) the 200 waits further, for the
consumer's acknowledgement of the batch (``ShippedBatch.ack``: its effects are stored), so a kill
loses no answered batch. At least once, not exactly once: ``out_http`` sends no id for a chunk
(no idempotency header to key on), so a batch whose 200 a kill lost is judged again when
fluent-bit retries it (the Forward source skips such a chunk by its id).

Answers: 200 queued; 400 malformed body (nothing queued, counted); 401 missing or wrong
``Authorization: Bearer <token>`` when a token is set (fluent-bit: ``header Authorization
Bearer <token>``); 404 another path; 405 not POST; 411 no Content-Length; 413 body, or its
gzip expansion, over ``max_body``; 415 unknown encoding; 503 stopping.

Connections (issue 17, :mod:`ftwatch.pipeline.sources.connlimit`): at most ``max_connections``
at once (one more is closed as soon as it is accepted, unanswered, counted ``refused``); a
connection that sends nothing for ``idle_timeout`` seconds, between requests or inside one, is
closed (``idle_closed``).

TLS (``tls_cert`` / ``tls_key``, :mod:`ftwatch.pipeline.sources.tls`): every connection is
HTTPS (fluent-bit: ``tls on``, ``tls.ca_file``); a client that does not speak TLS is closed.

Binds to 127.0.0.1 unless told otherwise (SPEC Q2).
"""

from __future__ import annotations

import hmac
import json
import logging
import queue
import ssl
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ftwatch.errors import SourceError
from ftwatch.parsers.envelopes import parse_rfc3339
from ftwatch.pipeline.sources.base import Shipped, ShippedBatch, put_until_stopped, record_line
from ftwatch.pipeline.sources.connlimit import ConnectionGate
from ftwatch.pipeline.sources.tls import wrap_listener

__all__ = ["HttpSource", "HttpStats", "decode_records"]

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024
IDLE_TIMEOUT = 120.0  # seconds a connection may sit idle or stall mid-request (the config's default)
MAX_CONNECTIONS = 512  # connections at once (the config's default; ftwatch.config.watch.ListenerLimits)
DRAIN_MAX = 64 * 1024 * 1024   # a rejected request's body up to this is read and dropped (keep-alive)


class BadBody(ValueError):
    """The body is not a JSON array of objects nor a stream of JSON objects."""


@dataclass
class HttpStats:
    """Counters (each a number of requests, except ``records``)."""

    requests: int = 0
    batches: int = 0
    records: int = 0
    bad_body: int = 0
    too_large: int = 0
    unauthorized: int = 0
    rejected: int = 0      # 404, 405, 411, 415, 503


def decode_records(body: bytes) -> list[dict[str, Any]]:
    """Decodes an out_http body: a JSON array of objects, or JSON objects one after another.

    Args:
        body: the (decompressed) request body; invalid UTF-8 is replaced.

    Returns:
        The records (an empty body gives none).

    Raises:
        BadBody: for anything else (bad JSON, an element that is not an object).
    """
    text = body.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    pos, end = 0, len(text)
    out: list[dict[str, Any]] = []
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos >= end:
            return out
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            raise BadBody(f"bad JSON at byte {pos}: {exc}") from None
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, dict):
                raise BadBody(f"a record is a {type(item).__name__}, not an object")
        out.extend(items)


def _gunzip(data: bytes, limit: int) -> bytes | None:
    """Decompresses one or more gzip members; None when the result would pass ``limit`` bytes.

    Raises:
        zlib.error: for data that is not gzip.
    """
    out = bytearray()
    while data:
        d = zlib.decompressobj(wbits=31)
        out += d.decompress(data, limit + 1 - len(out))
        if len(out) > limit or d.unconsumed_tail:
            return None
        if not d.eof:
            raise zlib.error("truncated gzip stream")
        data = d.unused_data
    return bytes(out)


class HttpSource:
    """A threaded HTTP server that turns fluent-bit ``out_http`` posts into Shipped batches.

    Args:
        out: the bounded queue that gets one ``list[Shipped]`` per request.
        host: the address to bind (localhost unless configured).
        port: the port; 0 picks a free one (read ``.port`` after ``start``).
        path: the URI path prefix accepted; what follows it is the tag (see the module doc).
        token: when set, requests need ``Authorization: Bearer <token>``.
        max_body: the largest body accepted, in bytes, after gzip expansion too (16 MiB).
        name: the source's name.
        tag_header: the header ``header_tag`` sends the tag in.
        date_key: out_http's ``json_date_key``.
        max_connections: connections held at once; one more is closed at once (module doc).
        idle_timeout: seconds a connection may send nothing before it is closed.
        count: called with ``(name, event)`` per connection event (``ConnectionGate``), or None.
        tls: a server-side TLS context (``tls.server_context``): every connection is HTTPS.
        require_ack: answer 200 only once the consumer acknowledged the batch (module doc).

    Attributes:
        port: the bound port (after ``start``).
        stats: the counters.
        gate: the connection limits and their counts (``gate.stats``).
    """

    def __init__(self, out: queue.Queue, host: str = "127.0.0.1", port: int = 0, path: str = "/",
                 token: str | None = None, max_body: int = MAX_BODY, name: str = "http", *,
                 tag_header: str = "FLUENT-TAG", date_key: str = "date",
                 max_connections: int = MAX_CONNECTIONS, idle_timeout: float = IDLE_TIMEOUT,
                 count: Any = None, tls: ssl.SSLContext | None = None, require_ack: bool = False):
        self.out = out
        self.require_ack = require_ack
        self.tls = tls
        self.host = host
        self.port = port
        self.path = "/" + path.strip("/")
        self.token = token
        self.max_body = max_body
        self.name = name
        self.tag_header = tag_header
        self.date_key = date_key
        self.stats = HttpStats()
        self.gate = ConnectionGate(name, max_connections, idle_timeout, count)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Binds and starts serving in a daemon thread; returns at once.

        Raises:
            SourceError: when the address cannot be bound.
        """
        try:
            server = _GatedServer((self.host, self.port), _handler_for(self), self.gate)
        except OSError as exc:
            raise SourceError(f"{self.name}: cannot listen on {self.host}:{self.port}: {exc}") from exc
        wrap_listener(server, self.tls)
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"ftwatch-{self.name}", daemon=True)
        self._thread.start()
        log.info("%s: listening on %s://%s:%d%s", self.name, "https" if self.tls else "http", self.host, self.port,
                 self.path)

    def stop(self) -> None:
        """Stops serving (requests waiting on a full queue get 503) and joins; idempotent."""
        self._stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- called from the handler threads --------------------------------------------------------

    def _handled(self, batch: ShippedBatch) -> bool:
        """Wait for the consumer's ack of ``batch``; False when the source stops first."""
        while not batch.wait(0.25):
            if self._stopping.is_set():
                return False
        return True

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def _tag(self, request_path: str, headers) -> str | None:
        tag = headers.get(self.tag_header) if self.tag_header else None
        if tag:
            return tag
        rest = request_path[len(self.path):].strip("/")
        return rest or None

    def _accepts_path(self, request_path: str) -> bool:
        return (self.path == "/" or request_path == self.path
                or request_path.startswith(self.path + "/"))

    def _authorized(self, headers) -> bool:
        if self.token is None:
            return True
        got = headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.token.encode())

    def to_shipped(self, record: dict[str, Any], tag: str | None, received: float) -> Shipped:
        """One out_http record as a Shipped (rules in the module doc)."""
        meta = dict(record)
        t = _time_of(meta.pop(self.date_key, None), received)
        text = meta.pop("log", None)
        if text is None:
            text = meta.pop("message", None)
        line = record_line(record, text, "surrogatepass")
        if tag is not None:
            meta["tag"] = tag
        return Shipped(t, line, meta)


def _time_of(value: Any, received: float) -> float:
    """out_http's date field as epoch seconds: a number, or an ISO/``java_sql_timestamp`` string."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        t = parse_rfc3339(value.strip())
        if t is not None:
            return t
    return received


class _GatedServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that serves at most ``gate.max_connections`` connections at once."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], gate: ConnectionGate):
        self.gate = gate
        super().__init__(address, handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self.gate.admit():
            return True
        log.warning("%s: refused a connection from %s: %d connections open already",
                    self.gate.name, client_address, self.gate.max_connections)
        return False                  # socketserver closes it unanswered

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:         # no thread started: its slot is free again
            self.gate.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.gate.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a failed TLS handshake (a client that does not speak TLS, or distrusts the cert) or a
        # reset connection: a line in the log, not a traceback on stderr
        log.info("%s: connection from %s failed: %s", self.gate.name, client_address, sys.exc_info()[1])


def _handler_for(source: HttpSource) -> type[BaseHTTPRequestHandler]:
    """A request-handler class bound to ``source``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"     # keep-alive, as fluent-bit's upstream connections expect
        timeout = source.gate.idle_timeout
        server_version = "ftwatch"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            log.debug("%s: %s " + format, source.name, self.address_string(), *args)

        def log_error(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
            # handle_one_request calls this from its ``except TimeoutError`` (then closes the
            # connection): the wait for a request line timed out, i.e. the connection was idle.
            if isinstance(sys.exc_info()[1], TimeoutError):
                self._idle()
                return
            self.log_message(format, *args)

        def _idle(self) -> None:
            source.gate.idle_closed()
            log.info("%s: closing the connection from %s: idle for %gs", source.name,
                     self.address_string(), source.gate.idle_timeout)

        def _answer(self, code: int, text: str, close: bool = False) -> None:
            body = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _reject(self, code: int, text: str, counter: str = "rejected", unread: bool = False,
                    close: bool = False) -> None:
            """Answers an error; ``unread``: the body is still on the wire (dropped, or the
            connection closed when it is too long to drop)."""
            source._count(counter)
            if unread:
                length = self.headers.get("Content-Length", "").strip()
                if length.isdigit() and int(length) <= DRAIN_MAX:
                    remaining = int(length)
                    while remaining > 0:
                        chunk = self.rfile.read(min(remaining, 1 << 20))
                        if not chunk:
                            break
                        remaining -= len(chunk)
                    close = remaining > 0
                else:
                    close = True
            log.warning("%s: %d %s (from %s)", source.name, code, text, self.address_string())
            self._answer(code, text, close)

        def do_GET(self) -> None:  # noqa: N802 - stdlib's name
            source._count("requests")
            self._reject(405, "POST log records here", unread=True)

        do_PUT = do_DELETE = do_GET

        def do_POST(self) -> None:  # noqa: N802 - stdlib's name
            source._count("requests")
            received = time.time()
            request_path = self.path.partition("?")[0]
            if not source._accepts_path(request_path):
                self._reject(404, f"no such path; post to {source.path}", unread=True)
                return
            if not source._authorized(self.headers):
                self._reject(401, "missing or wrong bearer token", "unauthorized", unread=True)
                return
            length_text = self.headers.get("Content-Length")
            if length_text is None or not length_text.strip().isdigit():
                self._reject(411, "Content-Length required", unread=True)
                return
            length = int(length_text)
            if length > source.max_body:
                self._reject(413, f"body over {source.max_body} bytes", "too_large", unread=True)
                return
            try:
                body = self.rfile.read(length)
            except OSError as exc:        # the client stalled past idle_timeout or went away
                if isinstance(exc, TimeoutError):
                    self._idle()
                body = b""
            if len(body) < length:
                self.close_connection = True
                return
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            if encoding == "gzip":
                try:
                    expanded = _gunzip(body, source.max_body)
                except zlib.error as exc:
                    self._reject(400, f"bad gzip body: {exc}", "bad_body")
                    return
                if expanded is None:
                    self._reject(413, f"body over {source.max_body} bytes after gzip", "too_large")
                    return
                body = expanded
            elif encoding != "identity":
                self._reject(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
                return
            try:
                records = decode_records(body)
            except BadBody as exc:
                self._reject(400, str(exc), "bad_body")
                return
            tag = source._tag(request_path, self.headers)
            batch = [source.to_shipped(r, tag, received) for r in records]
            if source.require_ack:
                batch = ShippedBatch(batch)
            if batch and not (put_until_stopped(source.out, batch, source._stopping)
                              and (not source.require_ack or source._handled(batch))):
                self._reject(503, "stopping", close=True)
                return
            source._count("batches", 1 if batch else 0)
            source._count("records", len(batch))
            self._answer(200, "ok")

    return Handler
