"""Progress after errors found in a chunk is read from shortly before them (issue 16): the engine
says where a finding's line starts in the chunk it just fed (``Engine.position``), and the survival
reader (``ftwatch.policy.progress.Survival.outlived``) reads that chunk from ``LOOKBACK`` bytes
before the first waiting error's line, not from its start."""

from __future__ import annotations

import io
from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Origin
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.policy import progress
from ftwatch.testing import T0, CaptureSink, FakeClock

JOB = "lookback-test"
REFUSED = (b"Traceback (most recent call last):\n"
           b"  File \"/opt/conda/lib/python3.10/site-packages/urllib3/connection.py\", line 174, in _new_conn\n"
           b"ConnectionRefusedError: [Errno 111] Connection refused\n")
ALIVE = b"Could not connect to the plotting server, going on without it\n"
WORKER = Origin("worker-1", 1, JOB, "node-a", "stderr", "process")


def desk(tmp_path: Path) -> IncidentDesk:
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}}).with_policy(enable_job_restart=True)
    d = IncidentDesk(JOB, build_engine(config), build_policy(config, JOB), Recorder(CaptureSink(), out=io.StringIO(),
                     resolve_after=None), exits=False, settle=5.0, summaries="live")
    d.new_attempt(T0)
    return d


def steps(first: int, last: int) -> bytes:
    return b"".join(f"epoch 3 step {n} loss 0.{n % 1000:03d}\n".encode() for n in range(first, last + 1))


def chunk(after: bytes) -> tuple[bytes, int]:
    """Step lines well past ``LOOKBACK``, the error, then ``after``; and where the error starts."""
    head = steps(1, 6000)
    assert len(head) > 2 * progress.LOOKBACK
    return head + REFUSED + ALIVE + after, len(head)


def test_the_engine_says_where_the_findings_of_the_chunk_it_just_fed_start(tmp_path):
    d = desk(tmp_path)
    data, at = chunk(b"")
    found = d.engine.feed(WORKER, data, T0)
    assert [d.engine.position(f, data) for f in found] == [at]
    assert d.engine.position(found[0], data[:-1] + data[-1:]) is None   # another chunk (an equal copy)
    d.engine.feed(WORKER, b"nothing\n", T0)
    assert d.engine.position(found[0], data) is None                  # not the last chunk fed
    colored = b"\x1b[31m" + data
    assert all(d.engine.position(f, colored) is None for f in d.engine.feed(WORKER, colored, T0))


def refused(d: IncidentDesk) -> list:
    return [f for f in d.findings if f.rule_id == "python.exception.ECONNREFUSED"]


def test_an_error_deep_in_a_chunk_is_outlived_by_its_progress_after_it(tmp_path):
    d = desk(tmp_path)
    data, _ = chunk(steps(6001, 6002))
    d.output(WORKER, data, T0, sim_step=0.001)       # (a replayed chunk: its lines 1 ms apart)
    assert len(refused(d)) == 1 and d.notices == refused(d)


def test_counters_that_go_back_after_an_error_deep_in_a_chunk_are_still_a_restart(tmp_path):
    # its counters before it come from the lines just before it, inside the window read
    d = desk(tmp_path)
    data, _ = chunk(steps(1, 2))
    d.output(WORKER, data, T0, sim_step=0.001)
    assert len(refused(d)) == 1 and d.notices == []


def spy_reading(monkeypatch) -> list[tuple[int, list[int]]]:
    """The survival reader's readings of a chunk (those with ``defer``): where each began, its lines' starts."""
    readings: list[tuple[int, list[int]]] = []
    marks = progress._marks

    def spy(data, clock, ranks, defer, begin):
        starts: list[int] = []
        if defer is not None:
            readings.append((begin, starts))
        for mark in marks(data, clock, ranks, defer, begin):
            starts.append(mark[3])
            yield mark
    monkeypatch.setattr(progress, "_marks", spy)
    return readings


def test_the_lines_far_before_the_errors_of_a_chunk_are_not_read(tmp_path, monkeypatch):
    readings = spy_reading(monkeypatch)
    d = desk(tmp_path)
    data, at = chunk(steps(6001, 6002))
    d.output(WORKER, data, T0, sim_step=0.001)
    assert len(readings) == 1
    begin, starts = readings[0]
    assert at - progress.LOOKBACK - 64 <= begin <= at - progress.LOOKBACK and min(starts) >= begin
    assert max(starts) > at and d.notices == refused(d)


def test_an_error_waiting_from_an_earlier_chunk_reads_the_next_chunk_from_its_start(tmp_path, monkeypatch):
    clock = FakeClock(T0)
    d = desk(tmp_path)
    d.output(WORKER, steps(1, 10) + REFUSED + ALIVE, clock.time(), clock.mono())
    assert len(refused(d)) == 1 and d.notices == []
    readings = spy_reading(monkeypatch)
    clock.advance(1.0)
    d.output(WORKER, steps(11, 12), clock.time(), clock.mono())
    assert [begin for begin, _ in readings] == [0] and d.notices == refused(d)
