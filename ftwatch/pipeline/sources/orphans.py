"""No orphans: workers die with their monitor, and what a killed monitor left behind is reaped.

Two mechanisms, because neither covers everything (issue 17, item 1):

- **Parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set in each worker between
  fork and exec by :func:`die_with_parent`): when ``ftwatch run`` is SIGKILLed, the kernel kills
  every worker's main process at once, whether or not it would have died with its peers. The
  signal is not inherited by a worker's own children, and it fires when the *thread* that started
  the worker ends: start workers from a thread that lives as long as they should (the runner's loop).
- **The worker record** (:class:`WorkerRecord`): ``<state-dir>/workers/<monitor pid>.json`` lists
  the monitor's live worker process groups, each as its leader's pid (= the group id) and start
  time, written atomically whenever a worker starts or is reaped and removed at a clean end. The
  next ``ftwatch run`` on that state directory calls :func:`reap` before it starts anything: the
  groups of every record whose monitor is gone get SIGTERM, a grace period, then SIGKILL, with a
  line saying so. That catches what the parent-death signal cannot: a worker's children (they
  stay in its process group) and a monitor without ``prctl``.

A recycled pid is never signalled. A group counts as the dead monitor's only when its leader is
alive with the recorded start time (``/proc/PID/stat`` field 22, clock ticks after boot, on the
same boot: ``/proc/sys/kernel/random/boot_id``), or, when the leader is gone (the parent-death
signal killed it) and its children hold the group, when one of them carries the monitor's
``FTWATCH_MONITOR_ID=<pid>.<start>`` in its environment (a group id cannot be reused while a
process is in that group). A record whose monitor is still alive (another ``ftwatch run`` on the
same state directory) is left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping

RECORD_DIR = "workers"          # under the state directory
MONITOR_ENV = "FTWATCH_MONITOR_ID"
_PR_SET_PDEATHSIG = 1
_POLL = 0.05                    # seconds between looks at /proc while waiting for groups to end
KILL_WAIT = 5.0                 # seconds to wait for SIGKILLed groups to disappear

try:                            # resolved once, here: the child after fork only calls it
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):   # not Linux
    _prctl = None


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child die with this process.

    The hook sets ``PR_SET_PDEATHSIG`` to SIGKILL and, should this process have died between fork
    and ``prctl``, kills the child at once. Returns None where ``prctl`` is missing (not Linux).
    """
    if _prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:           # runs in the child between fork and exec: no imports, no locks
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks after boot (``/proc/PID/stat`` field 22), or None
    when there is no such process (a zombie still has one)."""
    stat = _stat(pid)
    return int(stat[19]) if stat is not None else None


class WorkerRecord:
    """The live worker process groups of this monitor, kept in the state directory.

    Args:
        state_dir: the run's state directory; the record is ``<state_dir>/workers/<pid>.json``,
            ``{"boot_id", "monitor": {"pid", "start"}, "groups": [{"pgid", "start"}, ...]}``.
        warn: where a failure to write is reported (once); stderr when None.
    """

    def __init__(self, state_dir: Path, warn: Callable[[str], None] | None = None):
        pid = os.getpid()
        self.monitor = {"pid": pid, "start": process_start(pid)}
        self.token = f"{pid}.{self.monitor['start']}"
        self.path = Path(state_dir) / RECORD_DIR / f"{pid}.json"
        self._warn = warn or (lambda text: print(text, file=sys.stderr))
        self._warned = False

    def env(self) -> dict[str, str]:
        """What each worker's environment carries so that its children can be told apart."""
        return {MONITOR_ENV: self.token}

    def write(self, groups: Mapping[int, int | None]) -> None:
        """Record ``groups`` (group id -> leader start ticks) atomically (temporary file, rename).
        A failure is reported once and otherwise ignored: supervision goes on without the record."""
        data = {"boot_id": _boot_id(), "monitor": self.monitor,
                "groups": [{"pgid": pgid, "start": start} for pgid, start in sorted(groups.items())]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                self._warn(f"ftwatch: cannot record the worker process groups in {self.path.parent} ({exc}); "
                           "workers of a killed ftwatch will not be reaped by the next start")

    def remove(self) -> None:
        """The clean end: no worker is left, so no record."""
        with contextlib.suppress(OSError):
            self.path.unlink()


def reap(state_dir: Path, grace: float, say: Callable[[str], None]) -> list[int]:
    """Stop the worker process groups that dead monitors recorded in ``state_dir``.

    For each record whose monitor is gone: SIGTERM (and SIGCONT) to each of its groups that is
    still the monitor's (see the module docstring), up to ``grace`` seconds for them to end,
    SIGKILL to those left (checked again first), up to :data:`KILL_WAIT` s for them to disappear;
    then the record is removed. One line per record with groups goes to ``say``.

    Args:
        state_dir: the state directory (records under ``workers/``; none is fine).
        grace: seconds between SIGTERM and SIGKILL.
        say: where the "stopping N worker process groups" line goes.

    Returns:
        The group ids signalled (empty when nothing was left).
    """
    boot = _boot_id()
    reaped: list[int] = []
    for path in sorted((Path(state_dir) / RECORD_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            monitor = record["monitor"]
            recorded = {int(g["pgid"]): g["start"] for g in record["groups"]}
        except (OSError, ValueError, KeyError, TypeError):
            with contextlib.suppress(OSError):
                path.unlink()                    # a torn or foreign file: nothing to trust in it
            continue
        if record.get("boot_id") != boot:        # rebooted since: everything in it is gone
            path.unlink(missing_ok=True)
            continue
        if _alive(monitor["pid"], monitor["start"]):
            continue                             # another ftwatch on this state directory: its workers
        token = f"{monitor['pid']}.{monitor['start']}"
        groups = _ours(recorded, token)
        if groups:
            say(f"ftwatch: stopping {len(groups)} worker process group(s) left running by ftwatch pid "
                f"{monitor['pid']}, which is gone: {' '.join(map(str, groups))} "
                f"(SIGTERM, {grace:g} s grace, then SIGKILL)")
            _stop(groups, recorded, token, grace)
            reaped += groups
        path.unlink(missing_ok=True)
    return reaped


def _stop(groups: list[int], recorded: Mapping[int, int | None], token: str, grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pgid in groups:
            _killpg(pgid, sig)
    left = _wait_gone(groups, grace)
    left = _ours({g: recorded[g] for g in left}, token)     # checked again: never a recycled group
    for pgid in left:
        _killpg(pgid, signal.SIGKILL)
    _wait_gone(left, KILL_WAIT)


def _wait_gone(groups: Iterable[int], seconds: float) -> list[int]:
    """Poll /proc until no live process is in ``groups`` or ``seconds`` pass; the groups left."""
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        members = _members()
        left = [g for g in groups if members.get(g)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL)      # real processes ending: there is no event to wait on


def _ours(recorded: Mapping[int, int | None], token: str) -> list[int]:
    """The recorded groups that still exist and are provably the recorded monitor's."""
    members = _members()
    ours = []
    for pgid, start in recorded.items():
        if not members.get(pgid):
            continue
        leader = process_start(pgid)
        if leader is not None:                  # the leader (maybe a zombie) decides by its start time
            if start is not None and leader == start:
                ours.append(pgid)
        elif any(_carries(pid, token) and (process_start(pid) or 0) >= (start or 0) for pid in members[pgid]):
            ours.append(pgid)
    return ours


def _members() -> dict[int, list[int]]:
    """Process group id -> its live (not zombie) processes, from /proc."""
    groups: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = _stat(int(name))
                if stat is not None and stat[0] != "Z":
                    groups.setdefault(int(stat[2]), []).append(int(name))
    return groups


def _carries(pid: int, token: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MONITOR_ENV}={token}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _alive(pid: int, start: int | None) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and start is not None and int(stat[19]) == start


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]; None if no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
