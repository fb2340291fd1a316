"""The agents' meeting place: PyTorch's c10d ``TCPStore`` (torchrun's ``--rdzv-backend c10d``), its
keys under the job's run id, its values msgpack.

The store is served by a process of its own (``python -m ftwatch.pipeline.cluster.store``), which
the hosting agent starts in its own session: the agent that hosts it may be killed (``kill -9``)
and the job goes on, which a store inside the agent (torchrun's) cannot do. The server ends when
every node of the current world is done or silent for ``2 x lost_after`` seconds.

torch is an optional dependency (``pip install ftwatch[torch]``): :func:`open_store` raises
``RuntimeError`` with the install hint without it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any, Protocol

import msgpack

NEEDS_TORCH = "multi-node ftwatch run needs PyTorch's c10d store: pip install 'ftwatch[torch]' (or torch)"


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the agents use (tests: a dict, tests/pipeline/test_cluster.py)."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def add(self, key: str, amount: int) -> int: ...

    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...


class KV:
    """A store seen through one job's prefix, with msgpack values.

    Args:
        store: the c10d store (or a test double).
        run_id: the job's rendezvous id; every key is ``ftwatch/<run_id>/<key>``.
    """

    def __init__(self, store: Store, run_id: str):
        self.store, self.prefix = store, f"ftwatch/{run_id}/"

    def put(self, key: str, value: Any) -> None:
        self.store.set(self.prefix + key, msgpack.packb(value))

    def has(self, key: str) -> bool:
        return self.store.check([self.prefix + key])

    def read(self, key: str, default: Any = None) -> Any:
        """The value at ``key``, or ``default`` when it is not set (never blocks)."""
        if not self.has(key):
            return default
        return msgpack.unpackb(self.store.get(self.prefix + key))

    def count(self, key: str, amount: int = 1) -> int:
        """Add ``amount`` to the counter ``key``; returns the new value (``amount=0`` reads it)."""
        return int(self.store.add(self.prefix + key, amount))

    def claim(self, key: str, value: str, expected: str = "") -> str:
        """Set the text ``key`` to ``value`` when it holds ``expected`` ("": when unset); returns
        what it holds afterwards (``value`` if and only if this call won). Plain text, not
        msgpack: c10d compares strings."""
        got = self.store.compare_set(self.prefix + key, expected, value)
        return got.decode() if isinstance(got, bytes) else got

    def text(self, key: str) -> str:
        """The text at ``key`` ("" when unset), as :meth:`claim` wrote it."""
        return self.store.get(self.prefix + key).decode() if self.has(key) else ""


def _torch_store():
    try:
        from torch.distributed import TCPStore
    except ImportError as exc:
        raise RuntimeError(f"{NEEDS_TORCH} ({exc})") from None
    return TCPStore


def is_local(host: str) -> bool:
    """True when ``host`` names this machine (loopback, its host name or one of its addresses)."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        mine = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
        return bool(mine & {a[4][0] for a in socket.getaddrinfo(host, None)})
    except OSError:
        return False


def start_server(host: str, port: int, run_id: str, lost_after: float) -> subprocess.Popen:
    """Start the store's server process (its own session: it outlives this agent). When the
    port is taken (another agent of the job hosts it) the process ends at once; either way the
    caller then connects with :func:`open_store`."""
    return subprocess.Popen([sys.executable, "-m", "ftwatch.pipeline.cluster.store", "--port", str(port),
                             "--run-id", run_id, "--lost-after", str(lost_after)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def open_store(host: str, port: int, timeout: float = 60.0) -> Store:
    """A client of the store at ``host:port``, waiting up to ``timeout`` seconds for it.

    Raises:
        RuntimeError: torch is not installed (the message says how to install it).
        TimeoutError / RuntimeError: no store answered in time (torch's message).
    """
    TCPStore = _torch_store()
    return TCPStore(host, port, None, False, timedelta(seconds=timeout))


def serve(port: int, run_id: str, lost_after: float, poll: float = 0.5) -> int:
    """The server process: serve the store until the job's nodes are all done or silent.

    Returns 0 when it ended, 98 when the port was taken (another server hosts the job)."""
    TCPStore = _torch_store()
    try:
        server = TCPStore("0.0.0.0", port, None, True, timedelta(seconds=30), wait_for_workers=False)
    except (RuntimeError, OSError):
        return 98
    kv = KV(server, run_id)
    beats: dict[int, tuple[int, float]] = {}
    started = time.monotonic()
    while True:
        time.sleep(poll)
        now = time.monotonic()
        gen = kv.read("gen", 0)
        world = kv.read(f"world/{gen}") or (kv.read(f"world/{gen - 1}") if gen else None)
        nodes = (world or {}).get("nodes", [])
        if not nodes:
            if now - started > max(600.0, 4 * lost_after):      # nobody ever came
                return 0
            continue
        quiet = []
        for n in nodes:
            beat = kv.count(f"hb/{n}", 0)
            last = beats.get(n)
            if last is None or last[0] != beat:
                beats[n] = (beat, now)
            quiet.append(kv.has(f"done/{n}") or now - beats[n][1] > 2 * lost_after)
        if all(quiet):
            time.sleep(2 * poll)          # the last agents read their last keys
            return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftwatch.pipeline.cluster.store")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--lost-after", type=float, default=10.0)
    a = p.parse_args(argv)
    return serve(a.port, a.run_id, a.lost_after)


if __name__ == "__main__":
    sys.exit(main())
