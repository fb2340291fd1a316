"""Keep the scene (SPEC A3, seed 001 "保留现场"): on a final failure the workers are left as they are
for a while (the survivors running, a SIGSTOPped one stopped, their process groups intact) and the
terminal says how to attach to them; then ftwatch stops them and exits with the job's status.

:class:`Scene` follows the workers from the supervisor's ``Started`` / ``ProcessExit`` events
(pid, rank, exit) and writes the attach text; the runner holds the window (it keeps reading the
workers' output meanwhile, so a full pipe never blocks them) and stops the workers after it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

_STATES = {"R": "running", "S": "running (sleeping)", "D": "running (disk wait)", "T": "stopped (SIGSTOP)",
           "t": "stopped (traced)", "Z": "exited", "X": "exited"}


@dataclass
class _Worker:
    instance: str
    rank: int | None
    pid: int
    exit: str | None = None      # "exit 1" / "signal SIGKILL" once ended


class Scene:
    """The workers of the current attempt, by instance."""

    def __init__(self) -> None:
        self.workers: dict[str, _Worker] = {}

    def started(self, instance: str, rank: int | None, pid: int) -> None:
        """A worker (re)started."""
        self.workers[instance] = _Worker(instance, rank, pid)

    def exited(self, instance: str, returncode: int | None, sig: int | None) -> None:
        """A worker's main process ended."""
        w = self.workers.get(instance)
        if w is not None:
            w.exit = describe_exit(returncode, sig)

    def pids(self, alive_only: bool = True) -> dict[str, int]:
        """instance -> pid, of the workers whose main process has not ended (all with False)."""
        return {w.instance: w.pid for w in self.workers.values() if not alive_only or w.exit is None}

    def attach_text(self, seconds: float, state_dir: Path | str, env: Mapping[str, str], cwd: str | None = None,
                    proc: Path = Path("/proc")) -> str:
        """What the terminal shows when the scene is kept.

        Args:
            seconds: how long the scene is kept.
            state_dir: ftwatch's state dir (store, budgets, isolation).
            env: the variables ftwatch set for the workers worth showing (``MASTER_PORT`` ...).
            cwd: the workers' working directory.
            proc: the procfs root (tests point it elsewhere).
        """
        lines = [f"ftwatch: keeping the scene for {seconds:g} s (supervisor.keep_scene_seconds / --keep-scene; "
                 "Ctrl-C ends it early), then the workers are stopped"]
        for w in sorted(self.workers.values(), key=lambda w: (w.rank is None, w.rank or 0, w.instance)):
            state = w.exit or _proc_state(proc, w.pid)
            lines.append(f"  {w.instance} (rank {'-' if w.rank is None else w.rank})  pid {w.pid}  {state}")
            if w.exit is None:
                lines.append(f"      py-spy dump --pid {w.pid}      gdb -p {w.pid}      "
                             f"tr '\\0' '\\n' < /proc/{w.pid}/environ")
        lines.append(f"  state dir  {Path(state_dir).resolve()}")
        if cwd:
            lines.append(f"  cwd        {cwd}")
        if env:
            lines.append("  env        " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
        return "\n".join(lines)


def describe_exit(returncode: int | None, sig: int | None) -> str:
    """``exit 1`` or ``signal SIGKILL``."""
    if sig is not None:
        try:
            return f"signal {signal.Signals(sig).name}"
        except ValueError:
            return f"signal {sig}"
    return f"exit {returncode}"


def _proc_state(proc: Path, pid: int) -> str:
    """``running`` / ``stopped (SIGSTOP)`` ... from ``/proc/<pid>/stat``; ``running`` when unreadable."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        code = stat.rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "running"
    return _STATES.get(code, f"state {code}")
