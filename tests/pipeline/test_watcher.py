"""The watch loop: many jobs from shipped lines, decided per job, with a fake clock."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from ftwatch.clock import FakeClock
from ftwatch.config import Config
from ftwatch.events import Origin
from ftwatch.pipeline.actuator import ExecActuator
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.watcher import Watcher
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

RULES = load_rules()
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, GPU has fallen off the bus."


def resolve(batch):
    """Test identity: meta carries job, node, pod and rank directly."""
    for s in batch:
        m = s.meta
        yield Origin(m["pod"], m.get("rank"), m["job"], m["node"], "stderr", "forward"), s.line, s.time


def line(clock, job, node, pod, rank, text):
    return Shipped(clock.time(), text.encode(), {"job": job, "node": node, "pod": pod, "rank": rank})


def make(tmp_path: Path, clock: FakeClock, actuator=None, **policy) -> tuple[Watcher, Recorder]:
    config = Config.model_validate({
        "storage": {"state_dir": str(tmp_path / "state")},
        "policy": {"enable_job_restart": True, **policy},
        "watch": {"settle": 5.0, "cooldown": 60.0},
    })
    store = SqliteStore(tmp_path / "state" / "ftwatch.db")
    recorder = Recorder(store, tmp_path / "decisions.jsonl", None, out=io.StringIO())
    return Watcher(config, Engine(RULES), recorder, resolve, actuator, clock), recorder


def cluster_batch(clock, job, nodes=4, ranks_per_node=8, text="step 10 loss 0.5"):
    return [line(clock, job, f"node-{n}", f"{job}-worker-{n * ranks_per_node + r}", n * ranks_per_node + r, text)
            for n in range(nodes) for r in range(ranks_per_node)]


def test_xid79_on_one_node_isolates_it_and_leaves_the_other_job_alone(tmp_path):
    """4 nodes x 8 ranks; node-2's ranks print Xid 79 -> isolate node-2 after the settle time;
    a second job watched at the same time gets no decision."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    w.ingest(cluster_batch(clock, "llm-a") + cluster_batch(clock, "llm-b"))
    clock.advance(1)
    w.ingest([line(clock, "llm-a", "node-2", f"llm-a-worker-{16 + r}", 16 + r, XID_79) for r in range(8)])
    w.ingest(cluster_batch(clock, "llm-b"))
    clock.advance(4)
    w.tick()
    assert rec.decisions == []                         # still settling
    clock.advance(1.01)
    w.tick()
    assert len(rec.decisions) == 1
    d = rec.decisions[0]
    assert d.action.label == "isolate_node" and d.target.job == "llm-a"
    assert d.target.node == "node-2"
    assert d.root_cause.rule_id.startswith("xid.79")
    assert "llm-b" not in {x.target.job for x in rec.decisions}


def test_fallout_after_acting_opens_no_incident_during_cooldown(tmp_path):
    """After a restart, the peers' connection errors within the cooldown are stored, not decided."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    w.ingest([line(clock, "j", "n0", "j-worker-1", 1, "RuntimeError: NCCL error: unhandled system error")])
    clock.advance(6)
    w.tick()
    assert [d.action.label for d in rec.decisions] == ["restart_job"]
    clock.advance(1)
    w.ingest([line(clock, "j", "n0", "j-worker-0", 0,
                   "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:29500")])
    clock.advance(10)
    w.tick()
    assert len(rec.decisions) == 1


def test_job_hang_is_per_job(tmp_path):
    """Job a goes silent past the interval -> hang restart for a only; b keeps talking."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, job_hang_interval=60)
    w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=2) + cluster_batch(clock, "b", nodes=1, ranks_per_node=2))
    for _ in range(7):
        clock.advance(10)
        w.ingest(cluster_batch(clock, "b", nodes=1, ranks_per_node=2))
        w.tick()
    assert [(d.action.label, d.target.job) for d in rec.decisions] == [("restart_job", "a")]
    assert rec.decisions[0].root_cause.failure_class.value == "hang"


def test_exec_actuator_gets_the_decision_json(tmp_path):
    """The exec actuator runs a real command with the decision JSON on stdin; its status is stored."""
    out = tmp_path / "acted.json"
    script = f"import sys, pathlib; pathlib.Path({str(out)!r}).write_text(sys.stdin.read())"
    clock = FakeClock()
    w, rec = make(tmp_path, clock, ExecActuator([sys.executable, "-c", script], timeout=30))
    w.ingest([line(clock, "j", "n0", "j-worker-1", 1, "RuntimeError: NCCL error: unhandled system error")])
    clock.advance(5)
    w.tick()
    acted = json.loads(out.read_text())
    assert acted["action"] == "restart_job" and acted["target"]["job"] == "j"
    events = [e for e in rec.store.events("j") if e["kind"] == "actuator"]
    assert events and events[0]["detail"]["status"] == "done"
