"""The decisions file is a sink: decisions only, one JSON line each (README "Decisions")."""

from __future__ import annotations

import io
import json
import logging

import pytest

from ftwatch.events import Action, Decision, DeliveryResult, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sinks.base import NULL_SINK, LifecycleEvent, RunStart, Sink
from ftwatch.pipeline.sinks.jsonl import DecisionsFile

T0 = 1_795_250_000.0


def decision(t: float = T0) -> Decision:
    rc = Finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, Severity.CRITICAL,
                 Origin("worker-1", 1, "job-a", "node-b"), "NVRM: Xid 79", t - 1)
    return Decision(t, Action.ISOLATE_NODE, Target("job-a", "worker-1", 1, "node-b"), rc, "clause", 1, 2)


def test_only_decisions_are_written_one_line_each(tmp_path):
    path = tmp_path / "deep" / "decisions.jsonl"
    sink = DecisionsFile(path)
    assert isinstance(sink, Sink)
    d1, d2 = decision(), decision(T0 + 5)
    sink.write([RunStart("job-a", 0, T0), d1, LifecycleEvent(T0, "job-a", "job_start"),
                DeliveryResult("ops", "x-ops", "delivered", 1), d2])
    sink.write([LifecycleEvent(T0 + 6, "job-a", "instance_exit")])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [d1.to_json(), d2.to_json()]
    with pytest.raises(TypeError, match="not a sink record"):
        sink.write(["a string"])
    with pytest.raises(TypeError, match="not a sink record"):
        NULL_SINK.write([object()])
    sink.close()


def test_a_decisions_file_that_cannot_be_written_does_not_stop_the_recorder(tmp_path, caplog):
    """It is a secondary sink behind the store: its failure is logged, the decision recorded."""
    path = tmp_path / "decisions.jsonl"
    rec = Recorder(None, path, out=io.StringIO())
    path.mkdir()                                      # now a directory: opening it fails
    with caplog.at_level(logging.ERROR):
        rec.decision(decision())
    assert len(rec.decisions) == 1 and "DecisionsFile.write failed" in caplog.text
