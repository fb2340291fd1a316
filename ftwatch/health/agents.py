"""Start health-check agents (``ftwatch.health.agent``) and talk to them with a deadline.

An :class:`Agent` is one child process running ``python -m ftwatch.health.agent`` for one worker
slot or node; :func:`run_group` runs one collective check across several agents at once (a
process group of ``len(agents)`` ranks on a fresh port) and gives each agent's answer, or an
error for an agent that died, timed out or failed. An agent that failed a check is closed: the
next request starts a fresh one (a process group that failed is not reused).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

START_TIMEOUT = 120.0     # seconds an agent may take to import torch and answer its first request


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for the group's rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(eq=False)
class Agent:
    """One agent process for node (or worker slot) ``node``.

    Args:
        node: the node index, given to the agent as ``FTWATCH_HEALTH_NODE``.
        python: the interpreter (default: this one; it must be able to import torch).
        env: extra environment.
    """

    node: int
    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    started: bool = False
    lines: queue.Queue | None = None

    def _spawn(self) -> None:
        env = {**os.environ, **self.env, "FTWATCH_HEALTH_NODE": str(self.node), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([self.python, "-m", "ftwatch.health.agent"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     text=True, start_new_session=True)
        self.started = False
        self.lines = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, self.lines), daemon=True).start()

    def send(self, request: dict) -> None:
        """Send one request (spawning the process first when there is none alive)."""
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass                      # it died; receive() says so

    def receive(self, deadline: float) -> dict:
        """The answer to the last request, or ``{"ok": False, "error": ...}`` when the agent died
        (``"down"``: exit code or signal) or did not answer by ``deadline`` (monotonic seconds)."""
        proc, lines = self.proc, self.lines
        assert proc is not None and lines is not None
        if not self.started:
            deadline = max(deadline, time.monotonic() + START_TIMEOUT)
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                return {"ok": False, "error": "timed out", "down": False}
            if line is None:                  # end of its output: the process ended
                code = proc.wait()
                self.proc = None
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                return {"ok": False, "error": f"the check process ended ({how})", "down": True}
            self.started = True
            try:
                answer = json.loads(line)
            except ValueError:
                continue              # a stray line (a library printing to stdout)
            if not isinstance(answer, dict):
                continue
            if not answer.get("ok"):
                self.close()
                answer["down"] = False
            return answer

    def close(self) -> None:
        """End the process (SIGKILL after a short wait); a later request starts a new one."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write('{"op": "exit"}\n')
                proc.stdin.flush()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, 9)
            except OSError:
                pass
            proc.wait()


def _pump(stream, lines: queue.Queue) -> None:
    """Move an agent's stdout lines onto its queue; None at the end."""
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)


def run_group(agents: Sequence[Agent], request: Mapping, timeout: float, addr: str = "127.0.0.1") -> list[dict]:
    """Run one collective check over ``agents`` (rank i = agents[i]) and return their answers.

    Args:
        agents: the group's members.
        request: the ``collective`` request without rank, world, addr and port.
        timeout: the process group's timeout, seconds; answers are awaited ``timeout + 15`` s.
    """
    port = free_port(addr)
    for rank, agent in enumerate(agents):
        agent.send({**request, "op": "collective", "rank": rank, "world": len(agents), "addr": addr,
                    "port": port, "timeout": timeout})
    deadline = time.monotonic() + timeout + 15
    return [agent.receive(deadline) for agent in agents]


def probe(agent: Agent, timeout: float = 60.0) -> dict:
    """The agent's versions (torch, CUDA, NCCL) and visible devices (see ``ftwatch.health.agent``)."""
    agent.send({"op": "probe"})
    return agent.receive(time.monotonic() + timeout)
