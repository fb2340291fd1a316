"""A small Elasticsearch stand-in: a real HTTP server on 127.0.0.1 that speaks enough of the REST
API for the official client (bulk, templates, ILM, the root endpoint; and for readers point in
time, ``_search`` with ``pit`` + ``search_after`` (sorted on ascending fields, then ``_shard_doc``),
``bool``/``term``/``terms``/``range`` filters, ``composite`` aggregations of ``terms`` sources and
``min`` / ``max`` / ``sum`` ones) and checks the wire format.

It keeps documents by (index, _id) and answers ``create`` of an existing id with 409, as
Elasticsearch does. Tests script trouble with ``fail_next``: a whole-request status (429, 503),
``"partial"`` (per-item 429 / 400 / 201), or ``"drop"`` (store the documents, then close the
connection without answering: a lost acknowledgement).

Data streams: a bulk request with ``require_data_stream=true`` may only write to an index that
is a data stream already or that a PUT ``_index_template`` (with ``data_stream``) matches;
otherwise the item is refused as Elasticsearch refuses it (404 ``index_not_found_exception``, or
400 "... is not a data stream" for a plain index made by an earlier write without the flag).
``GET _data_stream/<pattern>`` lists the streams made; ``HEAD _index_template/<name>`` answers
whether it was PUT.
"""

from __future__ import annotations

import fnmatch
import json
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

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
        self.pits: dict[str, list[tuple[int, str, str, dict[str, Any]]]] = {}   # open point in time -> snapshot
        self.pits_opened = 0
        self.searches: list[dict[str, Any]] = []     # search bodies seen
        self.product_header = product_header
        self.streams: dict[str, str] = {}    # data stream -> the template that made it
        self.plain: set[str] = set()         # indices made without a template (dynamic mapping)
        self.refuse_puts = False             # True: every PUT but _bulk answers 403
        self.before_8_13 = False             # True: bulk refuses require_data_stream (400)
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

            def do_HEAD(self):  # noqa: N802 - exists_index_template
                path = urlsplit(self.path).path
                with owner._lock:
                    owner.requests.append({"method": "HEAD", "path": self.path,
                                           "headers": {k.lower(): v for k, v in self.headers.items()}})
                    found = path in owner.puts
                self.send_response(200 if found else 404)
                self.send_header("Content-Length", "0")
                if owner.product_header:
                    self.send_header("X-Elastic-Product", "Elasticsearch")
                self.end_headers()

            def do_GET(self):  # noqa: N802 - http.server's naming
                path = urlsplit(self.path).path
                if path.startswith("/_data_stream/"):
                    pattern = path.split("/")[2]
                    with owner._lock:
                        owner.requests.append({"method": "GET", "path": self.path,
                                               "headers": {k.lower(): v for k, v in self.headers.items()}})
                        found = [{"name": n, "template": t, "generation": 1}
                                 for n, t in sorted(owner.streams.items()) if fnmatch.fnmatchcase(n, pattern)]
                    self._answer(200, {"data_streams": found})
                    return
                self._answer(200, {"name": "fake", "cluster_name": "fake", "version": {
                    "number": "8.19.0", "build_flavor": "default"}, "tagline": "You Know, for Search"})

            def do_PUT(self):  # noqa: N802 - the 8.x client sends bulk as PUT /_bulk
                if self.path.startswith("/_bulk"):
                    self._bulk()
                    return
                body = json.loads(self._body() or b"{}")
                if owner.refuse_puts:           # a user without manage_index_templates / manage_ilm
                    self._answer(403, {"error": {"type": "security_exception",
                                                 "reason": "action is unauthorized"}, "status": 403})
                    return
                with owner._lock:
                    owner.puts[self.path.split("?")[0]] = body
                    owner.requests.append({"method": "PUT", "path": self.path,
                                           "headers": {k.lower(): v for k, v in self.headers.items()}})
                self._answer(200, {"acknowledged": True})

            def do_POST(self):  # noqa: N802
                path = urlsplit(self.path).path
                if path.endswith("/_pit") or path.endswith("/_search"):
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    body = json.loads(self._body() or b"{}")
                    with owner._lock:
                        owner.requests.append({"method": "POST", "path": self.path, "headers": headers})
                        status, answer = owner._read(path, parse_qs(urlsplit(self.path).query), body)
                    self._answer(status, answer)
                    return
                self._bulk()

            def do_DELETE(self):  # noqa: N802 - closing a point in time
                body = json.loads(self._body() or b"{}")
                with owner._lock:
                    owner.requests.append({"method": "DELETE", "path": self.path})
                    found = owner.pits.pop(body.get("id"), None) is not None
                self._answer(200 if found else 404, {"succeeded": found, "num_freed": int(found)})

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
                streams_only = parse_qs(urlsplit(self.path).query).get("require_data_stream") == ["true"]
                if streams_only and owner.before_8_13:
                    self._answer(400, {"error": {"type": "illegal_argument_exception", "reason":
                                                 "request [/_bulk] contains unrecognized parameter: "
                                                 "[require_data_stream]"}, "status": 400})
                    return
                if isinstance(trouble, int):
                    self._answer(trouble, {"error": {"type": "es_rejected_execution_exception",
                                                     "reason": "scripted"}, "status": trouble})
                    return
                items = [owner._create(index, doc_id, doc, trouble, n, streams_only)
                         for n, (index, doc_id, doc) in enumerate(pairs)]
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

    def _template_for(self, index: str) -> str | None:
        """The name of a PUT index template with a data stream whose patterns match ``index``."""
        for path, body in self.puts.items():
            if path.startswith("/_index_template/") and "data_stream" in body and any(
                    fnmatch.fnmatchcase(index, pattern) for pattern in body.get("index_patterns", [])):
                return path.split("/")[2]
        return None

    def _create(self, index: str, doc_id: str, doc: dict[str, Any], trouble: Any, n: int,
                streams_only: bool = False) -> dict[str, Any]:
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
            if index not in self.streams and index not in self.plain:
                template = self._template_for(index)
                if template is not None:
                    self.streams[index] = template
                elif streams_only:
                    return {"create": {"_index": index, "_id": doc_id, "status": 404, "error": {
                        "type": "index_not_found_exception", "index": index,
                        "reason": "the index creation request requires a data stream, but no matching "
                                  "index template with data stream template was found for it"}}}
                else:
                    self.plain.add(index)
            if streams_only and index in self.plain:
                return {"create": {"_index": index, "_id": doc_id, "status": 400, "error": {
                    "type": "illegal_argument_exception",
                    "reason": f"index request targeting [{index}] specifies require_data_stream=true "
                              f"but [{index}] is not a data stream"}}}
            if (index, doc_id) in self.docs:
                return {"create": {"_index": index, "_id": doc_id, "status": 409,
                                   "error": {"type": "version_conflict_engine_exception",
                                             "reason": "document already exists"}}}
            self.docs[(index, doc_id)] = doc
        return {"create": {"_index": index, "_id": doc_id, "status": 201, "result": "created"}}

    # -- reading: point in time, search, composite aggregation ------------------------------------

    def _resolve(self, expression: str, ignore_unavailable: bool) -> list[str] | None:
        """The indices an index expression names (None: a named one is missing)."""
        have = sorted({index for index, _ in self.docs})
        out: list[str] = []
        for part in expression.split(","):
            hits = [i for i in have if fnmatch.fnmatchcase(i, part)]
            if not hits and "*" not in part and not ignore_unavailable:
                return None
            out += [h for h in hits if h not in out]
        return out

    @staticmethod
    def _field(doc: dict[str, Any], path: str) -> Any:
        value: Any = doc
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def _matches(self, doc: dict[str, Any], query: dict[str, Any]) -> bool:
        if not query or "match_all" in query:
            return True
        if "bool" in query:
            unknown = set(query["bool"]) - {"filter"}
            if unknown:
                self.problems.append(f"bool clauses not supported here: {unknown}")
            return all(self._matches(doc, q) for q in query["bool"].get("filter", []))
        (kind, spec), = query.items()
        (field, arg), = spec.items()
        value = self._field(doc, field)
        values = value if isinstance(value, list) else [value]
        if kind == "term":
            return arg in values
        if kind == "terms":
            return any(v in arg for v in values)
        if kind == "range" and field != "@timestamp":         # a numeric field (ftwatch.epoch)
            if not isinstance(value, (int, float)) or set(arg) - {"gte", "gt", "lt", "lte"}:
                self.problems.append(f"range {arg!r} on {field} = {value!r}")
                return False
            return (("gte" not in arg or value >= arg["gte"]) and ("gt" not in arg or value > arg["gt"])
                    and ("lt" not in arg or value < arg["lt"]) and ("lte" not in arg or value <= arg["lte"]))
        if kind == "range" and field == "@timestamp":
            if arg.get("format") != "epoch_millis":
                self.problems.append(f"range format {arg.get('format')!r}")
            ms = int(datetime.fromisoformat(value).timestamp() * 1000 + 0.5)
            return (("gte" not in arg or ms >= arg["gte"]) and ("gt" not in arg or ms > arg["gt"])
                    and ("lt" not in arg or ms < arg["lt"]) and ("lte" not in arg or ms <= arg["lte"]))
        self.problems.append(f"query not supported here: {query}")
        return False

    def _shard_order(self) -> list[tuple[int, str, str, dict[str, Any]]]:
        """Every document as (its ``_shard_doc`` value, index, _id, source): ordered by _id, not by
        when it was written (a real cluster's order across shards says nothing about time)."""
        keys = sorted(self.docs, key=lambda k: (k[1], k[0]))
        return [(n, k[0], k[1], self.docs[k]) for n, k in enumerate(keys)]

    def _read(self, path: str, params: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, Any]:
        """Answer ``POST <index>/_pit`` and ``POST [<index>/]_search`` (under the lock)."""
        parts = [p for p in path.split("/") if p]
        ignore = params.get("ignore_unavailable", ["false"])[0] == "true"
        if parts[-1] == "_pit":
            if "keep_alive" not in params:
                self.problems.append("point in time without keep_alive")
            indices = self._resolve(parts[0], ignore)
            if indices is None:
                return 404, {"error": {"type": "index_not_found_exception", "reason": parts[0]}, "status": 404}
            self.pits_opened += 1
            pit_id = f"pit-{self.pits_opened}"
            self.pits[pit_id] = [h for h in self._shard_order() if h[1] in indices]
            return 200, {"id": pit_id}
        self.searches.append(body)
        if "pit" in body:
            if len(parts) > 1:
                self.problems.append("a search with a point in time names an index")
            snapshot = self.pits.get(body["pit"]["id"])
            if snapshot is None:
                return 404, {"error": {"type": "search_context_missing_exception"}, "status": 404}
            if not body["pit"].get("keep_alive"):
                self.problems.append("pit search without keep_alive")
        else:
            indices = self._resolve(parts[0], ignore) if len(parts) > 1 else sorted({i for i, _ in self.docs})
            if indices is None:
                return 404, {"error": {"type": "index_not_found_exception", "reason": parts[0]}, "status": 404}
            snapshot = [h for h in self._shard_order() if h[1] in indices]
        hits = [h for h in snapshot if self._matches(h[3], body.get("query") or {})]
        answer: dict[str, Any] = {"took": 1, "timed_out": False, "_shards": {"total": 1, "successful": 1,
                                                                            "skipped": 0, "failed": 0}}
        if "pit" in body:
            answer["pit_id"] = body["pit"]["id"]
        if body.get("aggs"):
            answer["aggregations"] = {name: self._aggregation(spec, [h[3] for h in hits])
                                      for name, spec in body["aggs"].items()}
        size = body.get("size", 10)
        if size:
            sort = body.get("sort") or []
            if not sort or sort[-1] != "_shard_doc":
                self.problems.append(f"sort {sort!r} (a full read's sort ends on _shard_doc)")
            keyed = sorted(([self._sort_value(spec, h) for spec in sort], h) for h in hits)
            after = body.get("search_after")
            page = [(key, h) for key, h in keyed if after is None or key > after][:size]
            includes = (body.get("_source") or {}).get("includes") if isinstance(body.get("_source"), dict) else None
            answer["hits"] = {"hits": [{"_index": i, "_id": d_id, "_score": None, "sort": key,
                                        "_source": self._only(doc, includes) if includes else doc}
                                       for key, (n, i, d_id, doc) in page]}
        else:
            answer["hits"] = {"hits": []}
        if body.get("track_total_hits") is not False:
            answer["hits"]["total"] = {"value": len(hits), "relation": "eq"}
        return 200, answer

    def _sort_value(self, spec: Any, hit: tuple) -> Any:
        """A hit's value of one ``sort`` key, as Elasticsearch returns it: ``_shard_doc`` its
        place, ``@timestamp`` epoch milliseconds, a missing value ``missing``'s (``_first`` /
        ``_last``: the long's least / greatest, the default ``_last``)."""
        if spec == "_shard_doc":
            return hit[0]
        (field, how), = spec.items()
        how = {"order": how} if isinstance(how, str) else how
        if how.get("order", "asc") != "asc" or set(how) - {"order", "missing"}:
            self.problems.append(f"sort {spec!r} not supported here")
        value = self._field(hit[3], field)
        if field == "@timestamp" and value is not None:
            return int(datetime.fromisoformat(value).timestamp() * 1000 + 0.5)
        if value is None:
            missing = how.get("missing", "_last")
            return -2 ** 63 if missing == "_first" else 2 ** 63 - 1 if missing == "_last" else missing
        return value

    @staticmethod
    def _only(doc: dict[str, Any], includes: list[str]) -> dict[str, Any]:
        """``_source`` filtering: the fields named (dotted paths, whole objects included)."""
        out: dict[str, Any] = {}
        for path in includes:
            keys = path.split(".")
            value: Any = doc
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if value is None:
                continue
            node = out
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = value
        return out

    _METRICS = {"min": min, "max": max, "sum": sum}

    def _aggregation(self, spec: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, Any]:
        """A ``composite`` aggregation (``terms`` sources, paged with ``after``, metric
        sub-aggregations per bucket) or a ``min`` / ``max`` / ``sum`` one over ``docs``."""
        kinds = set(spec) - {"aggs"}
        if len(kinds) != 1 or not kinds <= {"composite", *self._METRICS}:
            self.problems.append(f"aggregation not supported here: {spec}")
            return {}
        (kind,) = kinds
        if kind != "composite":
            values = [v for d in docs if isinstance(v := self._field(d, spec[kind]["field"]), (int, float))]
            value = self._METRICS[kind](values) if values else (0 if kind == "sum" else None)
            return {"value": None if value is None else float(value)}   # as Elasticsearch: doubles
        comp = spec["composite"]
        names, fields = [], []
        for source in comp["sources"]:
            (name, terms), = source.items()
            if set(terms) != {"terms"}:
                self.problems.append(f"composite source not supported here: {source}")
            names.append(name)
            fields.append(terms["terms"]["field"])
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for doc in docs:
            key = tuple(self._field(doc, f) for f in fields)
            if None not in key:                         # no missing_bucket: such documents are left out
                groups.setdefault(key, []).append(doc)
        after = comp.get("after")
        start = tuple(after[n] for n in names) if after is not None else None
        keys = [k for k in sorted(groups) if start is None or k > start][:comp.get("size", 10)]
        subs = spec.get("aggs") or {}
        out: dict[str, Any] = {"buckets": [
            {"key": dict(zip(names, k)), "doc_count": len(groups[k]),
             **{n: self._aggregation(s, groups[k]) for n, s in subs.items()}} for k in keys]}
        if keys:
            out["after_key"] = dict(zip(names, keys[-1]))
        return out

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
