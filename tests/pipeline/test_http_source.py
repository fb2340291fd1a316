"""The out_http receiver over real loopback sockets, with fluent-bit-shaped posts (SPEC S4, Q1, Q2)."""

from __future__ import annotations

import gzip
import json
import queue
import threading
import time

import httpx
import pytest

from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.http import HttpSource, decode_records

KUBE = {"pod_name": "mnist-worker-1", "namespace_name": "team-a", "host": "gpu-node-7",
        "container_name": "pytorch", "labels": {"training.kubeflow.org/job-name": "mnist"}}
RECORDS = [
    {"date": 1795253763.735123, "log": "step 10 loss 0.5\n", "stream": "stdout", "kubernetes": KUBE},
    {"date": 1795253764.0, "log": "RuntimeError: NCCL error: unhandled system error", "stream": "stderr",
     "kubernetes": KUBE},
]


class SignalQueue(queue.Queue):
    """A queue that says when a put() has started (so a test knows a request is waiting on it)."""

    def __init__(self, maxsize=0):
        super().__init__(maxsize)
        self.putting = threading.Event()

    def put(self, item, block=True, timeout=None):
        self.putting.set()
        super().put(item, block, timeout)


@pytest.fixture
def served():
    started = []

    def make(q=None, **kwargs):
        q = q if q is not None else queue.Queue()
        src = HttpSource(q, **kwargs)
        src.start()
        started.append(src)
        return src, q, httpx.Client(base_url=f"http://127.0.0.1:{src.port}", timeout=10)

    yield make
    for src in started:
        src.stop()


def json_lines(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_format_json_array(served):
    src, q, client = served()
    r = client.post("/", content=json.dumps(RECORDS), headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    batch = q.get_nowait()
    assert all(isinstance(s, Shipped) for s in batch)
    assert [s.line for s in batch] == [b"step 10 loss 0.5", b"RuntimeError: NCCL error: unhandled system error"]
    assert batch[0].time == pytest.approx(1795253763.735123)
    assert batch[0].meta == {"stream": "stdout", "kubernetes": KUBE}
    assert src.stats.records == 2 and src.stats.batches == 1


def test_format_json_lines_gzip_and_tag(served):
    src, q, client = served(path="/ftwatch")
    body = gzip.compress(json_lines(RECORDS))
    r = client.post("/ftwatch/kube.mnist", content=body,
                    headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"})
    assert r.status_code == 200
    batch = q.get_nowait()
    assert [s.meta["tag"] for s in batch] == ["kube.mnist"] * 2
    assert batch[1].meta["stream"] == "stderr"
    # header_tag FLUENT-TAG wins over the path; two gzip members back to back are one body
    body = gzip.compress(json_lines(RECORDS[:1])) + gzip.compress(json_lines(RECORDS[1:]))
    r = client.post("/ftwatch", content=body, headers={"Content-Encoding": "gzip", "FLUENT-TAG": "kube.x"})
    assert r.status_code == 200
    assert [s.meta["tag"] for s in q.get_nowait()] == ["kube.x", "kube.x"]


def test_dates_in_every_out_http_format(served):
    _, q, client = served()
    records = [{"date": 1795253763, "log": "epoch"},
               {"date": "2026-11-21T09:36:03.500000Z", "log": "iso8601"},
               {"date": "2026-11-21 09:36:03.250000", "log": "java_sql_timestamp"},
               {"date": "garbage", "message": "receipt time"},
               {"log": {"merged": "json"}}, {"level": "info"}]
    before = time.time()
    assert client.post("/", content=json.dumps(records)).status_code == 200
    batch = q.get_nowait()
    t0 = 1795253763.0
    assert [s.time for s in batch[:3]] == [t0, t0 + 0.5, t0 + 0.25]
    assert all(s.time >= before for s in batch[3:])
    assert [s.line for s in batch[3:]] == [b"receipt time", b'{"merged": "json"}', b'{"level": "info"}']


def test_bad_bodies_get_400_and_queue_nothing(served):
    src, q, client = served()
    for body, encoding in [(b'[{"log": "a"}, {"log": ', None), (b"[1, 2]", None), (b"not json", None),
                           (b'{"log": "a"}\n{"log"', None), (b"\x1f\x8b garbage", "gzip"),
                           (b"[" * 100000, None), (b"\xff\xfe" * 100, None)]:
        headers = {"Content-Encoding": encoding} if encoding else {}
        r = client.post("/", content=body, headers=headers)
        assert r.status_code == 400, body[:20]
    assert q.empty() and src.stats.bad_body == 7
    assert client.post("/", content=b"").status_code == 200 and q.empty()       # empty is no error
    assert client.post("/", content=json.dumps(RECORDS)).status_code == 200    # connection still good


def test_invalid_utf8_inside_a_record_is_replaced(served):
    _, q, client = served()
    r = client.post("/", content=b'[{"log": "bad \xff byte"}]')
    assert r.status_code == 200
    assert q.get_nowait()[0].line == "bad \ufffd byte".encode()


def test_token(served):
    src, q, client = served(token="s3cret")
    assert client.post("/", content=json.dumps(RECORDS)).status_code == 401
    assert client.post("/", content=json.dumps(RECORDS), headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.post("/", content=json.dumps(RECORDS), headers={"Authorization": "Basic czNjcmV0"}).status_code == 401
    assert q.empty() and src.stats.unauthorized == 3
    r = client.post("/", content=json.dumps(RECORDS), headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200 and len(q.get_nowait()) == 2


def test_size_limits(served):
    src, q, client = served(max_body=1000)
    assert client.post("/", content=json.dumps([{"log": "x" * 2000}])).status_code == 413
    bomb = gzip.compress(json.dumps([{"log": "x" * 100_000}]).encode())
    assert len(bomb) < 1000
    assert client.post("/", content=bomb, headers={"Content-Encoding": "gzip"}).status_code == 413
    assert q.empty() and src.stats.too_large == 2
    assert client.post("/", content=json.dumps(RECORDS)).status_code == 200


def test_other_requests(served):
    src, q, client = served(path="/logs")
    assert client.get("/logs").status_code == 405
    assert client.post("/elsewhere", content=b"[]").status_code == 404
    assert client.post("/logsX", content=b"[]").status_code == 404
    assert client.post("/logs", content=b"[]", headers={"Content-Encoding": "zstd"}).status_code == 415
    assert q.empty()


def test_answers_only_once_the_batch_is_queued(served):
    q = SignalQueue(maxsize=1)
    q.put_nowait(["occupied"])
    src, _, client = served(q)
    q.putting.clear()
    result = {}
    t = threading.Thread(target=lambda: result.update(r=client.post("/", content=json.dumps(RECORDS))))
    t.start()
    assert q.putting.wait(10)
    assert "r" not in result                    # the queue is full: no answer yet
    assert q.get(timeout=10) == ["occupied"]
    t.join(10)
    assert result["r"].status_code == 200
    assert [s.line for s in q.get_nowait()][0] == b"step 10 loss 0.5"


def test_stop_while_waiting_answers_503(served):
    q = SignalQueue(maxsize=1)
    q.put_nowait(["occupied"])
    src, _, client = served(q)
    q.putting.clear()
    result = {}
    t = threading.Thread(target=lambda: result.update(r=client.post("/", content=json.dumps(RECORDS))))
    t.start()
    assert q.putting.wait(10)
    src.stop()
    t.join(10)
    assert result["r"].status_code == 503
    assert q.get_nowait() == ["occupied"] and q.empty()


def test_decode_records_forms():
    assert decode_records(b"") == []
    assert decode_records(b' [ {"a": 1} ] ') == [{"a": 1}]
    assert decode_records(b'{"a": 1}{"b": 2}\n\n{"c": 3}\n') == [{"a": 1}, {"b": 2}, {"c": 3}]   # json_stream too


# -- connection limits and idle timeout (issue 17) --------------------------------------------------

def until(cond, what: str) -> None:
    """Waits for an observable condition (never for time), failing after 20 s."""
    deadline = time.monotonic() + 20
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def closed_by_server(sock) -> bool:
    """Reads until the server closes (EOF or reset); True, or a socket timeout after 20 s."""
    sock.settimeout(20)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def post_on(sock, body: bytes = b'[{"log": "x"}]') -> bytes:
    """One keep-alive POST on a raw socket; returns the status line."""
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    sock.settimeout(20)
    data = b""
    while not data.endswith(b"\r\n\r\nok\n"):        # the 200's body is "ok\n"
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


def test_the_connection_over_max_connections_is_closed_while_the_others_are_served(served):
    import socket
    from ftwatch.telemetry import Metrics
    metrics = Metrics()
    src, q, _ = served(max_connections=2, count=metrics.count_connection)
    first, second = (socket.create_connection(("127.0.0.1", src.port)) for _ in range(2))
    until(lambda: src.gate.stats["open"] == 2, "two connections open")
    third = socket.create_connection(("127.0.0.1", src.port))
    assert closed_by_server(third)
    assert src.gate.stats["refused"] == 1
    assert post_on(first) == post_on(second) == b"HTTP/1.1 200 OK"
    first.close()
    until(lambda: src.gate.stats["open"] == 1, "the first connection released")
    fourth = socket.create_connection(("127.0.0.1", src.port))
    assert post_on(fourth) == b"HTTP/1.1 200 OK"
    assert q.qsize() == 3
    for s in (second, third, fourth):
        s.close()
    value = metrics.connections.labels
    assert (value("http", "accepted")._value.get(), value("http", "refused")._value.get()) == (3, 1)


def test_an_idle_connection_is_closed_after_idle_timeout(served):
    import socket
    src, _, _ = served(idle_timeout=0.2)
    silent = socket.create_connection(("127.0.0.1", src.port))
    assert closed_by_server(silent)                           # no request at all
    talked = socket.create_connection(("127.0.0.1", src.port))
    assert post_on(talked) == b"HTTP/1.1 200 OK"
    assert closed_by_server(talked)                           # idle after a keep-alive request
    stalled = socket.create_connection(("127.0.0.1", src.port))
    stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n[{")
    assert closed_by_server(stalled)                          # stalled inside the body
    until(lambda: src.gate.stats["idle_closed"] == 3, "three idle closes counted")
    until(lambda: src.gate.stats["open"] == 0, "every slot released")
    for s in (silent, talked, stalled):
        s.close()


def test_https_with_a_self_signed_cert_and_a_plain_client_refused(served, cert):
    """``tls_cert``: fluent-bit's ``tls on`` with ``tls.ca_file`` posts over HTTPS; a client that
    trusts nothing fails verification, plain HTTP gets no answer; the source serves on."""
    import ssl
    from ftwatch.pipeline.sources.tls import server_context
    src, q, _ = served(token="s3cret", tls=server_context(*cert, "source http"))
    plain = httpx.Client(base_url=f"http://127.0.0.1:{src.port}", timeout=10)
    with pytest.raises(httpx.HTTPError):
        plain.post("/", content=json.dumps(RECORDS), headers={"Authorization": "Bearer s3cret"})
    with pytest.raises(httpx.HTTPError):
        httpx.Client(base_url=f"https://localhost:{src.port}", timeout=10).post("/", content=b"[]")
    trusted = httpx.Client(base_url=f"https://localhost:{src.port}", timeout=10,
                           verify=ssl.create_default_context(cafile=str(cert[0])))
    r = trusted.post("/", content=json.dumps(RECORDS), headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200 and len(q.get_nowait()) == 2 and q.empty()


def test_a_source_whose_certificate_cannot_be_loaded_says_so():
    from ftwatch.config.watch import HttpSourceConfig
    from ftwatch.errors import SourceError
    from ftwatch.pipeline.sources import build_source
    config = HttpSourceConfig(type="http", tls_cert="/nonexistent/cert.pem", tls_key="/nonexistent/key.pem")
    with pytest.raises(SourceError, match="source http: TLS certificate /nonexistent/cert.pem"):
        build_source(config, queue.Queue(), None)


def test_with_require_ack_the_200_waits_for_the_consumers_ack(served):
    """Issue 17: a 200 once queued was lost with the queue by a kill; ``watch`` (its store on) now
    answers once the batch's effects are stored (``ShippedBatch.ack``): at least once."""
    src, q, client = served(require_ack=True)
    answers: list[int] = []
    post = threading.Thread(target=lambda: answers.append(client.post("/", content=json_lines(RECORDS)).status_code))
    post.start()
    batch = q.get(timeout=10)
    time.sleep(0.3)                       # a 200 would come now without the wait
    assert answers == [] and len(batch) == 2
    batch.ack()
    post.join(10)
    assert answers == [200]
