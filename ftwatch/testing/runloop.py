"""The run loop's doubles: scripted workers on a FakeClock and a control socket without a socket.

:class:`FakeSupervisor` plays ``ftwatch.pipeline.sources.supervisor.Supervisor`` from a script
(:class:`Say`, :class:`Exit`, :func:`script_of`): ``poll`` moves the clock to the next scripted item
as the real one would block; :class:`FakeControl` plays the SDK's control server with scripted
subscribers and their answers. Drive ``ftwatch run``'s loop with them through
``ftwatch.pipeline.build.build_run(..., clock=, supervisor=, control=)``. Re-exported by
``ftwatch.testing``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ftwatch.clock import FakeClock
from ftwatch.events import Origin, ProcessExit
from ftwatch.pipeline.sources.process import Output, Started


# --------------------------------------------------------------------------- the run loop's workers

_SIGTERM = 15   # the signal FakeSupervisor.stop_all reports


@dataclass(frozen=True)
class Say:
    """A worker writes ``text`` (one or more lines) ``at`` seconds after its start."""

    at: float
    text: str
    stream: str = "stdout"


@dataclass(frozen=True)
class Exit:
    """A worker's main process ends by itself ``at`` seconds after its start."""

    at: float
    returncode: int | None = 0
    signal: int | None = None


#: (rank, start count of that rank, 1-based) -> what that start of the worker does, in order. A
#: start without an :class:`Exit` runs until it is stopped (a hang, or a survivor).
Script = Callable[[int, int], Sequence["Say | Exit"]]


def script_of(table: Mapping[tuple[int, int], Sequence[Say | Exit]], default: Sequence[Say | Exit] = ()) -> Script:
    """A script from ``{(rank, start): [...]}``; a start not in the table does ``default``."""
    return lambda rank, start: table.get((rank, start), default)


class FakeSupervisor:
    """Scripted workers on a FakeClock, with the real ``Supervisor``'s surface.

    Args:
        clock: the FakeClock the run loop reads too.
        script: what each start of each rank does (:data:`Script`).
        nproc: workers until the first ``resize``.
        job, node: in every Origin.
    """

    master_addr = "127.0.0.1"
    master_port = 29500

    def __init__(self, clock: FakeClock, script: Script, nproc: int = 1, *, job: str = "job", node: str = "n1"):
        self.clock, self.script, self.nproc, self.job, self.node = clock, script, nproc, job, node
        self.calls: list[tuple[Any, ...]] = []
        self.env: dict[str, str] = {}
        self._queue: list[tuple[float, int, Any]] = []     # (time, order, item) not yet polled
        self._order = itertools.count()
        self._ends: dict[int, float | None] = {}            # live rank -> when it ends by itself (None: never)
        self._pids: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        self._pid = itertools.count(1000)

    # -- the Supervisor's surface -------------------------------------------------------------------

    def resize(self, nproc: int, env: Mapping[str, str]) -> None:
        if nproc < 1 or self.running():
            raise (ValueError if nproc < 1 else RuntimeError)(f"cannot resize to {nproc} now")
        self.calls.append(("resize", nproc, dict(env)))
        self.nproc = nproc
        self.env.update(env)

    def start_all(self, restart_count: int, *, reschedule: bool = False) -> None:
        if self.running():
            raise RuntimeError(f"workers still running: {sorted(self.running())}; stop_all first")
        self.calls.append(("start_all", restart_count, reschedule))
        for rank in range(self.nproc):
            self._spawn(rank)

    def restart_instance(self, rank: int) -> None:
        if not 0 <= rank < self.nproc:
            raise ValueError(f"no rank {rank} (nproc {self.nproc})")
        if rank in self.running():
            raise RuntimeError(f"worker-{rank} is still running")
        self.calls.append(("restart_instance", rank))
        self._spawn(rank)

    def stop_all(self, grace: float | None = None) -> list[ProcessExit]:
        self.calls.append(("stop_all",))
        now = self.clock.time()
        exits = []
        for rank in sorted(self.running()):
            self._drop_future(rank, now)
            exit = ProcessExit(self._origin(rank), self._pids[rank], None, _SIGTERM, now, stopped_by_us=True)
            self._put(now, exit)
            exits.append(exit)
            self._ends[rank] = now
        return exits

    def poll(self, timeout: float) -> list[Output | Started | ProcessExit]:
        """What happened up to now; when nothing has, the clock moves to the next scripted item,
        at most ``timeout`` seconds (as the real one blocks), and that is returned."""
        now = self.clock.time()
        if not any(t <= now for t, _, _ in self._queue):
            nxt = min((t for t, _, _ in self._queue), default=None)
            self.clock.advance(max(0.0, timeout) if nxt is None or nxt > now + timeout else nxt - now)
            now = self.clock.time()
        due = sorted(q for q in self._queue if q[0] <= now)
        self._queue = [q for q in self._queue if q[0] > now]
        return [item for _, _, item in due]

    def running(self) -> set[int]:
        now = self.clock.time()
        return {r for r, end in self._ends.items() if end is None or end > now}

    def wait_reported(self, timeout: float) -> bool:
        """A scripted exit is queued the moment its worker ends: nothing to wait for."""
        return True

    def close(self) -> None:
        self.calls.append(("close",))

    # -- what the tests read ------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The calls' names in order (``start_all``, ``stop_all`` ...)."""
        return [c[0] for c in self.calls]

    # -- scripted workers ---------------------------------------------------------------------------

    def _origin(self, rank: int, stream: str = "process") -> Origin:
        return Origin(f"worker-{rank}", rank, self.job, self.node, stream, "process")

    def _put(self, time: float, item: Any) -> None:
        self._queue.append((time, next(self._order), item))

    def _drop_future(self, rank: int, now: float) -> None:
        self._queue = [q for q in self._queue if not (q[0] > now and q[2].origin.rank == rank)]

    def _spawn(self, rank: int) -> None:
        now = self.clock.time()
        self._starts[rank] = self._starts.get(rank, 0) + 1
        pid = self._pids[rank] = next(self._pid)
        self._put(now, Started(self._origin(rank), pid, now, self._starts[rank]))
        steps = sorted(self.script(rank, self._starts[rank]), key=lambda s: (s.at, isinstance(s, Exit)))
        self._ends[rank] = None
        for step in steps:
            at = now + step.at
            if isinstance(step, Exit):
                self._put(at, ProcessExit(self._origin(rank), pid, step.returncode, step.signal, at))
                self._ends[rank] = at
                break
            data = step.text.encode() + (b"" if step.text.endswith("\n") else b"\n")
            self._put(at, Output(self._origin(rank, step.stream), data, at))


#: (kind, notice, instance) -> the SDK requests that instance sends back (``retry_done``, ``report_step`` ...).
Answers = Callable[[str, Mapping[str, Any], str], Sequence[dict[str, Any]]]


class _Subscribers:
    """``ControlServer.subscribers`` without connections: who subscribed to which notices."""

    def __init__(self, control: "FakeControl", subscribed: Mapping[str, set[str]]):
        self.control, self.subscribed = control, {k: set(v) for k, v in subscribed.items()}

    def instances(self, kind: str) -> set[str]:
        return set(self.subscribed.get(kind, ()))

    def notify(self, kind: str, body: Mapping[str, Any], to: set[str]) -> set[str]:
        reached = set(to) & self.instances(kind)
        self.control.notices.append((kind, dict(body), reached))
        for instance in sorted(reached):
            self.control.pending += list(self.control.answers_of(kind, body, instance))
        return reached


class FakeControl:
    """The SDK's control socket without a socket.

    Args:
        subscribed: kind (``retry``) -> the instances subscribed to its pushed notices (none by default).
        answers: what a subscribed instance sends back to a notice (:data:`Answers`), queued for
            the loop's next ``drain``.

    Attributes:
        notices: (kind, notice, instances reached) of every pushed notice.
        answers: the handler's answer to each request drained.
    """

    def __init__(self, subscribed: Mapping[str, set[str]] | None = None, answers: Answers | None = None) -> None:
        self.subscribers = _Subscribers(self, subscribed or {})
        self.answers_of: Answers = answers or (lambda kind, body, instance: [])
        self.notices: list[tuple[str, dict[str, Any], set[str]]] = []
        self.pending: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []
        self.started = self.stopped = False

    def start(self) -> "FakeControl":
        self.started = True
        return self

    def stop(self) -> None:
        self.stopped = True

    def env(self) -> dict[str, str]:
        return {}

    def send(self, message: dict[str, Any]) -> None:
        """Queue one SDK request (``{"op": "report_step", "step": 3, "instance": "worker-0"}`` ...)."""
        self.pending.append(message)

    def drain(self, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
        taken, self.pending = self.pending, []
        self.answers += [handle(m) for m in taken]
        return len(taken)
