"""Reading a worker process's output: stdout and stderr as batches of complete lines (SPEC S1).

One reader thread per stream ``os.read``\\ s the pipe and puts each batch of complete lines on the
caller's queue as an :class:`Output` as soon as a read returns them; a partial line is carried to
the next read, and flushed (with a ``b"\\n"`` added) at EOF or when it grows past ``MAX_LINE``.

Hand-overs of a busy stream are ``LINGER`` apart (issue 16 item 4): the monitor's cost is mostly
per hand-over (each wakes ``ftwatch run``'s loop and goes through the engine and the step tap as
one chunk: ~0.1 ms of Python for 100 lines in a tight loop, several times that between other
threads' work), so at 10,000 lines/s over 3 workers (``bench/bench_run.py``, 2 cores, 2026-11-27)
hand-overs 30 ms apart cost 5.5-6.5 % of a core, 60 ms apart 4.5-5 % and 80 ms apart 3.5-3.7 %.
They fall on the ticks of one grid, the multiples of ``LINGER`` on the monotonic clock, the same
for every stream (:func:`next_tick`): the busy streams of all workers hand over within a
millisecond of each other, so the loop takes most of them in one wake, and its work per wake (the
queue's wait, the kernel log, the alert spool, the timers) and the caches it warms are shared. Each
stream on its own clock, 3 workers at 10,000 lines/s woke the loop ~33 times a second and its
thread used 3.6-3.75 % of a core; on one grid ~25 times and 2.4-2.6 %, and the whole monitor
3.5-4.0 % against 5.0 % (same bench, medians of 5 trials, 2026-11-28). A line of a quiet stream
goes out at once (its read is the first since the last hand-over); one of a busy stream waits at
most ``LINGER`` (until the grid's next tick), less when its writers all close the pipe (a worker
that printed its last words and exited): the linger waits on the pipe's hang-up, not a plain sleep,
so those words are not held back. The 80 ms a busy rank's error line may wait is inside the
decision's goal (error line to decision within 100 ms plus the settle bound; the bench's "every
rank reports" case: p99 67 ms). So a busy stream's lines may be read up to ``LINGER`` after lines
another stream wrote later: on an H200, the step lines a trainer printed on standard output just
before a CUDA OOM were read after the traceback on standard error (``tools/gpu_capture.sh``
cuda_oom and nccl_init_oom, 2026-11-27). Lines that were waiting in the pipe when a linger ended
are therefore dated when the linger began (:attr:`Output.time`), the earliest they can have been
written, not when they were read: dated on read, those step lines came ~80 ms after the error and
read as progress after it. Where two streams' lines fall within one linger their order stays
unknown, and no reading may rely on it (progress read after a traceback that ended the program:
``progress.Survival.program_ended``).

:class:`Started` is the matching "a worker process was started" event. The supervisor
(``ftwatch.pipeline.sources.supervisor``) spawns the processes and calls :func:`start_readers`.
"""

from __future__ import annotations

import os
import queue
import select
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Callable

from ftwatch.events import Origin

READ_SIZE = 65536          # bytes per os.read
LINGER = 0.08              # seconds: a busy stream's hand-overs fall on a grid this far apart (module doc)
_MAX_POLL_MS = 2 ** 31 - 1  # poll(2)'s longest timeout (a C int of milliseconds)
MAX_LINE = 8 * 1024 * 1024  # a "line" longer than this (bytes) is handed over with a b"\n" added


@dataclass(frozen=True, slots=True)
class Output:
    """A batch of complete lines from one stream of one worker.

    Attributes:
        origin: instance ``worker-<rank>``, rank, job, node, stream ``stdout``/``stderr``, source ``process``.
        data: one or more complete lines as written (not decoded), each ending in ``b"\\n"`` (a final
            partial line at EOF, or a line longer than ``MAX_LINE`` bytes, gets one added); the last
            may instead end in a bare ``b"\\r"``: progress-bar updates, the bar not yet closed.
        time: epoch seconds when read; for lines that were already waiting when the reader's
            linger ended, when that linger began (see the module docstring).
    """
    origin: Origin
    data: bytes
    time: float


@dataclass(frozen=True, slots=True)
class Started:
    """A worker process was started.

    Attributes:
        origin: the instance (stream ``process``).
        pid: its process id (also its process-group id).
        time: epoch seconds.
        start_count: how often this instance has been started, 1-based (``FTWATCH_ATTEMPT``).
    """
    origin: Origin
    pid: int
    time: float
    start_count: int


def line_end(chunk: bytes) -> int:
    """The offset of the last line end in ``chunk``: its last ``b"\\n"``, or a later bare ``b"\\r"``
    (one not followed by ``b"\\n"``; never the chunk's last byte, whose ``b"\\n"`` may be in the next
    read); -1 when there is none."""
    nl = chunk.rfind(b"\n")
    cr = chunk.rfind(b"\r", nl + 1, len(chunk) - 1)
    return cr if cr >= 0 else nl


def start_readers(streams: dict[str, IO[bytes]], origin: Origin, out: queue.SimpleQueue) -> list[threading.Thread]:
    """Starts one daemon reader thread per stream of one process.

    Args:
        streams: {stream name (``stdout``/``stderr``): its pipe, read in binary}; each pipe is
            closed by its thread at EOF.
        origin: the process's instance; each stream's Outputs carry it with ``stream`` set to the name.
        out: where the :class:`Output` batches go.

    Returns:
        The started threads; each ends after the last Output of its stream is queued. Each has an
        ``eof`` attribute, a ``threading.Event`` set when its pipe reached EOF (what it read may
        still wait for room on ``out``).
    """
    threads = []
    for stream, pipe in streams.items():
        o = Origin(origin.instance, origin.rank, origin.job, origin.node, stream, "process")
        eof = threading.Event()
        t = threading.Thread(target=read_lines, args=(pipe, o, out, eof),
                             name=f"ftwatch-{stream}-{origin.rank}", daemon=True)
        t.eof = eof  # type: ignore[attr-defined]
        t.start()
        threads.append(t)
    return threads


def read_lines(pipe: IO[bytes], origin: Origin, out: "queue.SimpleQueue | Any",
               eof: threading.Event | None = None) -> None:
    """Reads ``pipe`` to EOF, putting complete lines as :class:`Output` batches; flushes the tail at EOF.

    A read error counts as EOF (``eof`` is set then). Never raises; closes ``pipe`` when done.
    """
    fd = pipe.fileno()
    carry: list[bytes] = []
    carried = 0
    due = 0.0                  # monotonic time of the next hand-over of a busy stream (0: at once)
    full = False               # the last read filled READ_SIZE: more is waiting, read on
    hangup, ready = _hangup(fd), _ready(fd)
    try:
        while True:
            wait = due - time.monotonic()
            since = None                # the linger's start, when lines waited through it
            if wait > 0 and not full:
                began = time.time()
                hangup(wait)
                if ready():
                    since = began
            try:
                chunk = os.read(fd, READ_SIZE)
            except OSError:
                chunk = b""
            if not chunk:
                break
            at = time.time() if since is None else since
            full = len(chunk) == READ_SIZE
            cut = line_end(chunk)
            if cut < 0:
                carry.append(chunk)
                carried += len(chunk)
                if carried > MAX_LINE:
                    out.put(Output(origin, b"".join(carry) + b"\n", at))
                    carry, carried = [], 0
                continue
            data = b"".join([*carry, chunk[:cut + 1]]) if carry else chunk[:cut + 1]
            out.put(Output(origin, data, at))
            due = next_tick(time.monotonic())
            rest = chunk[cut + 1:]
            carry, carried = ([rest], len(rest)) if rest else ([], 0)
        if eof is not None:
            eof.set()
        if carry:
            out.put(Output(origin, b"".join(carry) + b"\n", time.time()))
    finally:
        if eof is not None:
            eof.set()
        pipe.close()


def next_tick(now: float) -> float:
    """The grid's first tick after ``now`` (monotonic seconds): the next multiple of ``LINGER``,
    the same for every stream, so busy streams hand over together (module doc)."""
    return (now // LINGER + 1) * LINGER


def _ready(fd: int) -> Callable[[], bool]:
    """Whether pipe ``fd`` has data to read now (a poll that does not wait); always False where
    ``fd`` cannot be polled (lines are then dated when read)."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
    except (AttributeError, OSError, ValueError):
        return lambda: False
    return lambda: any(events & select.POLLIN for _, events in poller.poll(0))


def _hangup(fd: int) -> Callable[[float], object]:
    """The reader's linger: a wait of up to ``seconds`` that ends early once every writer of pipe
    ``fd`` has closed it (POLLHUP; data waiting does not end it). A plain sleep where ``fd``
    cannot be polled."""
    try:
        poller = select.poll()
        poller.register(fd, 0)          # no events asked for: only POLLHUP / POLLERR / POLLNVAL end it
    except (AttributeError, OSError, ValueError):
        return time.sleep
    return lambda seconds: poller.poll(min(_MAX_POLL_MS, max(1, int(seconds * 1000 + 0.999))))   # ms, rounded up
