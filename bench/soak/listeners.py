"""Soak part 1: the Forward and HTTP listeners of a real ``ftwatch watch`` under fuzzing.

Valid clients send a fixed count of lines: the real fluent-logger client (Forward, message mode,
one connection per client), a client shaped like fluent-bit's ``out_forward`` with
``Require_ack_response`` (PackedForward chunks of 500 lines, each with fluent-bit's ``chunk`` id
and waiting for its ack, a chunk sent again on a new connection when the ack does not come: the
path that ``watch`` acks only once a chunk is stored, issue 17), and an HTTP client posting
``json_lines`` batches. At the same time
fuzzer threads open their own connections and send truncated Forward frames, random bytes,
10 MB records and bad UTF-8 (Forward and HTTP). Valid lines carry their own job label
(``soak-fwd``, ``soak-http``), fuzz records another (``soak-fuzz``); what ``watch`` saw is its
/metrics ``ftwatch_lines_total{job_id=...}``, read once the count stops growing.

Figures: crashes (``watch`` exited during the run), Forward and HTTP lines lost and duplicated
(seen minus sent). Scale 1: 200,000 Forward + 100,000 HTTP lines, about a minute on two cores.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import socket
import threading
import time
from pathlib import Path

import msgpack
from fluent import sender

from bench.soak.common import Figure, Watch, free_port, say, scale, wait_for, zero
from ftwatch.pipeline.sources.forward_messages import event_time, pack_request

JOB_LABEL = "training.kubeflow.org/job-name"
TEN_MB = 10 * 1024 * 1024


def record(job: str, rank: int, log: str | bytes) -> dict:
    """A fluent-bit kubernetes-filtered record of ``job``'s rank ``rank``."""
    return {"log": log, "stream": "stderr",
            "kubernetes": {"pod_name": f"{job}-worker-{rank}", "namespace_name": "soak", "host": "node-0",
                           "container_name": "pytorch", "labels": {JOB_LABEL: job}}}


def watch_config(forward: int, http: int) -> dict:
    """A watch on a Forward and an HTTP listener, built-in rules, nothing acted on."""
    return {"watch": {"sources": [{"type": "forward", "name": "fwd", "port": forward},
                                  {"type": "http", "name": "http", "port": http}],
                      "identity": {"job_label": JOB_LABEL},
                      "actuator": {"type": "exec", "command": ["true"], "timeout": 10}}}


# ------------------------------------------------------------------------- valid clients

def forward_client(port: int, job: str, rank: int, count: int, failed: list[int]) -> None:
    """``count`` lines through fluent-logger; emits that fail (after its retries) are counted."""
    s = sender.FluentSender("kube", host="127.0.0.1", port=port, nanosecond_precision=True, timeout=30)
    bad = 0
    for i in range(count):
        if not s.emit("var.log.containers", record(job, rank, f"soak valid rank {rank} line {i:08d}")):
            bad += 1
    s.close()
    if s.pendings:          # what close could not flush is lost on the client side
        bad += 1
    failed.append(bad)


def acked_forward_client(port: int, job: str, rank: int, count: int, failed: list[int], batch: int = 500) -> None:
    """``count`` lines in PackedForward chunks of ``batch``, fluent-bit's way with
    ``Require_ack_response``: the id is the first 16 bytes of the SHA-512 of the chunk's data in
    hex; a chunk whose ack does not come is sent again, on a new connection."""
    bad, sock = 0, None
    for start in range(0, count, batch):
        now = time.time()
        entries = [(event_time(now), record(job, rank, f"soak valid rank {rank} line {i:08d}"), None)
                   for i in range(start, min(start + batch, count))]
        data = pack_request("kube", entries, "packed_forward")
        frame = pack_request("kube", entries, "packed_forward", chunk=hashlib.sha512(data).digest()[:16].hex())
        for attempt in range(5):
            try:
                sock = sock or socket.create_connection(("127.0.0.1", port), timeout=60)
                sock.sendall(frame)
                unpacker = msgpack.Unpacker(raw=False)
                while True:
                    reply = sock.recv(4096)
                    if not reply:
                        raise ConnectionError("closed before the ack")
                    unpacker.feed(reply)
                    if any(isinstance(obj, dict) and "ack" in obj for obj in unpacker):
                        break
                break
            except OSError:
                if sock is not None:
                    sock.close()
                sock = None
                time.sleep(0.2 * (attempt + 1))
        else:
            bad += len(entries)
    if sock is not None:
        sock.close()
    failed.append(bad)


def http_client(port: int, job: str, rank: int, count: int, failed: list[int], batch: int = 500) -> None:
    """``count`` lines in ``json_lines`` POSTs of ``batch``; a batch not answered 200 is retried."""
    bad = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for start in range(0, count, batch):
        body = "\n".join(json.dumps(record(job, rank, f"soak valid rank {rank} line {i:08d}"))
                         for i in range(start, min(start + batch, count))).encode()
        for attempt in range(5):
            try:
                conn.request("POST", "/", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    break
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            time.sleep(0.2 * (attempt + 1))
        else:
            bad += min(batch, count - start)
    conn.close()
    failed.append(bad)


# ------------------------------------------------------------------------- fuzzers

def _send(port: int, data: bytes, read: bool = False) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)
            if read:
                s.shutdown(socket.SHUT_WR)
                s.recv(4096)
    except OSError:
        pass                     # a refused or reset connection is the listener's right


def _http_raw(body: bytes, content_type: str = "application/json") -> bytes:
    return (f"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def fuzz_once(rng: random.Random, forward: int, http: int) -> str:
    """One malformed or oversized exchange, chosen at random; returns its kind."""
    kind = rng.choice(["truncated", "random-fwd", "random-http", "big-fwd", "big-http", "utf8-fwd",
                       "utf8-http", "lying-length"])
    now = time.time()
    if kind == "truncated":
        frame = pack_request("kube", [(event_time(now), record("soak-fuzz", 0, f"fuzz {i}"), None)
                                      for i in range(50)], chunk=os.urandom(16).hex())
        _send(forward, frame[:rng.randrange(1, len(frame))])
    elif kind == "random-fwd":
        _send(forward, os.urandom(rng.randrange(1, 65536)))
    elif kind == "random-http":
        _send(http, os.urandom(rng.randrange(1, 65536)), read=True)
    elif kind == "big-fwd":
        _send(forward, pack_request("kube", [(event_time(now), record("soak-fuzz", 0, "x" * TEN_MB), None)]))
    elif kind == "big-http":
        _send(http, _http_raw(json.dumps(record("soak-fuzz", 0, "y" * TEN_MB)).encode()), read=True)
    elif kind == "utf8-fwd":
        _send(forward, pack_request("kube", [(event_time(now), record("soak-fuzz", 0, b"bad \xff\xfe\xc3\x28 " * 8),
                                              None)]))
    elif kind == "utf8-http":
        _send(http, _http_raw(b'{"log": "bad \xff\xfe\xc3\x28", "kubernetes": {}}'), read=True)
    else:                       # a Content-Length that promises more than is sent
        _send(http, _http_raw(b'{"log": "short"}')[:-4] + b"\r\n", read=True)
    return kind


def fuzzer(rng: random.Random, forward: int, http: int, count: int, kinds: list[str]) -> None:
    """``count`` malformed or oversized exchanges (:func:`fuzz_once`), their kinds appended to ``kinds``."""
    for _ in range(count):
        kinds.append(fuzz_once(rng, forward, http))


# ------------------------------------------------------------------------- the part

def run(tmp: Path, lines_forward: int | None = None, lines_http: int | None = None,
        clients: int = 4, fuzzers: int = 4, exchanges: int | None = None) -> list[Figure]:
    """Runs part 1 in ``tmp``; returns its figures.

    Args:
        tmp: a fresh directory.
        lines_forward: valid Forward lines in all (default 200,000 x SOAK_SCALE).
        lines_http: valid HTTP lines in all (default 100,000 x SOAK_SCALE).
        clients: valid clients per listener (of the Forward ones, every second one acked).
        fuzzers: fuzzer threads.
        exchanges: fuzz exchanges in all, shared by the fuzzer threads while the valid clients
            send (default 800 x SOAK_SCALE; a fixed count, so runs compare).
    """
    exchanges = exchanges or int(800 * scale())
    lines_forward = lines_forward or int(200_000 * scale())
    lines_http = lines_http or int(100_000 * scale())
    fwd_port, http_port = free_port(), free_port()
    watch = Watch(tmp, watch_config(fwd_port, http_port)).start()
    figures: list[Figure] = []
    try:
        if not (watch.wait_listening(fwd_port) and watch.wait_listening(http_port)):
            return [zero("fuzz: watch crashes", 1, f"did not start: {watch.stderr()}")]
        say(f"fuzz: {lines_forward} Forward + {lines_http} HTTP valid lines, {exchanges} fuzz exchanges "
            f"from {fuzzers} fuzzers")
        kinds: list[str] = []
        fuzz = [threading.Thread(target=fuzzer, args=(random.Random(17 + i), fwd_port, http_port,
                                                      exchanges // fuzzers + (i < exchanges % fuzzers), kinds),
                                 daemon=True) for i in range(fuzzers)]
        failed_fwd: list[int] = []
        failed_http: list[int] = []
        valid = [threading.Thread(target=acked_forward_client if r % 2 else forward_client,   # half of each
                                  args=(fwd_port, "soak-fwd", r, lines_forward // clients, failed_fwd))
                 for r in range(clients)]
        valid += [threading.Thread(target=http_client, args=(http_port, "soak-http", r, lines_http // clients,
                                                             failed_http)) for r in range(clients)]
        started = time.monotonic()
        for t in fuzz + valid:
            t.start()
        for t in valid + fuzz:
            t.join()
        sent_fwd, sent_http = lines_forward // clients * clients, lines_http // clients * clients
        say(f"fuzz: clients done in {time.monotonic() - started:.0f} s; {len(kinds)} fuzz exchanges")
        last = [-1.0, time.monotonic()]

        def settled() -> bool:       # everything counted, or no change for 10 s
            now = watch.counter("ftwatch_lines_total", job_id="soak/soak-fwd") + \
                watch.counter("ftwatch_lines_total", job_id="soak/soak-http")
            if now >= sent_fwd + sent_http or not watch.alive():
                return True
            if now != last[0]:
                last[:] = [now, time.monotonic()]
            return time.monotonic() - last[1] > 10
        wait_for(settled, 120 * max(1.0, scale()), 0.5)
        seen_fwd = watch.counter("ftwatch_lines_total", job_id="soak/soak-fwd")
        seen_http = watch.counter("ftwatch_lines_total", job_id="soak/soak-http")
        crashed = 0 if watch.alive() else 1
        figures.append(zero("fuzz: watch crashes", crashed, watch.stderr()[-300:] if crashed else
                            f"{len(kinds)} fuzz exchanges ({', '.join(sorted(set(kinds)))})"))
        for name, sent, seen, failed in (("Forward", sent_fwd, seen_fwd, failed_fwd),
                                         ("HTTP", sent_http, seen_http, failed_http)):
            note = f"{int(seen)} of {sent} sent" + (f"; client-side failures {sum(failed)}" if sum(failed) else "")
            figures.append(zero(f"fuzz: {name} lines lost", max(0, sent - int(seen)), note))
            figures.append(zero(f"fuzz: {name} lines duplicated", max(0, int(seen) - sent)))
        return figures
    finally:
        status = watch.stop()
        if figures and status not in (0, None) and figures[0].value == 0:
            figures[0] = zero("fuzz: watch crashes", 1, f"exit status {status} at SIGTERM: {watch.stderr()[-300:]}")
