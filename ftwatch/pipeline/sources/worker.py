"""One local worker process of ``ftwatch run``: launched in its own process group, its exit
reported after all of its output, its group signalled (SPEC S1).

The supervisor (``ftwatch.pipeline.sources.supervisor``) keeps the table of workers and the one
lock over it; this module is what happens to each of them:

- :func:`launch` starts the command in a new session and process group (so the group is stopped
  as a whole and a worker's children die with it), stdin closed, stdout and stderr piped, with
  the parent-death signal (``ftwatch.pipeline.sources.orphans``).
- :func:`start_io` gives each pipe up to ``PIPE_BYTES`` of kernel buffer, starts its reader
  thread (``ftwatch.pipeline.sources.process``) and the worker's waiter thread.
- The waiter (:func:`wait_exit`) sees the main process end without reaping it, then waits for the
  output: the rest of the group gets ``EXIT_LINGER`` seconds to close the worker's stdout/stderr
  and is SIGKILLed if it has not (only a process that left the group, and holds the streams
  ``DONE_TIMEOUT`` s longer, can make output follow the exit). A reader blocked on a full queue
  (backpressure) has read its pipe to its end or not: its ``eof`` tells the two apart, so a
  worker whose last output waits for room is not taken for one whose leftovers hold its pipes,
  and the linger pauses while the queue is full. Then it queues the
  :class:`~ftwatch.events.ProcessExit`, so an instance's exit always comes after its output.
- Main processes are reaped only by the supervisor (a stop, a restart, ``close``): the zombie
  keeps the group id from being reused, so a signal to the group (:func:`killpg`) never reaches
  an unrelated process; :func:`kill_groups` is the finalizer for groups never reaped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ftwatch.events import Origin, ProcessExit
from ftwatch.pipeline.sources.orphans import die_with_parent_hook
from ftwatch.pipeline.sources.outqueue import OutputQueue
from ftwatch.pipeline.sources.process import start_readers

EXIT_LINGER = 2.0          # seconds a worker's leftovers may keep its pipes open after it exits
DONE_TIMEOUT = 5.0         # seconds to wait for a killed worker's exit to be reported
PIPE_BYTES = 1024 * 1024   # kernel buffer asked for each worker pipe (F_SETPIPE_SZ; best effort)
_F_SETPIPE_SZ = 1031       # fcntl.F_SETPIPE_SZ (Linux), not named by fcntl before Python 3.10


@dataclass(eq=False)
class Worker:
    """One started worker: its main process, origin, reader threads and how it ended.

    Attributes:
        rank: the local rank (``LOCAL_RANK``; the supervisor's table is keyed by it).
        popen: the main process (also the process-group leader).
        origin: instance ``worker-<rank>``, the global rank, job, node (stream ``process``).
        readers: the stdout and stderr reader threads (``process.start_readers``).
        exited: set when the main process ended (seen, not reaped).
        done: set once its ProcessExit is queued.
        stop_requested: the supervisor is stopping it (its exit is ``stopped_by_us``).
        reaped: the main process was reaped: its group id may be reused, never signal it again.
        exit: the ProcessExit queued for it, once ``done``.
    """

    rank: int
    popen: subprocess.Popen
    origin: Origin
    readers: list[threading.Thread] = field(default_factory=list)
    exited: threading.Event = field(default_factory=threading.Event)   # main process ended
    done: threading.Event = field(default_factory=threading.Event)     # ProcessExit queued
    stop_requested: bool = False
    reaped: bool = False
    exit: ProcessExit | None = None


def launch(command: Sequence[str], env: Mapping[str, str], cwd: str | None) -> subprocess.Popen:
    """Start ``command`` in its own session and process group, stdin closed, stdout and stderr
    piped, with the parent-death signal. Raises OSError when it cannot be started."""
    return subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(env), cwd=cwd, start_new_session=True,
                            preexec_fn=die_with_parent_hook())


def start_io(w: Worker, queue: OutputQueue, lock: threading.Lock) -> None:
    """Start ``w``'s reader threads (onto ``queue``) and its waiter thread (:func:`wait_exit`;
    ``lock`` is the supervisor's, held while it reads ``stop_requested`` or signals the group)."""
    popen = w.popen
    for pipe in (popen.stdout, popen.stderr):
        grow_pipe(pipe)
    w.readers = start_readers({"stdout": popen.stdout, "stderr": popen.stderr}, w.origin, queue)
    threading.Thread(target=wait_exit, args=(w, queue, lock), name=f"ftwatch-wait-{w.rank}", daemon=True).start()


def wait_exit(w: Worker, queue: OutputQueue, lock: threading.Lock) -> None:
    """Waiter thread: see the exit (without reaping), wait for the output, report the exit."""
    returncode = sig = None
    try:
        info = os.waitid(os.P_PID, w.popen.pid, os.WEXITED | os.WNOWAIT)
        if info is not None and info.si_code == os.CLD_EXITED:
            returncode = info.si_status
        elif info is not None:
            sig = info.si_status
    except ChildProcessError:              # reaped elsewhere: take what Popen knows
        rc = w.popen.returncode
        returncode, sig = (rc, None) if rc is None or rc >= 0 else (None, -rc)
    with lock:                             # atomic with the supervisor's choice of whom to stop
        stopped = w.stop_requested
        w.exited.set()
    deadline = time.monotonic() + EXIT_LINGER
    for t in w.readers:
        eof = reader_eof(t)
        while not eof.is_set():
            now = time.monotonic()
            if queue.full():             # the readers wait for room, no leftover holds the pipes:
                eof.wait(0.05)           # the linger pauses
                deadline += time.monotonic() - now
            elif now >= deadline or eof.wait(min(0.05, deadline - now)):
                break
    if not all(reader_eof(t).is_set() for t in w.readers):   # leftovers hold the pipes: end them
        with lock:
            killpg(w, signal.SIGKILL)
        for t in w.readers:
            reader_eof(t).wait(DONE_TIMEOUT)
    for t in w.readers:       # read to the end: what is left waits for room on the queue
        t.join(DONE_TIMEOUT if reader_eof(t).is_set() else 0.0)
    w.exit = ProcessExit(w.origin, w.popen.pid, returncode, sig, time.time(), stopped)
    queue.put(w.exit)
    w.done.set()


def reader_eof(t: threading.Thread) -> threading.Event:
    """A reader's end-of-pipe event (``process.start_readers``); a thread without one: its end."""
    eof = getattr(t, "eof", None)
    if eof is None:
        eof = threading.Event()
        if not t.is_alive():
            eof.set()
    return eof


def grow_pipe(pipe) -> None:
    """Ask for a ``PIPE_BYTES`` kernel buffer on ``pipe`` (room for a burst while the reader waits
    for room on the queue); where that is refused (not Linux, over ``pipe-max-size``) it stays."""
    try:
        import fcntl
        fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, ValueError, ImportError):
        pass


def killpg(w: Worker, sig: int) -> None:
    """Signal a worker's process group unless its main process was reaped (call with the lock)."""
    if w.reaped:
        return
    try:
        os.killpg(w.popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_groups(groups: dict[int, int | None]) -> None:
    """Finalizer: SIGKILL every unreaped group (the supervisor was dropped or the interpreter exits)."""
    for pgid in list(groups):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    groups.clear()
