"""A small Elasticsearch stand-in: a real HTTP server on 127.0.0.1 that speaks enough of the REST
API for the official client (bulk, templates, ILM, the root endpoint) and checks the wire format.

It keeps documents by (index, _id) and answers ``create`` of an existing id with 409, as
Elasticsearch does. Tests script trouble with ``fail_next``: a whole-request status (429, 503),
``"partial"`` (per-item 429 / 400 / 201), or ``"drop"`` (store the documents, then close the
connection without answering: a lost acknowledgement).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

COMPAT_JSON = "application/vnd.elasticsearch+json; compatible-with=8"
COMPAT_NDJSON = "application/vnd.elasticsearch+x-ndjson; compatible-with=8"


class FakeElasticsearch:
    """A real local HTTP server imitating one Elasticsearch 8 node (see the module doc)."""

    def __init__(self, port: int = 0, product_header: bool = True):
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.problems: list[str] = []       # wire-format violations seen
        self.fail_next: list[Any] = []
        self.puts: dict[str, Any] = {}
        self.product_header = product_header
        self._lock = threading.Lock()
        self._closed = False
        self._conns: list[Any] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with owner._lock:
                    owner._conns.append(self.connection)

            def _answer(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", COMPAT_JSON)
                self.send_header("Content-Length", str(len(raw)))
                if owner.product_header:
                    self.send_header("X-Elastic-Product", "Elasticsearch")
                self.end_headers()
                self.wfile.write(raw)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def do_GET(self):  # noqa: N802 - http.server's naming
                self._answer(200, {"name": "fake", "cluster_name": "fake", "version": {
                    "number": "8.19.0", "build_flavor": "default"}, "tagline": "You Know, for Search"})

            def do_PUT(self):  # noqa: N802 - the 8.x client sends bulk as PUT /_bulk
                if self.path.startswith("/_bulk"):
                    self._bulk()
                    return
                body = json.loads(self._body() or b"{}")
                with owner._lock:
                    owner.puts[self.path.split("?")[0]] = body
                    owner.requests.append({"method": "PUT", "path": self.path,
                                           "headers": {k.lower(): v for k, v in self.headers.items()}})
                self._answer(200, {"acknowledged": True})

            def do_POST(self):  # noqa: N802
                self._bulk()

            def _bulk(self) -> None:
                raw = self._body()
                headers = {k.lower(): v for k, v in self.headers.items()}
                with owner._lock:
                    owner.requests.append({"method": self.command, "path": self.path, "headers": headers,
                                           "raw": raw})
                    trouble = owner.fail_next.pop(0) if owner.fail_next else None
                if not self.path.startswith("/_bulk"):
                    self._answer(404, {"error": "no such endpoint"})
                    return
                owner._check_headers(headers)
                pairs = owner._parse_bulk(raw)
                if isinstance(trouble, int):
                    self._answer(trouble, {"error": {"type": "es_rejected_execution_exception",
                                                     "reason": "scripted"}, "status": trouble})
                    return
                items = [owner._create(index, doc_id, doc, trouble, n) for n, (index, doc_id, doc) in enumerate(pairs)]
                if trouble == "drop":               # stored, but the answer never arrives
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self._answer(200, {"took": 1, "errors": any(i["create"]["status"] >= 300 for i in items),
                                   "items": items})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    # -- the checks -------------------------------------------------------------------------------

    def _check_headers(self, headers: dict[str, str]) -> None:
        if headers.get("content-type") != COMPAT_NDJSON:
            self.problems.append(f"bulk Content-Type {headers.get('content-type')!r}")
        if headers.get("accept") != COMPAT_JSON:
            self.problems.append(f"bulk Accept {headers.get('accept')!r}")

    def _parse_bulk(self, raw: bytes) -> list[tuple[str, str, dict[str, Any]]]:
        text = raw.decode()
        if not text.endswith("\n"):
            self.problems.append("bulk body does not end with a newline")
        lines = text.splitlines()
        if len(lines) % 2:
            self.problems.append(f"bulk body has {len(lines)} lines, not action/document pairs")
        pairs = []
        for action_line, doc_line in zip(lines[::2], lines[1::2]):
            action, doc = json.loads(action_line), json.loads(doc_line)
            if list(action) != ["create"]:
                self.problems.append(f"bulk op {list(action)} is not create")
                continue
            meta = action["create"]
            if not meta.get("_index") or not meta.get("_id"):
                self.problems.append(f"bulk action without _index/_id: {meta}")
            if "@timestamp" not in doc:
                self.problems.append("document without @timestamp")
            pairs.append((meta.get("_index"), meta.get("_id"), doc))
        return pairs

    def _create(self, index: str, doc_id: str, doc: dict[str, Any], trouble: Any, n: int) -> dict[str, Any]:
        if trouble == "items429":
            return {"create": {"_index": index, "_id": doc_id, "status": 429,
                               "error": {"type": "es_rejected_execution_exception", "reason": "busy"}}}
        if trouble == "partial":
            if n % 3 == 1:
                return {"create": {"_index": index, "_id": doc_id, "status": 429,
                                   "error": {"type": "es_rejected_execution_exception", "reason": "busy"}}}
            if n == 2:
                return {"create": {"_index": index, "_id": doc_id, "status": 400,
                                   "error": {"type": "document_parsing_exception", "reason": "bad field"}}}
        with self._lock:
            if (index, doc_id) in self.docs:
                return {"create": {"_index": index, "_id": doc_id, "status": 409,
                                   "error": {"type": "version_conflict_engine_exception",
                                             "reason": "document already exists"}}}
            self.docs[(index, doc_id)] = doc
        return {"create": {"_index": index, "_id": doc_id, "status": 201, "result": "created"}}

    # -- control ----------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bulk_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].startswith("/_bulk")]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.shutdown()
        for conn in self._conns:             # keep-alive connections go down with the server
            try:
                conn.shutdown(2)
            except OSError:
                pass
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def es_server():
    """Makes FakeElasticsearch servers (``es_server(port=..., product_header=...)``); closes them all."""
    made: list[FakeElasticsearch] = []

    def make(port: int = 0, product_header: bool = True) -> FakeElasticsearch:
        made.append(FakeElasticsearch(port, product_header))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def fake_es():
    server = FakeElasticsearch()
    yield server
    server.close()
