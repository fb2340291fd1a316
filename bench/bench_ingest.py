"""`make bench` (ingestion): Forward records into the engine, and file tail lines, as ratios
to the plain decode / read floor measured in the same run.

- Forward: a real loopback client sends Forward-mode requests (1,000 entries each, EventTime,
  Kubernetes metadata, one ack outstanding as fluent-bit does with require_ack_response) to a
  ForwardSource; the consumer unwraps, names and feeds the Engine with the built-in packs.
  The consumer does what ``Watcher.ingest`` does (``identity.resolve``, ``group_lines``, one
  ``Engine.feed`` per origin), without the per-job incident bookkeeping.
  Floor: ``msgpack.Unpacker`` over the same bytes with nothing else done.
- File tail: FileTailSource reads a file of recorded log lines once into the Engine.
  Floor: ``for line in open(path, 'rb')``.

Prints records/s, MB/s and ratios; asserts nothing. Target (issue 3): >= 200 k records/s on one
core: the process is pinned to one CPU, so the listener and the consumer share it as they would
on a busy node, and the garbage collector is tuned as ``ftwatch watch`` tunes it.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftwatch.pipeline.sources.identity import Identity  # noqa: E402
from ftwatch.pipeline.sources.checkpoints import OffsetStore  # noqa: E402
from ftwatch.pipeline.sources.file_tail import FileTailSource  # noqa: E402
from ftwatch.pipeline.sources.forward import ForwardSource  # noqa: E402
from ftwatch.pipeline.sources.forward_protocol import event_time, pack_request  # noqa: E402
from ftwatch.pipeline.watch import group_lines  # noqa: E402
from ftwatch.rules.engine import Engine  # noqa: E402
from ftwatch.rules.loader import load_rules  # noqa: E402
from ftwatch.pipeline.watch import tune_gc_for_ingest  # noqa: E402


def sample_lines() -> list[str]:
    golden = ROOT / "tests" / "golden"
    clean = (golden / "torchrun_clean" / "combined.log").read_text().splitlines()
    fail = (golden / "torchrun_sigkill" / "combined.log").read_text().splitlines()
    return clean * 30 + fail


def requests(n_records: int, per_request: int = 1000) -> list[bytes]:
    lines = sample_lines()
    out, i, now = [], 0, time.time()
    while i < n_records:
        entries = []
        for k in range(per_request):
            rank = (i + k) % 32
            entries.append((event_time(now), {
                "log": lines[(i + k) % len(lines)], "stream": "stderr",
                "kubernetes": {"pod_name": f"llm-worker-{rank}", "namespace_name": "train",
                               "host": f"node-{rank // 8}",
                               "labels": {"training.kubeflow.org/job-name": "llm"}}}, None))
        out.append(pack_request("kube.var.log", entries, mode="forward", chunk=f"{i:032x}"))
        i += per_request
    return out


def feed(engine: Engine, identity: Identity, batch: list) -> int:
    """What ``Watcher.ingest`` does with a batch, minus the per-job incident bookkeeping:
    resolve, ``group_lines``, one engine chunk per origin. Returns the lines fed."""
    seen = 0
    for origin, (lines, t) in group_lines(identity.resolve(batch)).items():
        engine.feed(origin, b"\n".join(lines) + b"\n", t)
        seen += len(lines)
    return seen


def consume(q: queue.Queue, engine: Engine, identity: Identity, expect: int, done: threading.Event) -> None:
    seen = 0
    while seen < expect:
        seen += feed(engine, identity, q.get())
    done.set()


def bench_forward(n: int) -> tuple[float, float, int]:
    reqs = requests(n)
    size = sum(map(len, reqs))
    start = time.perf_counter()
    unpacker = msgpack.Unpacker(raw=False)
    for r in reqs:
        unpacker.feed(r)
        for _ in unpacker:
            pass
    floor = time.perf_counter() - start

    q: queue.Queue = queue.Queue(maxsize=64)
    source = ForwardSource(q, port=0)
    source.start()
    engine, identity, done = Engine(load_rules()), Identity(), threading.Event()
    consumer = threading.Thread(target=consume, args=(q, engine, identity, len(reqs) * 1000, done), daemon=True)
    consumer.start()
    sock = socket.create_connection(("127.0.0.1", source.port))
    unpack_ack = msgpack.Unpacker(raw=False)
    start = time.perf_counter()
    for r in reqs:
        sock.sendall(r)
        while True:                                  # one ack outstanding, as fluent-bit waits
            unpack_ack.feed(sock.recv(4096))
            if any(True for _ in unpack_ack):
                break
    done.wait(120)
    full = time.perf_counter() - start
    sock.close()
    source.stop()
    return floor, full, size


def bench_tail(n_lines: int) -> tuple[float, float, int]:
    lines = sample_lines()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank0.log"
        with path.open("w") as fh:
            for i in range(n_lines):
                fh.write(lines[i % len(lines)] + "\n")
        size = path.stat().st_size
        start = time.perf_counter()
        with path.open("rb") as fh:
            for _ in fh:
                pass
        floor = time.perf_counter() - start
        q: queue.Queue = queue.Queue()
        tail = FileTailSource([str(path)], q, OffsetStore(Path(tmp) / "o.json"), read_from_head=True)
        engine, identity = Engine(load_rules()), Identity()
        start = time.perf_counter()
        got = 0
        while got < n_lines:
            tail.poll_once()
            while not q.empty():
                got += feed(engine, identity, q.get())
        full = time.perf_counter() - start
    return floor, full, size


def main() -> None:
    # The target is per core: pin the process (listener and consumer threads) to one CPU, and
    # tune the collector as `ftwatch watch` does.
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    tune_gc_for_ingest()
    n = 200_000
    floor, full, size = bench_forward(n)
    records = (n // 1000) * 1000
    print(f"forward: {records:,} records, {size / 1e6:.1f} MB over loopback into the engine")
    print(f"  decode floor (msgpack.Unpacker)     {records / floor:12,.0f} records/s {size / floor / 1e6:8.1f} MB/s")
    print(f"  listener -> identity -> engine      {records / full:12,.0f} records/s {size / full / 1e6:8.1f} MB/s")
    print(f"  ratio to the floor                  {floor / full:12.2f}")
    print(f"  target >= 200,000 records/s: {'met' if records / full >= 200_000 else 'NOT met'}")
    lines = 500_000
    floor, full, size = bench_tail(lines)
    print(f"file tail: {lines:,} lines, {size / 1e6:.1f} MB")
    print(f"  read floor (for line in file)       {lines / floor:12,.0f} lines/s")
    print(f"  tail -> identity -> engine          {lines / full:12,.0f} lines/s")
    print(f"  ratio to the floor                  {floor / full:12.2f}")


if __name__ == "__main__":
    main()
