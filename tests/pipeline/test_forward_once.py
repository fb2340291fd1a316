"""Forward chunks are handled exactly once across a kill of ``watch`` (issue 17).

A Forward client (fluent-bit with ``Require_ack_response``) sends a chunk again when it gets no
ack. Before, ``watch`` acked a chunk once it was queued, and nothing remembered it: a kill between
the store's commit of the chunk's findings and the ack made fluent-bit resend it, and every line
was judged twice. Now the ack waits for the consumer's acknowledgement, the chunk id is stored in
the transaction of the findings (``SqliteStore`` table ``chunks``), and the same id again is
acked and skipped.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from ftwatch.pipeline.sources.base import ChunkMark
from ftwatch.pipeline.sources.forward import ForwardSource

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))       # bench/ is beside the package, not in it

from bench.soak.rotation import DEADLINE, RULES, seen, wait_for  # noqa: E402
from tests.pipeline.test_forward import Client, listening  # noqa: E402


def frame(chunk: str, first: int, count: int) -> bytes:
    """A Forward-mode request of ``count`` lines ``tick <n>`` from ``first`` with option ``chunk``."""
    entries = [[1_700_000_000 + i, {"log": f"tick {i:08d}\n"}] for i in range(first, first + count)]
    return msgpack.packb(["app", entries, {"chunk": chunk, "size": count}])


def no_reply(client: Client, seconds: float = 0.3) -> bool:
    try:
        client.recv(timeout=seconds)
    except (TimeoutError, socket.timeout):
        return True
    return False


# ---- the listener ------------------------------------------------------------------------------

def test_a_chunk_is_acked_only_once_its_batch_is_acknowledged_and_skipped_when_seen() -> None:
    out: queue.Queue = queue.Queue()
    stored: set[tuple[str, str]] = set()
    repeats: list[tuple[str, int]] = []
    with listening(out, require_ack=True, seen=lambda s, c: (s, c) in stored, keep_chunks=7,
                   keep_chunk_seconds=9.0, repeated=lambda s, n: repeats.append((s, n))) as src:
        c = Client(src.port)
        c.send(frame("a" * 32, 0, 3))
        batch = out.get(timeout=DEADLINE)
        assert [s.line for s in batch] == [b"tick 00000000", b"tick 00000001", b"tick 00000002"]
        assert batch.chunk == ChunkMark("forward", "a" * 32, 7, 9.0)
        assert no_reply(c)                                 # queued is not handled: no ack yet
        stored.add(("forward", "a" * 32))                  # what watch's store transaction does
        batch.ack()
        assert c.recv() == {"ack": "a" * 32}

        again = Client(src.port)                           # the ack was lost: sent again
        again.send(frame("a" * 32, 0, 3))
        assert again.recv() == {"ack": "a" * 32}
        assert out.empty() and repeats == [("forward", 3)]
        assert src.stats["repeated"] == 1 and src.stats["messages"] == 1


def test_the_same_chunk_on_two_connections_at_once_is_queued_once() -> None:
    """A client that timed out waiting sends the chunk again on a new connection while the first
    copy is still being handled: both get the ack once it is handled, the records go once."""
    out: queue.Queue = queue.Queue()
    with listening(out, require_ack=True, seen=lambda s, c: False) as src:
        first, second = Client(src.port), Client(src.port)
        first.send(frame("b" * 32, 0, 2))
        batch = out.get(timeout=DEADLINE)
        second.send(frame("b" * 32, 0, 2))
        assert no_reply(second) and out.empty()
        batch.ack()
        assert first.recv() == {"ack": "b" * 32} and second.recv() == {"ack": "b" * 32}
        assert out.empty() and src.stats["repeated"] == 1


def test_without_require_ack_a_chunk_is_acked_once_queued() -> None:
    """``ForwardSource`` alone (no consumer store) keeps the old contract: ack once queued."""
    out: queue.Queue = queue.Queue()
    with listening(out) as src:
        c = Client(src.port)
        c.send(frame("c" * 32, 0, 1))
        assert c.recv() == {"ack": "c" * 32}
        assert getattr(out.get(timeout=DEADLINE), "chunk", None) is None


def test_stop_while_a_chunk_awaits_its_ack_sends_none() -> None:
    out: queue.Queue = queue.Queue()
    src = ForwardSource(out, port=0, require_ack=True, seen=lambda s, c: False)
    src.start()
    c = Client(src.port)
    try:
        c.send(frame("d" * 32, 0, 1))
        out.get(timeout=DEADLINE)
        src.stop()
        with pytest.raises((EOFError, ConnectionResetError)):
            c.recv()
    finally:
        src.stop()
        c.close()
        Client.opened.remove(c)


# ---- a real watch killed between the commit and the ack ------------------------------------------

# Runs ``ftwatch watch`` (argv[1:]) with a hook that SIGKILLs it when it acknowledges its first batch
# that carries a Forward chunk id: the batch's findings and the id are committed, the ack not sent.
KILLED_BEFORE_THE_ACK = """
import os, signal, sys
from ftwatch.pipeline.sources.base import ShippedBatch
ack = ShippedBatch.ack
def hooked(self):
    if self.chunk is not None:
        os.kill(os.getpid(), signal.SIGKILL)
    ack(self)
ShippedBatch.ack = hooked
from ftwatch.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect(port: int) -> Client:
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return Client(port)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_chunk_resent_after_a_kill_between_commit_and_ack_is_judged_once(tmp_path: Path) -> None:
    port = _free_port()
    (tmp_path / "rules.yaml").write_text(RULES)
    config = tmp_path / "watch.yaml"
    config.write_text(f"rules:\n  builtin: false\n  files: [{tmp_path / 'rules.yaml'}]\n"
                      f"watch:\n  sources:\n    - {{type: forward, name: fb, port: {port}}}\n")
    state = tmp_path / "state"
    args = ["watch", "--config", str(config), "--state-dir", str(state)]
    db = state / "ftwatch.db"
    chunk = "0123456789abcdef0123456789abcdef"     # fluent-bit's form: 32 hex digits

    killed = subprocess.Popen([sys.executable, "-c", KILLED_BEFORE_THE_ACK, *args], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client = _connect(port)
        client.send(frame(chunk, 0, 50))
        with pytest.raises((EOFError, ConnectionResetError)):
            client.recv()                              # no ack: the client will send it again
        assert killed.wait(DEADLINE) == -signal.SIGKILL, killed.stderr.read()
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
        killed.stderr.close()
    assert len(seen(db)) == 50                         # committed before the kill

    child = subprocess.Popen([sys.executable, "-m", "ftwatch", *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        client = _connect(port)
        client.send(frame(chunk, 0, 50))               # fluent-bit's retry of the unacked chunk
        assert client.recv() == {"ack": chunk}
        client.send(frame("f" * 32, 50, 10))           # and the next chunk goes on as before
        assert client.recv() == {"ack": "f" * 32}
        wait_for(lambda: len(seen(db)) >= 60, "the next chunk")
        child.send_signal(signal.SIGTERM)
        assert child.wait(DEADLINE) == 0
        stderr = child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
        while Client.opened:
            Client.opened.pop().close()
    lines = seen(db)
    assert sorted(lines) == [f"tick {i:08d}" for i in range(60)], f"{len(lines) - 60} lines judged twice"
    assert f"chunk {chunk} was handled before: acked again, 50 records skipped" in stderr
