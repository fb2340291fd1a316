"""What every soak part shares: the figure it reports, the scale, a real ``ftwatch watch``
subprocess with its /metrics, bounded waits on observable conditions, and /proc readings.

Nothing here decides a goal; each part returns :class:`Figure` rows and the runner
(``bench/soak/__main__.py``) prints them and sets the exit status.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


def scale() -> float:
    """``SOAK_SCALE`` (default 1.0): multiplies every count and duration of the soak."""
    return float(os.environ.get("SOAK_SCALE", "1") or 1)


@dataclass(frozen=True)
class Figure:
    """One row of the final table.

    Attributes:
        name: what was measured (e.g. ``fuzz: forward lines lost``).
        value: the measured number.
        goal: the goal as printed (e.g. ``0``, ``<= 10 %``).
        ok: whether the value meets the goal.
        note: context printed after the row (counts behind a ratio), may be empty.
    """

    name: str
    value: float
    goal: str
    ok: bool
    note: str = ""


def zero(name: str, value: float, note: str = "") -> Figure:
    """A figure whose goal is 0."""
    return Figure(name, value, "0", value == 0, note)


def say(text: str) -> None:
    """A progress line, flushed (the soak runs for minutes)."""
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


def wait_for(cond: Callable[[], bool], deadline: float, step: float = 0.05) -> bool:
    """Poll ``cond`` until it holds (True) or ``deadline`` seconds pass (False)."""
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(step)
    return True


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, read, closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int | None:
    """VmRSS of ``pid`` in KiB from /proc/PID/status; None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def env() -> dict[str, str]:
    """The environment for ftwatch subprocesses: this checkout's code first, unbuffered."""
    out = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out.pop("FTWATCH_JOB_ID", None)
    return out


class Watch:
    """A real ``ftwatch watch`` subprocess on a JSON config (JSON is YAML), with /metrics.

    Args:
        tmp: working directory; the config, state directory and stderr file go there.
        config: the config as a mapping.
    """

    def __init__(self, tmp: Path, config: dict):
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.state = tmp / "state"
        self.config = tmp / "watch.yaml"
        self.config.write_text(json.dumps(config))
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> "Watch":
        self.starts += 1
        self._err = open(self.tmp / f"watch-{self.starts}.stderr", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ftwatch", "watch", "--config", str(self.config), "--state-dir",
             str(self.state), "--metrics-port", str(self.metrics_port)],
            cwd=self.tmp, env=env(), stdout=subprocess.DEVNULL, stderr=self._err)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stderr(self) -> str:
        """The last stderr file, its tail (for a crash report)."""
        path = self.tmp / f"watch-{self.starts}.stderr"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def metrics(self) -> str:
        """The /metrics text, or '' while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def counter(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", self.metrics(), re.M):
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m.group(2))
        return total

    def wait_listening(self, port: int, deadline: float = 60) -> bool:
        """True once ``port`` accepts connections (False if watch died or the deadline passed)."""
        def up() -> bool:
            if not self.alive():
                return True
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        return wait_for(up, deadline, 0.1) and self.alive()

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self, deadline: float = 60) -> int | None:
        """SIGTERM, wait; its exit status (SIGKILL after ``deadline``: None)."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.terminate()
        try:
            return self.proc.wait(deadline)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
