"""The local supervisor: N workers on this machine, torchrun style (SPEC S1, A1, A2).

Each worker runs ``command`` in its own session and process group with the torchrun environment.
Its stdout and stderr are read separately, one thread each, and handed over as batches of complete
lines (:class:`Output`) as soon as a read returns them (``ftwatch.pipeline.sources.process``, where
``Output`` and ``Started`` live; re-exported here). A waiter thread per worker queues its
:class:`~ftwatch.events.ProcessExit` after both streams hit EOF, so an instance's exit always
comes after all of its output. :meth:`Supervisor.poll` takes everything off that one queue, the
Outputs of each stream merged. What happens to one worker process (launch, reader and waiter
threads, its exit after its output, signals to its group) is ``ftwatch.pipeline.sources.worker``;
this module keeps the table of workers: starts, restarts, stops and reaping, under one lock.

Backpressure (issue 16 item 4): that queue is an ``outqueue.OutputQueue`` bounded at
``queue_bytes``; a reader with no room waits, so a slow monitor slows its workers' writes (each
pipe gets up to ``worker.PIPE_BYTES`` of kernel buffer first) instead of growing without bound.
While a stop waits for the workers to die nothing blocks (the loop takes no output then).
:meth:`Supervisor.lag` is the queue's depth in bytes and the age of its oldest item.

Restart counters (A2, seed 002): ``MA_SCHEDULE_CNT`` stays 1 on one machine unless a start is a
rescheduling (``start_all(..., reschedule=True)``: the job moved off an isolated device),
``MA_PROC_START_CNT`` counts each instance's starts (every other local restart is an in-place
recovery), ``TORCHELASTIC_RESTART_COUNT`` is the job's restart count and ``FTWATCH_ATTEMPT`` the
instance's start count; README "Contracts".

Process groups. A group is stopped as a whole, so a worker's children die with it; when a worker's
main process exits on its own, leftovers that hold its pipes are killed (``worker``). Group members
that let go of the streams live until :meth:`~Supervisor.stop_all`, a restart or
:meth:`~Supervisor.close`. Main processes are reaped only then: the zombie keeps the group id from
being reused, so a signal to the group never reaches an unrelated process. Nothing is left behind
after ``close`` (a finalizer also kills the groups at interpreter exit). A SIGKILL of ftwatch itself kills every worker's main process through
the parent-death signal; with a ``record`` (:class:`~ftwatch.pipeline.sources.orphans.WorkerRecord`)
the live groups are also kept in the state directory, so that the next start reaps what is left
(a worker's children): ``ftwatch.pipeline.sources.orphans``.

Signals. ``stop_all`` and ``close`` may be called from a Python signal handler. If the handler
interrupted this supervisor's own ``start_all``, ``restart_instance``, ``stop_all`` or ``close``, the
call only sets a flag (during a stop it also ends the grace period at once: a second Ctrl-C kills)
and the interrupted method carries it out before it returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import weakref
from typing import Iterator, Mapping, Sequence

from ftwatch.errors import SourceError
from ftwatch.events import Origin, ProcessExit
from ftwatch.pipeline.sources.orphans import WorkerRecord, process_start
from ftwatch.pipeline.sources.outqueue import MAX_BYTES, OutputQueue, coalesce
from ftwatch.pipeline.sources.process import Output, Started  # noqa: F401 (re-exported)
from ftwatch.pipeline.sources.worker import (DONE_TIMEOUT, EXIT_LINGER, Worker, kill_groups, killpg, launch,
                                             start_io)


class Supervisor:
    """Starts, watches, stops and restarts N local workers.

    Call :meth:`start_all` and :meth:`restart_instance` from a thread that lives as long as the
    workers should: each worker gets SIGKILL when the thread that started it ends (Linux's
    parent-death signal belongs to the starting thread; ``ftwatch.pipeline.sources.orphans``).

    Args:
        command: the argv every worker runs.
        nproc: how many workers (ranks 0 .. nproc-1); >= 1.
        job: the job id (in every Origin).
        node: the host name in every Origin; the machine's own when None.
        grace_period: seconds between SIGTERM and SIGKILL in :meth:`stop_all`.
        master_addr: ``MASTER_ADDR`` for the workers.
        master_port: ``MASTER_PORT``; 0 picks a free port at each :meth:`start_all`.
        env: extra environment on top of ``os.environ`` (the variables above win).
        cwd: the workers' working directory.
        record: where the live process groups are recorded for the next start to reap (none
            when None); its :meth:`~WorkerRecord.env` joins the workers' environment.
        queue_bytes: output bytes queued for :meth:`poll` before the readers wait (backpressure).

    Raises:
        ValueError: an empty command or ``nproc < 1``.
    """

    def __init__(self, command: Sequence[str], nproc: int, *, job: str = "local", node: str | None = None,
                 grace_period: float = 10.0, master_addr: str = "127.0.0.1", master_port: int = 0,
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 record: WorkerRecord | None = None, queue_bytes: int = MAX_BYTES):
        if not command:
            raise ValueError("empty command")
        if nproc < 1:
            raise ValueError(f"nproc must be >= 1, got {nproc}")
        self.command, self.nproc, self.job, self.node = list(command), nproc, job, node or socket.gethostname()
        self.grace_period, self.env, self.cwd = grace_period, dict(env or {}), cwd
        self.record = record
        self.master_addr, self.master_port, self._fixed_port = master_addr, master_port, master_port
        self.restart_count = 0
        # this machine's part of a multi-node job (place); one node: all zero / nproc
        self.group_rank, self.group_world_size, self.rank_offset, self.world_size = 0, 1, 0, 0
        self._queue = OutputQueue(queue_bytes)    # bounded: backpressure on the workers' pipes
        self._workers: dict[int, Worker] = {}
        self._old: list[Worker] = []          # replaced workers not yet reaped
        self._schedule_cnt = 1
        self._proc_starts = [0] * nproc        # MA_PROC_START_CNT per rank
        self._starts = [0] * nproc             # FTWATCH_ATTEMPT per rank
        self._lock = threading.Lock()          # worker table and reaping; never held while waiting
        self._op_lock = threading.RLock()      # one public operation at a time
        self._op_thread: int | None = None     # the thread inside an operation
        self._pending: str | None = None       # "stop" / "close" asked for by a signal handler
        self._hurry = threading.Event()        # skip the rest of the grace period
        self._stopping = self._closed = False
        self._groups: dict[int, int | None] = {}   # unreaped process groups -> leader start ticks
        self._finalizer = weakref.finalize(self, kill_groups, self._groups)

    def start_all(self, restart_count: int, *, reschedule: bool = False) -> None:
        """Start all N workers (a fresh ``MASTER_PORT`` when it is 0).

        Args:
            restart_count: job restarts so far (``TORCHELASTIC_RESTART_COUNT``).
            reschedule: model a ModelArts rescheduling: ``MA_SCHEDULE_CNT`` + 1 and every
                ``MA_PROC_START_CNT`` back to 1 (see the module docstring).

        Raises:
            RuntimeError: a worker is still running (call :meth:`stop_all` first) or closed.
            SourceError: a worker could not be started (the others are stopped again).
        """
        with self._operation():
            if self._closed:
                raise RuntimeError("supervisor is closed")
            if self.running():
                raise RuntimeError(f"workers still running: {sorted(self.running())}; stop_all first")
            for w in list(self._workers.values()):
                self._retire(w)
            self._workers.clear()
            self.restart_count = restart_count
            if reschedule:
                self._schedule_cnt += 1
                self._proc_starts = [0] * self.nproc
            self.master_port = self._fixed_port or _free_port(self.master_addr, avoid=self.master_port)
            try:
                for rank in range(self.nproc):
                    self._spawn(rank)
            except OSError as exc:
                self._stop(0.0)
                raise SourceError(f"cannot start worker: {' '.join(self.command)}: {exc}") from exc

    def place(self, *, group_rank: int, group_world_size: int, rank_offset: int, world_size: int,
              master_addr: str, master_port: int) -> None:
        """This machine's part of a multi-node job for the next :meth:`start_all`
        (``ftwatch.pipeline.cluster``): local rank r is global rank ``rank_offset + r`` of
        ``world_size``; ``GROUP_RANK`` is this node's index among ``group_world_size`` nodes; the
        workers meet at ``master_addr:master_port`` (0: a free local port, as for one node)."""
        with self._operation():
            self.group_rank, self.group_world_size = group_rank, group_world_size
            self.rank_offset, self.world_size = rank_offset, world_size
            self.master_addr, self._fixed_port = master_addr, master_port

    def resize(self, nproc: int, env: Mapping[str, str]) -> None:
        """Set the worker count and add ``env`` for the next :meth:`start_all` (elastic restarts
        with fewer workers, visible devices). Raises ValueError (nproc < 1), RuntimeError (running)."""
        with self._operation():
            if nproc < 1 or self.running():
                raise (ValueError if nproc < 1 else RuntimeError)(f"cannot resize to {nproc} now")
            grow = max(0, nproc - len(self._starts))
            self.nproc, self._starts, self._proc_starts = nproc, self._starts + [0] * grow, self._proc_starts + [0] * grow
            self.env.update(env)

    def restart_instance(self, rank: int) -> None:
        """Start one worker again (Async mode); the others keep running.

        ``MA_PROC_START_CNT`` and ``FTWATCH_ATTEMPT`` go up by one for this rank only; the job's
        ``MASTER_PORT`` and ``TORCHELASTIC_RESTART_COUNT`` stay.

        Raises:
            ValueError: no such rank. RuntimeError: it is still running, or closed.
            SourceError: it could not be started.
        """
        with self._operation():
            if self._closed:
                raise RuntimeError("supervisor is closed")
            if not 0 <= rank < self.nproc:
                raise ValueError(f"no rank {rank} (nproc {self.nproc})")
            old = self._workers.get(rank)
            if old is not None:
                if not old.exited.is_set():
                    raise RuntimeError(f"worker-{rank} is still running")
                self._retire(old)
            try:
                self._spawn(rank)
            except OSError as exc:
                raise SourceError(f"cannot restart worker-{rank}: {exc}") from exc

    def stop_all(self, grace: float | None = None) -> list[ProcessExit]:
        """Stop every worker: SIGTERM and SIGCONT to each group, ``grace`` seconds, then SIGKILL.

        A SIGSTOPped worker is continued so that it can take the SIGTERM. Leftover processes of
        workers that exited earlier are stopped too, and every main process is reaped.

        Args:
            grace: seconds before SIGKILL; ``grace_period`` when None.

        Returns:
            The ProcessExit (``stopped_by_us=True``) of each worker this call stopped, in rank order;
            not those that ended on their own before, nor one still not dead ``DONE_TIMEOUT`` s after
            SIGKILL (stuck in the kernel). :meth:`poll` delivers the same objects, once each, after
            the worker's output: consumers that feed rules take exits from :meth:`poll` only and
            use this list just to know the outcome (no duplicates that way).
        """
        if self._reentered("stop"):
            return []
        with self._operation():
            return self._stop(self.grace_period if grace is None else grace)

    def poll(self, timeout: float) -> list[Output | Started | ProcessExit]:
        """Everything that happened since the last call, in order per instance.

        Blocks up to ``timeout`` seconds for the first event (or until :meth:`wake`), then takes
        what else is queued (at most 4096 events); the Outputs of one stream come merged into one
        (``outqueue.coalesce``). Returns [] on timeout.
        """
        return coalesce(self._queue.take(timeout))

    def wake(self) -> None:
        """End the :meth:`poll` waiting now (or the next one) at once: something else needs the
        loop (a request on the SDK's control socket). Not from a signal handler."""
        self._queue.wake()

    def lag(self) -> tuple[int, float]:
        """(output bytes waiting for :meth:`poll`, seconds the oldest waiting item has waited)."""
        return self._queue.lag()

    def running(self) -> set[int]:
        """The ranks whose main process is alive (a stopped, i.e. SIGSTOPped, one counts)."""
        return {r for r, w in list(self._workers.items()) if not w.exited.is_set()}

    def wait_reported(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every worker whose main process ended has its
        ProcessExit queued (its waiter queues it after the last of its output, so a worker can
        be gone from :meth:`running` a moment before :meth:`poll` can take its exit). Returns
        True when none is left unreported."""
        deadline = time.monotonic() + timeout
        for w in list(self._workers.values()):
            if w.exited.is_set() and not w.done.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to every worker's process group (live or with leftovers)."""
        with self._lock:
            for w in self._all():
                killpg(w, sig)

    def close(self) -> None:
        """SIGKILL whatever is left, reap it, and refuse further starts. Idempotent."""
        if self._reentered("close"):
            return
        with self._operation():
            self._close()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _reentered(self, what: str) -> bool:
        """True when called from a signal handler that interrupted one of our operations.

        The operation then carries out ``what`` before it returns; a stop asked for while a stop
        is under way also ends that stop's grace period at once.
        """
        if self._op_thread != threading.get_ident():
            return False
        if what == "close" or self._pending is None:
            self._pending = what
        if self._stopping or what == "close":
            self._hurry.set()
        return True

    @contextlib.contextmanager
    def _operation(self) -> Iterator[None]:
        """One public operation at a time; afterwards, run a stop/close a signal handler asked for."""
        with self._op_lock:
            outer, self._op_thread = self._op_thread, threading.get_ident()
            try:
                yield
            finally:
                try:
                    while self._pending is not None:
                        what, self._pending = self._pending, None
                        if what == "close":
                            self._close()
                        else:
                            self._stop(self.grace_period)
                finally:
                    self._op_thread = outer

    def _spawn(self, rank: int) -> None:
        env = {**os.environ, **self.env, **{
            "RANK": str(self.rank_offset + rank), "LOCAL_RANK": str(rank), "GROUP_RANK": str(self.group_rank),
            "ROLE_RANK": str(self.rank_offset + rank), "WORLD_SIZE": str(self.world_size or self.nproc),
            "LOCAL_WORLD_SIZE": str(self.nproc), "ROLE_WORLD_SIZE": str(self.world_size or self.nproc),
            "GROUP_WORLD_SIZE": str(self.group_world_size), "ROLE_NAME": "default",
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "PYTHONUNBUFFERED": "1", "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
            "TORCHELASTIC_RUN_ID": self.job,
            "MA_SCHEDULE_CNT": str(self._schedule_cnt), "MA_PROC_START_CNT": str(self._proc_starts[rank] + 1),
            "FTWATCH_ATTEMPT": str(self._starts[rank] + 1), "FTWATCH_JOB": self.job,
            "FTWATCH_INSTANCE": f"worker-{rank}", **(self.record.env() if self.record else {})}}
        popen = launch(self.command, env, self.cwd)
        self._proc_starts[rank] += 1
        self._starts[rank] += 1
        # the Origin's rank is the global one (a multi-node job's ranks start at rank_offset here);
        # the instance keeps the local index, which restart_instance and the slots are keyed by
        origin = Origin(f"worker-{rank}", self.rank_offset + rank, self.job, self.node, "process", "process")
        w = Worker(rank, popen, origin)
        with self._lock:
            self._workers[rank] = w
            self._groups[popen.pid] = process_start(popen.pid)
            self._write_record()
        self._queue.put(Started(origin, popen.pid, time.time(), self._starts[rank]))
        start_io(w, self._queue, self._lock)       # readers, and the waiter: the exit after the output

    def _all(self) -> list[Worker]:   # every worker whose group may still need a signal
        return [w for w in [*self._old, *self._workers.values()] if not w.reaped]

    def _stop(self, grace: float, term: bool = True) -> list[ProcessExit]:
        """Stop every group: SIGTERM + SIGCONT (``term``), ``grace`` s, SIGKILL; reap; the exits.
        Marked as stopping before the first signal: a worker may answer its SIGTERM at once (a
        signal to us whose handler stops again), and that second stop must cut this one's grace
        short (``_reentered``), not find no stop under way and wait it out."""
        self._stopping = True
        try:
            with self._lock:
                targets = [w for w in self._all() if not w.exited.is_set()]
                for w in targets:
                    w.stop_requested = True
                everyone = self._all()
                for w in everyone if term else ():
                    killpg(w, signal.SIGTERM)
                    killpg(w, signal.SIGCONT)
        except BaseException:
            self._stopping = False
            raise
        with self._queue.unbounded():      # the loop waits here, it takes no output: no reader may wait
            return self._stop_unbounded(grace, term, targets, everyone)

    def _stop_unbounded(self, grace: float, term: bool, targets: list[Worker],
                        everyone: list[Worker]) -> list[ProcessExit]:
        try:
            deadline = time.monotonic() + max(0.0, grace)
            for w in targets if term else ():
                while not (self._hurry.is_set() or time.monotonic() >= deadline
                           or w.exited.wait(min(0.05, max(0.0, deadline - time.monotonic())))):
                    pass
        finally:
            self._stopping = False
            self._hurry.clear()
        with self._lock:
            for w in everyone:
                killpg(w, signal.SIGKILL)
        deadline = time.monotonic() + DONE_TIMEOUT + EXIT_LINGER
        for w in everyone:
            w.done.wait(max(0.0, deadline - time.monotonic()))
        for w in everyone:
            if w.done.is_set():
                self._reap(w)
        return [w.exit for w in sorted(targets, key=lambda w: w.rank) if w.exit is not None]

    def _retire(self, w: Worker) -> None:
        """Clean up an exited worker before its rank is started again: kill leftovers, reap."""
        w.done.wait(DONE_TIMEOUT + EXIT_LINGER)
        with self._lock:
            killpg(w, signal.SIGKILL)
        if w.done.is_set():
            self._reap(w)
        else:                                   # stuck in the kernel: reap it later
            self._old.append(w)

    def _reap(self, w: Worker) -> None:
        with self._lock:
            if w.reaped or not w.exited.is_set():
                return
            killpg(w, signal.SIGKILL)          # the zombie still holds the group id
            try:
                w.popen.wait(timeout=1.0)
            except (subprocess.TimeoutExpired, ChildProcessError):
                pass
            w.reaped = True
            self._groups.pop(w.popen.pid, None)
            self._write_record()
            if w in self._old:
                self._old.remove(w)

    def _close(self) -> None:
        if self._closed:
            return
        self._stop(0.0, term=False)
        self._closed = True
        self._finalizer()
        if self.record is not None:
            self.record.remove()

    def _write_record(self) -> None:     # with the lock
        if self.record is not None:
            self.record.write(self._groups)


def _free_port(addr: str, avoid: int = 0) -> int:
    """A TCP port that is free on ``addr`` now (bind port 0, read it, release it), not ``avoid``."""
    for _ in range(16):
        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
        if port != avoid:
            return port
    return port
