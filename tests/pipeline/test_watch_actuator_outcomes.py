"""What `watch` does with an actuator's outcome (issue 13): stored with the decision's id and the
API calls, alerted when the action failed, was held by the breaker or was a dry run; a held
action starts no new attempt; the actuator's readmissions are stored."""

from __future__ import annotations

from ftwatch.pipeline.actuators.exec import ActResult
from ftwatch.testing import FakeClock
from tests.pipeline.test_watcher import NCCL, alerting, line, make


class Stub:
    """An actuator answering ``result``; its tick readmits ``readmit`` once."""

    def __init__(self, result: ActResult, readmit=()):
        self.result, self.readmit, self.acted = result, list(readmit), []

    def act(self, decision):
        self.acted.append(decision)
        return self.result

    def tick(self, now):
        out, self.readmit = self.readmit, []
        return out


def decide(tmp_path, result, readmit=()):
    clock = FakeClock()
    keep, dispatcher = alerting(tmp_path)
    stub = Stub(result, readmit)
    w, rec = make(tmp_path, clock, actuator=stub, dispatcher=dispatcher)
    w.ingest([line(clock, "j", "n0", "j-worker-1", 1, NCCL)])
    clock.advance(5.01)
    w.tick()
    rec.collect()
    return w, rec, keep, stub


def test_a_held_action_is_stored_with_its_calls_alerted_and_starts_no_attempt(tmp_path):
    held = ActResult("held", None, "circuit breaker open: 2 node(s) isolated\nlist nodes in cluster: ok",
                     ("list nodes in cluster (count and find isolated nodes): ok",))
    w, rec, keep, stub = decide(tmp_path, held)
    (decision,) = rec.decisions
    (event,) = [e for e in rec.store.events("j") if e["kind"] == "actuator"]
    assert event["detail"]["status"] == "held" and event["detail"]["decision_id"] == decision.decision_id
    assert event["detail"]["calls"] == list(held.calls)
    assert len(keep.sent) == 2                                   # the decision's alert, then the actuator's
    note = keep.sent[-1]
    assert "actuator held for restart_job" in note.title + note.body and "circuit breaker open" in note.body
    assert w.attempt_start["j"] == float("-inf")                 # nothing was done: same attempt


def test_a_done_action_alerts_once_and_readmissions_are_stored(tmp_path):
    done = ActResult("done", None, "delete pods/x/y (restart job): ok", ("delete pods/x/y (restart job): ok",))
    readmit = [("node-1", ActResult("done", None, "patch nodes/node-1 (readmit): ok", ("patch nodes/node-1: ok",)))]
    w, rec, keep, stub = decide(tmp_path, done, readmit)
    assert len(keep.sent) == 1
    assert w.attempt_start["j"] > 0                              # restarted: a new attempt
    (event,) = [e for e in rec.store.events("") if e["kind"] == "actuator"]
    assert event["detail"]["action"] == "readmit_node" and event["detail"]["calls"] == ["patch nodes/node-1: ok"]
