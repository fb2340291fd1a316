"""The SDK over HTTP for jobs ``ftwatch watch`` watches (issue 13 item 3).

A training process of a watched job has no Unix socket to ``ftwatch run``; with
``FTWATCH_MONITOR_URL`` set, ``ftwatch.sdk.Monitor`` POSTs each call to ``<url>/v1/control``:

    POST /v1/control
    Authorization: Bearer <the job's token>
    {"op": "hang_detect_push", "job": "team-a/llm", "instance": "llm-worker-3", "rank": 4, ...}

answered ``200 {"ok": true, ...}`` / ``200 {"ok": false, "error": ...}`` as on the socket
(``ftwatch.pipeline.sources.control``), ``401`` for a token that is not the job's, ``400`` for a
body that is no JSON object with a string ``op`` and ``job``. The token of a job is
``HMAC-SHA256(secret, job)`` (hex, :func:`job_token`): one job's token acts on that job only; the
request's ``instance`` / ``rank`` name the caller inside it. Requests wait on a queue for the
watcher's thread (``drain``), at most ``answer_timeout`` seconds; ``report_step`` is answered on
receipt.

``set_retryable_errors`` and ``reset_config`` act on the caller's job only: its retryable errors
hit that job's lines (``control.for_job``) and leave the engine when ``watch`` forgets the job,
its interval is that job's hang tracker's. With a
TLS context (``watch.monitor.tls_cert``, :mod:`ftwatch.pipeline.sources.tls`) the endpoint is
HTTPS; the SDK verifies it with the CA bundle in ``FTWATCH_MONITOR_CA``. A connection idle for
``IDLE_TIMEOUT`` seconds (or stuck in its handshake) is closed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from ftwatch.pipeline.sources.control import ANSWER_TIMEOUT, FIRE_AND_FORGET, MAX_LINE, Request, drain_requests
from ftwatch.pipeline.sources.tls import wrap_listener

PATH = "/v1/control"
IDLE_TIMEOUT = 30.0           # seconds a connection may send nothing


def job_token(secret: bytes, job: str) -> str:
    """The token of ``job`` (``namespace/name`` as ``watch`` names it) under ``secret``: hex
    HMAC-SHA256."""
    return hmac.new(secret, job.encode(), hashlib.sha256).hexdigest()


class _QuietServer(ThreadingHTTPServer):
    """No traceback on stderr for a connection that fails (a client that does not speak TLS or
    distrusts the certificate, a reset, an idle timeout): the client sees its own error."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class MonitorServer:
    """The HTTP endpoint. ``start`` it, ``drain`` it from the watcher's loop, ``stop`` it.

    Args:
        host, port: where to listen (port 0: any free one, then :attr:`port`).
        secret: the secret tokens are derived from (:func:`job_token`).
        answer_timeout: seconds a request may wait for :meth:`drain`.
        tls: a server-side TLS context: every connection is HTTPS.
    """

    def __init__(self, host: str, port: int, secret: bytes, answer_timeout: float = ANSWER_TIMEOUT,
                 tls: ssl.SSLContext | None = None):
        if not secret:
            raise ValueError("the monitor endpoint needs a secret")
        self.secret = secret
        self.answer_timeout = answer_timeout
        self._queue: queue.SimpleQueue[Request] = queue.SimpleQueue()
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = IDLE_TIMEOUT

            def log_message(self, *args):
                pass

            def do_POST(self):
                code, answer = server._answer(self)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._http = _QuietServer((host, port), Handler)
        wrap_listener(self._http, tls)
        self.tls = tls is not None
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, name="ftwatch-monitor", daemon=True)

    def start(self) -> "MonitorServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def drain(self, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
        """Answer every queued request with ``handle(message)`` (``message`` has ``job``) on the
        caller's thread; an exception in it becomes ``ok: false``. Returns how many."""
        return drain_requests(self._queue, handle)

    def _answer(self, http: BaseHTTPRequestHandler) -> tuple[int, dict[str, Any]]:
        if http.path.split("?", 1)[0] != PATH:
            return 404, {"ok": False, "error": f"not found; POST {PATH}"}
        length = int(http.headers.get("Content-Length") or 0)
        if length > MAX_LINE:
            return 413, {"ok": False, "error": "request too long"}
        try:
            message = json.loads(http.rfile.read(length) or b"null")
        except ValueError as exc:
            return 400, {"ok": False, "error": f"not JSON: {exc}"}
        if not isinstance(message, dict) or not isinstance(message.get("op"), str) \
                or not isinstance(message.get("job"), str) or not message["job"]:
            return 400, {"ok": False, "error": "a request is a JSON object with a string op and job"}
        message.pop("token", None)
        given = (http.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), job_token(self.secret, message["job"]).encode()):
            return 401, {"ok": False, "error": f"bad token for job {message['job']}"}
        if message["op"] == "report_step" and type(message.get("step")) is not int:
            return 200, {"ok": False, "error": "report_step: step must be an integer"}
        req = Request(message)
        self._queue.put(req)
        if message["op"] in FIRE_AND_FORGET:
            return 200, {"ok": True, "queued": True}
        if req.done.wait(self.answer_timeout):
            return 200, req.answer or {"ok": False, "error": "no answer"}
        with req.lock:
            if req.done.is_set():
                return 200, req.answer or {"ok": False, "error": "no answer"}
            req.dropped = True
        return 200, {"ok": False, "error": f"ftwatch did not take the request within {self.answer_timeout:g} s"}
