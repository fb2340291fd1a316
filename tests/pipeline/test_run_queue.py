"""The queue between the workers' readers and ``ftwatch run``'s loop stays small (issue 16 item 4):
bounded in bytes, a full queue blocks the reader (the worker's pipe fills: backpressure), the lag
is a metric, a stop never waits on it, and chunks of one stream are merged. Threads are waited for
through events, never by sleeping; the queue's age runs on a clock the test moves.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from prometheus_client import generate_latest

from ftwatch.events import Origin, ProcessExit
from ftwatch.pipeline.sources.outqueue import OutputQueue, coalesce
from ftwatch.pipeline.sources.process import LINGER, Output, Started, next_tick, read_lines, start_readers
from ftwatch.pipeline.sources.process import _hangup as process_hangup
from ftwatch.pipeline.sources.supervisor import Supervisor
from ftwatch.telemetry import Metrics

W0 = Origin("worker-0", 0, "job", "n1", "stdout", "process")
W0_ERR = Origin("worker-0", 0, "job", "n1", "stderr", "process")
W1 = Origin("worker-1", 1, "job", "n1", "stdout", "process")
LINE = b"x" * 99 + b"\n"          # 100 bytes


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def metric(m: Metrics, name: str) -> float:
    for line in generate_latest(m.registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def test_a_full_queue_blocks_the_reader_and_the_lag_metric_reports_it():
    """A 1 KiB queue: the reader of a pipe that got 200 KB waits once it is full; the metrics show
    the bytes waiting and the age of the oldest; taking them lets the reader go on to the end."""
    clock = Clock()
    q = OutputQueue(1024, clock=clock)
    m = Metrics()
    m.watch_lag(q.lag)
    assert metric(m, "ftwatch_run_queue_bytes") == 0 and metric(m, "ftwatch_run_queue_age_seconds") == 0
    r, w = os.pipe()
    reader = threading.Thread(target=read_lines, args=(os.fdopen(r, "rb"), W0, q), daemon=True)
    reader.start()
    total = LINE * 2000                   # 200,000 bytes: more than one read
    writer = threading.Thread(target=lambda: (os.write(w, total), os.close(w)), daemon=True)
    writer.start()
    assert q.waiting.wait(10), "the reader never had to wait"
    assert reader.is_alive() and q.blocked >= 1 and q.full()
    clock.now += 3.5
    queued, age = q.lag()
    assert 0 < queued <= 1024 + 65536 and age == 3.5
    assert metric(m, "ftwatch_run_queue_bytes") == queued and metric(m, "ftwatch_run_queue_age_seconds") == 3.5
    got = []
    while reader.is_alive() or len(q):
        got += q.take(1.0)
    reader.join(10)
    assert b"".join(o.data for o in got) == total          # nothing lost, in order
    assert q.lag() == (0, 0.0) and metric(m, "ftwatch_run_queue_bytes") == 0


def test_events_without_bytes_never_block_and_a_stop_lets_a_waiting_reader_through():
    q = OutputQueue(100)
    q.put(Output(W0, LINE, 1.0))
    q.put(Started(W1, 42, 1.0, 1))                         # a start: no bytes, never waits
    done = threading.Event()
    t = threading.Thread(target=lambda: (q.put(Output(W0, LINE, 2.0)), done.set()), daemon=True)
    t.start()
    assert q.waiting.wait(10) and not done.is_set()
    with q.unbounded():                                     # a stop under way: the loop takes nothing
        assert done.wait(10)
        q.put(Output(W1, LINE * 5, 3.0))                    # nor does anything block meanwhile
    assert len(q.take(0)) == 4


def test_take_waits_for_the_first_item_and_wake_ends_the_wait():
    q = OutputQueue()
    woke = threading.Event()
    got: list = []
    t = threading.Thread(target=lambda: (got.append(q.take(30.0)), woke.set()), daemon=True)
    t.start()
    q.wake()
    assert woke.wait(10) and got == [[]]
    q.put(Output(W0, LINE, 1.0))
    assert q.take(30.0) == [Output(W0, LINE, 1.0)]


def test_one_big_output_goes_into_an_empty_queue():
    q = OutputQueue(10)
    q.put(Output(W0, LINE * 3, 1.0))                        # over the bound, but alone: taken
    assert q.lag()[0] == 300 and q.full()


def test_coalesce_merges_each_streams_chunks_without_moving_them_across_a_start_or_exit():
    exit0 = ProcessExit(Origin("worker-0", 0, "job", "n1", "process", "process"), 7, 1, None, 5.0)
    items = [Output(W0, b"a\n", 1.0), Output(W1, b"b\n", 1.1), Output(W0, b"c\n", 1.2), Output(W0_ERR, b"e\n", 1.3),
             Output(W0, b"d\n", 1.4), exit0, Output(W1, b"f\n", 1.5), Output(W0, b"late\n", 1.6)]
    out = coalesce(items)
    assert out == [Output(W0, b"a\nc\nd\n", 1.0), Output(W1, b"b\nf\n", 1.1), Output(W0_ERR, b"e\n", 1.3), exit0,
                   Output(W0, b"late\n", 1.6)]
    assert coalesce([]) == [] and coalesce(items[:1]) == items[:1]


def test_a_busy_stream_is_handed_over_in_chunks_not_a_line_per_read():
    """400 lines written one write(2) each, faster than LINGER apart: a handful of hand-overs."""
    q = OutputQueue()
    r, w = os.pipe()
    threads = start_readers({"stdout": os.fdopen(r, "rb")}, W0, q)
    end = time.monotonic() + 20 * LINGER
    n = 0
    while time.monotonic() < end or n < 400:
        os.write(w, LINE)
        n += 1
    os.close(w)
    threads[0].join(10)
    assert threads[0].eof.is_set()
    got = q.take(0)
    assert b"".join(o.data for o in got) == LINE * n
    assert len(got) <= 30 < n


def test_next_tick_is_the_grids_next_multiple_of_the_linger():
    for now in (0.0, 0.01, LINGER, 7 * LINGER + 0.001, 12345.678):
        tick = next_tick(now)
        assert now < tick <= now + LINGER + 1e-9
        assert abs(tick / LINGER - round(tick / LINGER)) < 1e-6


def test_busy_streams_hand_over_together_on_the_grids_ticks(monkeypatch):
    """Two busy streams (two workers' stdout) hand over on the same ticks, the multiples of the
    linger on the monotonic clock, not each on its own clock: the loop takes them in one wake."""
    from ftwatch.pipeline.sources import process
    monkeypatch.setattr(process, "LINGER", 0.25)
    puts: list[tuple[float, Origin]] = []

    class Timed(OutputQueue):
        def put(self, item, nbytes=None):
            puts.append((time.monotonic(), item.origin))
            super().put(item, nbytes)
    q = Timed()
    pipes = [os.pipe(), os.pipe()]
    origins = [W0, Origin("worker-1", 1, "job", "n1", "stdout", "process")]
    threads = [t for (r, _), o in zip(pipes, origins) for t in start_readers({"stdout": os.fdopen(r, "rb")}, o, q)]
    time.sleep((0.125 - time.monotonic()) % 0.25)      # start between two ticks: each stream's own clock
    end = time.monotonic() + 6 * 0.25                  # would hand over between them
    while time.monotonic() < end:
        for _, w in pipes:
            os.write(w, LINE)
        time.sleep(0.002)
    for _, w in pipes:
        os.close(w)
    for t in threads:
        t.join(10)
    for origin in origins:                   # after each stream's first (at once) and before its last (the close)
        phases = sorted(at % 0.25 for at, o in [p for p in puts if p[1] == origin][1:-1])
        assert len(phases) >= 3
        assert phases[len(phases) // 2] < 0.25 / 4, phases      # most just after a tick


def test_a_busy_streams_last_words_are_not_held_for_the_linger_when_the_pipe_closes(monkeypatch):
    """The linger waits on the pipe's hang-up: with a 60 s linger, a line written right after a
    hand-over and the writer's close still reach the queue (and EOF) at once, not 60 s later."""
    from ftwatch.pipeline.sources import process
    monkeypatch.setattr(process, "next_tick", lambda now: now + 60.0)    # a 60 s linger from each hand-over
    q = OutputQueue()
    r, w = os.pipe()
    eof = threading.Event()
    reader = threading.Thread(target=read_lines, args=(os.fdopen(r, "rb"), W0, q, eof), daemon=True)
    reader.start()
    os.write(w, LINE)
    assert [o.data for o in q.take(30.0)] == [LINE]      # the first line: at once
    os.write(w, b"FATAL\n")                 # within the linger: waits for it ...
    os.close(w)                              # ... until the worker's exit closes its pipe
    assert eof.wait(30), "the linger held the last words back"
    reader.join(30)
    assert [o.data for o in q.take(0)] == [b"FATAL\n"]


def test_lines_that_waited_through_a_linger_are_dated_when_it_began(monkeypatch):
    """A step line written on a busy standard output just before the error on standard error is
    read after the error (its stream lingers); it is dated at the linger's start, before the
    error's read, so a reading by time keeps the order they were written in (recorded on an
    H200: tools/gpu_capture.sh cuda_oom). A line that came after the linger is dated when read."""
    from ftwatch.pipeline.sources import process
    monkeypatch.setattr(process, "next_tick", lambda now: now + 60.0)    # a 60 s linger from each hand-over
    q = OutputQueue()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    threads = start_readers({"stdout": os.fdopen(out_r, "rb"), "stderr": os.fdopen(err_r, "rb")}, W0, q)
    os.write(out_w, b"step 1\n")
    [first] = q.take(30.0)                          # handed over at once; the stream now lingers
    os.write(out_w, b"step 2\n")
    os.write(err_w, b"RuntimeError: CUDA error: out of memory\n")
    [error] = q.take(30.0)                          # the quiet stream's line: at once
    assert error.data.startswith(b"RuntimeError") and first.time <= error.time
    os.close(out_w)                                 # the exit ends the linger: step 2 comes now
    os.close(err_w)
    for t in threads:
        t.join(30)
    [step2] = q.take(0)
    assert step2.data == b"step 2\n" and first.time <= step2.time <= error.time

    r, w = os.pipe()                                # a linger that ran out with nothing waiting:
    try:                                            # the next line is dated when read
        ready = process._ready(r)
        assert not ready()
        os.write(w, b"step 3\n")
        assert ready()
    finally:
        os.close(r)
        os.close(w)


def test_the_linger_ends_on_a_hang_up_not_on_waiting_data():
    r, w = os.pipe()
    try:
        os.write(w, LINE)
        wait = process_hangup(r)
        assert not wait(0.01)                # data waiting: the full linger (nothing reported)
        os.close(w)
        w = -1
        assert wait(60.0)                    # every writer closed: at once
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_a_worker_whose_output_waits_for_room_is_delivered_whole_before_its_exit(monkeypatch):
    """A 4 KiB queue and a worker that writes 256 KiB and exits while the loop takes nothing: its
    reader waits for room with the rest in the pipe. That is not a leftover holding the pipe (no
    SIGKILL), and its exit still comes after all of its output."""
    from ftwatch.pipeline.sources import worker as module   # the waiter (worker.wait_exit) kills leftovers
    kills = []
    real = module.killpg
    monkeypatch.setattr(module, "killpg", lambda w, sig: (kills.append(sig), real(w, sig)))
    line = b"y" * 1023 + b"\n"
    code = "import os\nfor _ in range(256): os.write(1, b'y' * 1023 + b'\\n')\n"
    sup = Supervisor([sys.executable, "-c", code], 1, job="job", queue_bytes=4096)
    try:
        sup.start_all(0)
        assert sup._workers[0].exited.wait(30)             # it exited; nothing was taken yet
        assert sup._queue.waiting.wait(30)                  # its reader waits for room
        assert sup.lag()[0] > 0 and sup._queue.blocked >= 1
        events: list = []
        end = time.monotonic() + 30
        while not any(isinstance(e, ProcessExit) for e in events):
            assert time.monotonic() < end, "no exit"
            events += sup.poll(0.5)
        assert 9 not in kills
        exit = events[-1]
        assert isinstance(exit, ProcessExit) and exit.returncode == 0 and exit.signal is None
        assert b"".join(e.data for e in events if isinstance(e, Output)) == line * 256
    finally:
        sup.close()
