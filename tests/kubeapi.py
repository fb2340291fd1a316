"""A local HTTP server that plays the parts of the Kubernetes API the kubernetes actuator uses, and
records every request (issue 13 item 5).

Objects: nodes, pods, batch Jobs and namespaced custom objects, kept as the API's JSON. Answers as
the API does: lists as ``<Kind>List``, a 404 / 409 / 403 / 415 / 429 with a ``Status`` body (429
with ``Retry-After``), each write bumps ``metadata.resourceVersion``; a strategic merge patch that
carries a stale ``metadata.resourceVersion`` and a JSON patch whose ``test`` fails are 409
conflicts (as kube-apiserver's patch handler answers). Strategic merge is applied as a merge
patch whose lists replace: true for the node fields used here (``spec.taints`` has no patch
merge key).

``FakeKubeApi.fail(method, path, status, ...)`` makes the next matching request fail once.
``kubeconfig(path)`` writes a kubeconfig that points at the server (the client's real loading).
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
REASONS = {404: "NotFound", 409: "Conflict", 403: "Forbidden", 415: "UnsupportedMediaType",
           429: "TooManyRequests", 500: "InternalError", 422: "Invalid"}


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any

    @property
    def field_manager(self) -> str | None:
        return (self.query.get("fieldManager") or [None])[0]


def status(code: int, message: str) -> dict[str, Any]:
    """The API's Status body for an error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": REASONS.get(code, "Unknown"), "code": code}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null removes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _unpointer(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 for object members (add, replace, remove, test). Raises ValueError("test") on a
    failed test and KeyError on a missing path."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [_unpointer(t) for t in op["path"].lstrip("/").split("/")]
        where = doc
        for token in parents:
            where = where[token]
        last = _unpointer(last)
        if op["op"] == "test":
            if where.get(last) != op["value"]:
                raise ValueError("test")
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and last not in where:
                raise KeyError(op["path"])
            where[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del where[last]
        else:
            raise KeyError(op["op"])
    return doc


class FakeKubeApi:
    """The server. ``nodes`` / ``pods`` / ``objects`` hold the API's JSON; ``requests`` every request."""

    def __init__(self):
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.objects: dict[tuple[str, str, str, str], dict] = {}   # (apiprefix, ns, plural, name)
        self.requests: list[Request] = []
        self.failures: list[tuple[str, str, int, str, dict, Any]] = []
        self._version = 100
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):      # quiet
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                req = Request(self.command, parts.path, parse_qs(parts.query),
                              (self.headers.get("Content-Type") or "").split(";")[0] or None,
                              json.loads(raw) if raw else None)
                with api.lock:
                    api.requests.append(req)
                    code, body, headers = api.answer(req)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- set-up ----------------------------------------------------------------------------------

    def __enter__(self) -> "FakeKubeApi":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    def add_node(self, name: str, annotations: dict | None = None, taints: list | None = None) -> dict:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "resourceVersion": self._rv(), "annotations": dict(annotations or {}),
                             "labels": {"kubernetes.io/hostname": name}},
                "spec": {"taints": list(taints)} if taints else {}}
        self.nodes[name] = node
        return node

    def add_pod(self, namespace: str, name: str, labels: dict, node: str | None = None) -> dict:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                            "resourceVersion": self._rv()},
               "spec": {"nodeName": node, "containers": [{"name": "pytorch", "image": "trainer"}]}}
        self.pods[(namespace, name)] = pod
        return pod

    def add_object(self, prefix: str, namespace: str, plural: str, name: str, spec: dict) -> dict:
        """A namespaced object under ``/apis/<prefix>`` (e.g. ``kubeflow.org/v1``, ``batch/v1``)."""
        obj = {"metadata": {"name": name, "namespace": namespace, "resourceVersion": self._rv()}, "spec": spec}
        self.objects[(prefix, namespace, plural, name)] = obj
        return obj

    def fail(self, method: str, path: str, code: int, message: str = "", headers: dict | None = None,
             match=None) -> None:
        """The next ``method`` request to ``path`` (for which ``match(request)`` holds, when given)
        answers ``code`` with a Status body (once; call again for more)."""
        self.failures.append((method, path, code, message or REASONS.get(code, "error"), headers or {}, match))

    def kubeconfig(self, path: Path) -> Path:
        """Writes a kubeconfig whose current context is this server (token auth)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "ftwatch", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "ftwatch"}}]}))
        return path

    def writes(self) -> list[Request]:
        """The requests that change something (PATCH, DELETE, POST, PUT), in order."""
        return [r for r in self.requests if r.method != "GET"]

    # -- the API ---------------------------------------------------------------------------------

    def answer(self, req: Request) -> tuple[int, Any, dict]:
        for i, (method, path, code, message, headers, match) in enumerate(self.failures):
            if method == req.method and path == req.path and (match is None or match(req)):
                del self.failures[i]
                return code, status(code, message), headers
        p = req.path.strip("/").split("/")
        if p[:3] == ["api", "v1", "nodes"]:
            return self._node(req, p[3] if len(p) > 3 else None)
        if p[:3] == ["api", "v1", "namespaces"] and len(p) >= 5 and p[4] == "pods":
            return self._pod(req, p[3], p[5] if len(p) > 5 else None)
        if p[0] == "apis" and len(p) == 7 and p[3] == "namespaces":
            return self._object(req, f"{p[1]}/{p[2]}", p[4], p[5], p[6])
        return 404, status(404, f"the server could not find the requested resource {req.path}"), {}

    def _node(self, req: Request, name: str | None) -> tuple[int, Any, dict]:
        if name is None and req.method == "GET":
            return 200, {"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": str(self._version)},
                         "items": [self.nodes[n] for n in sorted(self.nodes)]}, {}
        node = self.nodes.get(name or "")
        if node is None:
            return 404, status(404, f'nodes "{name}" not found'), {}
        if req.method == "GET":
            return 200, node, {}
        if req.method != "PATCH":
            return 405, status(405, "method not allowed"), {}
        return self._patch(req, node, f'nodes "{name}"')

    def _patch(self, req: Request, obj: dict, what: str) -> tuple[int, Any, dict]:
        if req.content_type in (STRATEGIC, MERGE):
            rv = ((req.body or {}).get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != obj["metadata"]["resourceVersion"]:
                return 409, status(409, f"Operation cannot be fulfilled on {what}: the object has been "
                                        "modified; please apply your changes to the latest version and try again"), {}
            new = merge_patch(obj, req.body)
        elif req.content_type == JSON_PATCH:
            try:
                new = json_patch(obj, req.body)
            except ValueError:
                return 409, status(409, f"the server rejected our request due to an error in our request: "
                                        f"test failed on {what}"), {}
            except KeyError as exc:
                return 422, status(422, f"jsonpatch: missing path {exc}"), {}
        else:
            return 415, status(415, f"the body of the request was in an unknown format - "
                                    f"accepted media types include: {JSON_PATCH}, {MERGE}, {STRATEGIC}"), {}
        new["metadata"]["resourceVersion"] = self._rv()
        obj.clear()
        obj.update(new)
        return 200, obj, {}

    def _pod(self, req: Request, namespace: str, name: str | None) -> tuple[int, Any, dict]:
        if name is None and req.method == "GET":
            selector = (req.query.get("labelSelector") or [""])[0]
            want = dict(s.split("=", 1) for s in selector.split(",") if "=" in s)
            items = [pod for (ns, _), pod in sorted(self.pods.items())
                     if ns == namespace and all(pod["metadata"]["labels"].get(k) == v for k, v in want.items())]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": str(self._version)},
                         "items": items}, {}
        pod = self.pods.get((namespace, name or ""))
        if pod is None:
            return 404, status(404, f'pods "{name}" not found'), {}
        if req.method == "DELETE":
            del self.pods[(namespace, name)]
            return 200, pod, {}
        return 200, pod, {}

    def _object(self, req: Request, prefix: str, namespace: str, plural: str, name: str) -> tuple[int, Any, dict]:
        key = (prefix, namespace, plural, name)
        obj = self.objects.get(key)
        if obj is None:
            return 404, status(404, f'{plural} "{name}" not found'), {}
        if req.method == "DELETE":
            del self.objects[key]
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}, {}
        if req.method == "PATCH":
            return self._patch(req, obj, f'{plural} "{name}"')
        return 200, obj, {}
