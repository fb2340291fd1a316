"""Node blame across attempts and jobs: decay, threshold, cooldown, persistence, explain."""

from __future__ import annotations

import json

import pytest

from ftwatch.clock import FakeClock
from ftwatch.config.recovery import BlameConfig, RecoveryConfig
from ftwatch.events import Action, Origin
from ftwatch.policy.blame import BlameStore

from recovery_helpers import DAY, JOB, _engine, died, incident, line, policy

ON = RecoveryConfig(blame=BlameConfig(enabled=True, threshold=3, window=DAY, cooldown=2 * DAY))
NCCL = "NCCL WARN NET/IB : Got completion from peer 10.0.0.9<38122> with error 12, opcode 0, len 0, vendor err 129"


def infra(state, clock, *, rank=4, node="node-9", recovery=ON, text=NCCL):
    p = policy(state, recovery=recovery)
    f = line(text, clock, rank, node)
    clock.advance(1)
    d = p.decide(incident(died(clock, rank, 137, node), f, attempt=p.budgets.attempt), clock.time())
    clock.advance(3600)
    return d


def test_the_line_is_a_retryable_infra_root_cause(tmp_path):
    d = infra(tmp_path, FakeClock(), recovery=RecoveryConfig())
    assert d.action is Action.RESTART_JOB and d.root_cause.failure_class.value == "retryable_infra"
    assert "blame" not in d.policy_clause                  # blame is off by default


def test_a_one_off_isolates_no_one_and_a_repeat_offender_is_isolated(tmp_path):
    clock = FakeClock()
    ds = [infra(tmp_path, clock) for _ in range(3)]
    assert [d.action for d in ds] == [Action.RESTART_JOB, Action.RESTART_JOB, Action.ISOLATE_NODE]
    assert "blame: node node-9 1/3 in 24 h" in ds[0].policy_clause
    assert ds[2].target.node == "node-9"
    assert "blame: node node-9 was the root cause 3 times in 24 h (>= 3) → isolate_node" in ds[2].policy_clause


def test_blame_decays_out_of_the_window(tmp_path):
    clock = FakeClock()
    infra(tmp_path, clock)
    infra(tmp_path, clock)
    clock.advance(DAY)
    assert infra(tmp_path, clock).action is Action.RESTART_JOB


def test_blame_counts_across_jobs_and_persists(tmp_path):
    clock = FakeClock()
    store = BlameStore.for_state(tmp_path, threshold=3)
    store.blame("node-9", "other-job", "0", "nccl.x", clock.time())
    store.blame("node-9", "other-job", "1", "nccl.x", clock.time())
    d = infra(tmp_path, clock)                              # a new Policy reads the same file
    assert d.action is Action.ISOLATE_NODE
    saved = json.loads((tmp_path / "blame" / "nodes.json").read_text())
    assert saved["nodes"]["node-9"]["isolated_at"] is not None


def test_cooldown_after_a_blame_isolation(tmp_path):
    clock = FakeClock()
    for _ in range(3):
        infra(tmp_path, clock)
    ds = [infra(tmp_path, clock) for _ in range(3)]         # within the 48 h cooldown
    assert Action.ISOLATE_NODE not in [d.action for d in ds]
    assert "cooling down after its blame isolation" in ds[-1].policy_clause


def test_one_attempt_is_one_blame(tmp_path):
    store = BlameStore(None, threshold=2)
    assert store.blame("n", "job", "0", "r", 1.0).count == 1
    assert store.blame("n", "job", "0", "r", 2.0).count == 1
    assert store.blame("n", "job", "1", "r", 3.0).isolate


def test_user_code_and_user_input_codes_are_not_blamed(tmp_path):
    clock = FakeClock()
    for _ in range(4):
        d = infra(tmp_path, clock, text="[ERROR] DRV device 0 fault code 0x80C98002")
        assert "blame" not in d.policy_clause and d.action is not Action.ISOLATE_NODE
    store = BlameStore.for_state(tmp_path)
    assert store.count("node-9", clock.time()) == 0


def test_a_threshold_of_one_is_refused():
    with pytest.raises(ValueError, match="one-off"):
        BlameStore(None, threshold=1)


def test_report_for_explain(tmp_path):
    clock = FakeClock()
    infra(tmp_path, clock)
    text = BlameStore.for_state(tmp_path).report(clock.time())
    assert text.splitlines()[0] == "Node blame"
    assert "node-9: 1/3 in 24 h:" in text and "(train-7)" in text


def test_ftwatch_explain_shows_the_blame_clause_and_the_node_table(tmp_path, capsys):
    import io

    from ftwatch.cli.explain import cmd_explain
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.sinks.sqlite import SqliteStore

    clock = FakeClock()
    recorder = Recorder(SqliteStore(tmp_path / "ftwatch.db"), out=io.StringIO())
    for _ in range(3):
        d = infra(tmp_path, clock)
        recorder.decision(d)
    assert cmd_explain(["--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "blame: node node-9 was the root cause 3 times in 24 h (>= 3) → isolate_node" in out
    assert "Node blame" in out and "node-9: 0/3 in 24 h" in out and "isolated by blame" in out


def test_an_unknown_or_implicit_node_is_never_blamed(tmp_path):
    """Origin.node None (or ``localhost`` from watch on stdin) is no node: repeated Xid 94s
    there are never blamed (and the blame file is not broken by a None key)."""
    clock = FakeClock()
    for node in (None, None, "localhost", "localhost", "localhost"):
        p = policy(tmp_path, recovery=ON)
        o = Origin("worker-1", rank=1, job=JOB, node=node, stream="stderr")
        [f] = _engine().feed(o, b"NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, Contained ECC error.\n", clock.time()) + \
            _engine().flush(o, clock.time())
        d = p.decide(incident(f, attempt=p.budgets.attempt), clock.time())
        assert "blame" not in d.policy_clause and d.action is not Action.ISOLATE_NODE, d.policy_clause
        clock.advance(60)
