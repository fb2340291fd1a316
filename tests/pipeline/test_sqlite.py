"""E1: the SQLite store: schema, WAL, transactions, writers and readers, reopening."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ftwatch.errors import SinkError
from ftwatch.events import (Action, Decision, DeliveryResult, FailureClass, Finding, Origin, Severity,
                            Target, iso)
from ftwatch.pipeline.sinks.base import (ChunksSeen, FindingBatch, LifecycleEvent, OpenBlocks, OutputBatch,
                                         RunEnd, RunStart, SourcePosition)
from ftwatch.pipeline.sinks.sqlite import SCHEMA_VERSION, SqliteStore

T0 = 1_795_250_000.125


def finding(instance: str, rank: int, t: float, cls=FailureClass.FALLOUT, rule="gloo.peer_closed",
            job="job-1", line="Connection closed by peer") -> Finding:
    return Finding(rule, "keyword", cls, Action.RESTART_JOB, Severity.ERROR,
                   Origin(instance, rank, job, f"node-{rank % 2}", "stderr"), line, t, rank,
                   ("Traceback (most recent call last):", line), {"peer": "10.0.0.9"},
                   "https://example.test/rules")


def decision(t: float = T0, job: str = "job-1", attempt: int = 0) -> Decision:
    rc = finding("worker-1", 1, t - 5, FailureClass.USER_CODE, "python.exception",
                 job=job, line="ZeroDivisionError: division by zero")
    return Decision(t, Action.FAIL_JOB, Target(job), rc, "D2 ExitCodeAndErrorMsg: user_code -> fail",
                    3, 0, (finding("worker-0", 0, t - 2, job=job),), attempt)


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteStore(tmp_path / "state" / "ftwatch.db")
    yield s
    s.close()


def test_schema_is_versioned_and_in_wal_mode(store: SqliteStore, tmp_path: Path):
    assert store.schema_version == SCHEMA_VERSION == 8
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "events", "findings", "decisions", "alerts", "output", "positions",
            "chunks", "open_blocks"} <= tables
    conn.close()


def test_a_newer_schema_is_refused(tmp_path: Path):
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SinkError) as info:
        SqliteStore(path)
    assert "99" in str(info.value) and not info.value.retryable


def test_not_a_database_is_refused(tmp_path: Path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(SinkError):
        SqliteStore(path)


def test_decision_round_trip_and_lookup_by_prefix(store: SqliteStore):
    d = decision()
    store.write([d])
    assert [x["decision_id"] for x in store.decisions()] == [d.decision_id]   # stored under its id
    store.write([d])  # idempotent
    got = store.decision(d.decision_id[:6])
    assert got is not None
    assert got["decision_id"] == d.decision_id and got["action"] == "fail_job"
    assert got["time"] == iso(T0) and got["epoch"] == T0
    assert got["target"] == {"job": "job-1", "instance": None, "rank": None, "node": None}
    assert got["root_cause"]["line"] == "ZeroDivisionError: division by zero"
    assert got["root_cause"]["rule_id"] == "python.exception"
    assert got["root_cause"]["source"] == "https://example.test/rules"
    assert got["root_cause"]["evidence"][0].startswith("Traceback")
    assert got["policy_clause"].startswith("D2")
    assert (got["restarts_used"], got["restarts_left"], got["attempt"]) == (3, 0, 0)
    assert [f["instance"] for f in got["findings"]] == ["worker-0"]
    assert len(store.decisions()) == 1
    assert store.decision("ffff" if not d.decision_id.startswith("ffff") else "0000") is None
    with pytest.raises(ValueError):
        store.decision("  ")


def test_ambiguous_prefix_is_an_error(store: SqliteStore):
    ds = [decision(T0 + i) for i in range(40)]
    for d in ds:
        store.write([d])
    firsts = [d.decision_id[0] for d in ds]
    shared = next(c for c in firsts if firsts.count(c) > 1)
    with pytest.raises(ValueError, match="ambiguous"):
        store.decision(shared)


def test_last_decision_and_filter_by_job(store: SqliteStore):
    assert store.last_decision() is None
    a, b, c = decision(T0, "job-1"), decision(T0 + 60, "job-2"), decision(T0 + 30, "job-1")
    for d in (a, b, c):
        store.write([d])
    assert store.last_decision()["decision_id"] == b.decision_id
    assert [x["decision_id"] for x in store.decisions("job-1")] == [a.decision_id, c.decision_id]
    assert [x["decision_id"] for x in store.decisions()] == [a.decision_id, c.decision_id,
                                                            b.decision_id]


def test_findings_by_job_and_attempt(store: SqliteStore):
    store.write([FindingBatch([finding("worker-2", 2, T0 + 2), finding("worker-0", 0, T0)], attempt=0)])
    store.write([FindingBatch([finding("worker-1", 1, T0 + 100)], attempt=1)])
    store.write([FindingBatch([finding("worker-0", 0, T0, job="other")], attempt=0)])
    store.write([FindingBatch([])])
    first = store.findings_for("job-1", 0)
    assert [f["instance"] for f in first] == ["worker-0", "worker-2"]
    f = first[0]
    expected = finding("worker-0", 0, T0).to_dict()
    assert {k: f[k] for k in expected} == expected
    assert f["epoch"] == T0 and f["attempt"] == 0
    assert [f["instance"] for f in store.findings_for("job-1")] == ["worker-0", "worker-2",
                                                                    "worker-1"]
    assert [f["attempt"] for f in store.findings_for("job-1", 1)] == [1]


def test_runs_events_and_deliveries(store: SqliteStore):
    store.write([RunStart("job-1", 0, T0, ["python", "train.py", "--steps", "30"])])
    store.write([LifecycleEvent(T0 + 1, "job-1", "start", "worker-0", 0, {"pid": 123})])
    store.write([LifecycleEvent(T0 + 9, "job-1", "exit", "worker-0", 0, {"returncode": -9, "signal": 9})])
    store.write([LifecycleEvent(T0 + 10, "job-1", "restart")])
    store.write([RunEnd("job-1", 0, T0 + 10, "restarted")])
    store.write([RunEnd("job-1", 1, T0 + 50, "succeeded")])  # no start recorded: still stored
    runs = store.runs("job-1")
    assert runs[0] == {"job": "job-1", "attempt": 0, "started": T0, "ended": T0 + 10,
                       "status": "restarted", "command": "python train.py --steps 30"}
    assert runs[1]["status"] == "succeeded" and runs[1]["started"] is None
    events = store.events("job-1")
    assert [e["kind"] for e in events] == ["start", "exit", "restart"]
    assert events[1]["detail"] == {"returncode": -9, "signal": 9} and events[1]["rank"] == 0
    assert events[2]["instance"] is None and events[2]["detail"] == {}

    d = decision()
    result = DeliveryResult("ops", f"{d.decision_id}-ops", "spooled", 4, "HTTP 500",
                            d.decision_id, "the text", T0 + 20)
    store.write([result])
    store.write([DeliveryResult("ops", f"{d.decision_id}-ops", "delivered", 5, text="again")])
    store.write([DeliveryResult("ops", f"{d.decision_id}-ops~resolved", "delivered", 1,
                                text="from the result")])
    rows = store.deliveries(d.decision_id)[:2]
    assert store.deliveries(d.decision_id)[2]["text"] == "from the result"
    assert [(r["status"], r["attempts"], r["text"]) for r in rows] == [
        ("spooled", 4, "the text"), ("delivered", 5, "again")]
    assert rows[0]["error"] == "HTTP 500" and rows[1]["decision_id"] == d.decision_id


def test_batch_is_one_transaction_and_rolls_back(store: SqliteStore):
    with pytest.raises(RuntimeError):
        with store.batch():
            store.write([LifecycleEvent(T0, "job-1", "start", "worker-0", 0)])
            store.write([decision()])
            raise RuntimeError("crash in the middle")
    assert store.events() == [] and store.decisions() == []
    with store.batch():
        store.write([LifecycleEvent(T0, "job-1", "start", "worker-0", 0)])
        with store.batch():
            store.write([LifecycleEvent(T0 + 1, "job-1", "start", "worker-1", 1)])
    assert len(store.events()) == 2


def test_one_write_is_one_transaction(store: SqliteStore):
    """A batch of several records is stored whole or not at all (a record nobody can store
    fails the write before anything is written)."""
    with pytest.raises(TypeError, match="not a sink record"):
        store.write([LifecycleEvent(T0, "job-1", "start"), decision(), "not a record"])
    assert store.events() == [] and store.decisions() == []
    store.write([RunStart("job-1", 0, T0), LifecycleEvent(T0, "job-1", "start"), decision(),
                 FindingBatch([finding("worker-0", 0, T0)])])
    assert len(store.events()) == 1 and len(store.decisions()) == 1
    assert store.runs()[0]["status"] == "running" and len(store.findings_for("job-1")) == 1


def test_data_survives_reopening(tmp_path: Path):
    path = tmp_path / "ftwatch.db"
    d = decision()
    with SqliteStore(path) as s:
        s.write([d])
        s.write([FindingBatch([finding("worker-0", 0, T0)])])
    with SqliteStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert s.last_decision()["decision_id"] == d.decision_id
        assert len(s.findings_for("job-1")) == 1


def test_a_reader_sees_committed_writes_while_the_writer_is_open(store: SqliteStore):
    store.write([decision()])
    reader = SqliteStore(store.path)
    try:
        assert reader.last_decision() is not None
    finally:
        reader.close()


def test_output_counts_add_up_per_bucket_and_list_every_job(store: SqliteStore):
    store.write([OutputBatch([("job-1", "worker-0", 0, T0, 10.0, 3, 90), ("job-1", "worker-1", 1, T0, 10.0, 1, 5)])])
    store.write([OutputBatch([("job-1", "worker-0", 0, T0, 10.0, 2, 10), ("job-1", "worker-0", 0, T0 + 10, 10.0, 1, 1)])])
    store.write([LifecycleEvent(T0, "job-2", "job_start")])
    rows = store.output("job-1")
    assert [(r["instance"], r["bucket"], r["lines"], r["bytes"]) for r in rows] == [
        ("worker-0", T0, 5, 100), ("worker-0", T0 + 10, 1, 1), ("worker-1", T0, 1, 5)]
    assert rows[0]["rank"] == 0 and rows[0]["seconds"] == 10.0
    assert store.output("job-2") == []
    assert store.jobs() == ["job-1", "job-2"]


def test_a_version_1_file_is_migrated_and_keeps_its_data(tmp_path: Path):
    from ftwatch.pipeline.sinks import sqlite as mod
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(mod._SCHEMA_V1 + "PRAGMA user_version = 1;")
    conn.execute("INSERT INTO events (time, job, kind) VALUES (?, 'job-1', 'job_start')", (T0,))
    conn.commit()
    conn.close()
    with SqliteStore(path) as s:
        assert s.schema_version == SCHEMA_VERSION == 8
        assert [e["kind"] for e in s.events()] == ["job_start"]
        s.write([OutputBatch([("job-1", "worker-0", 0, T0, 5.0, 1, 2)])])
        assert s.output()[0]["lines"] == 1


def test_a_source_position_is_kept_per_key_and_never_replaced_by_an_older_one(store: SqliteStore):
    """Issue 17: a file tail's offsets are stored with the batch's findings; a lower seq is stale."""
    store.write([FindingBatch([finding("worker-0", 0, T0)]), SourcePosition("offsets/app.json", 5, b"five", T0)])
    store.write([SourcePosition("offsets/app.json", 4, b"four", T0)])
    store.write([SourcePosition("offsets/sys.json", 1, b"one", T0)])
    assert store.positions() == {"offsets/app.json": (5, b"five"), "offsets/sys.json": (1, b"one")}
    store.write([SourcePosition("offsets/app.json", 6, b"six", T0)])
    assert store.positions()["offsets/app.json"] == (6, b"six")


def test_a_failed_batch_stores_neither_its_findings_nor_its_position(store: SqliteStore):
    with pytest.raises(RuntimeError):
        with store.batch():
            store.write([FindingBatch([finding("worker-0", 0, T0)])])
            store.write([SourcePosition("offsets/app.json", 1, b"one", T0)])
            raise RuntimeError("killed before the commit")
    assert store.positions() == {} and store.findings_for("job-1") == []


def test_forward_chunk_ids_are_kept_with_their_batch_and_pruned_by_count_and_age(store: SqliteStore):
    """Issue 17: a Forward chunk id is stored in its batch's transaction (a failed batch stores
    none); past ``keep`` ids or ``keep_seconds`` the oldest go."""
    with pytest.raises(RuntimeError):
        with store.batch():
            store.write([FindingBatch([finding("worker-0", 0, T0)]), ChunksSeen([("fb", "lost")], T0, 10, 60.0)])
            raise RuntimeError("killed before the commit")
    assert not store.chunk_seen("fb", "lost")
    store.write([ChunksSeen([("fb", "a"), ("fb", "b")], T0, 3, 60.0)])
    assert store.chunk_seen("fb", "a") and store.chunk_seen("fb", "b") and not store.chunk_seen("other", "a")
    store.write([ChunksSeen([("fb", "a"), ("fb", "c")], T0 + 1, 3, 60.0)])   # "a" again: kept once
    store.write([ChunksSeen([("fb", "d")], T0 + 2, 3, 60.0)])                  # four ids: "a" goes
    assert [store.chunk_seen("fb", c) for c in "abcd"] == [False, True, True, True]
    store.write([ChunksSeen([("fb", "e")], T0 + 61.5, 3, 60.0)])               # b, c: over a minute old
    assert [store.chunk_seen("fb", c) for c in "bcde"] == [False, False, True, True]


def test_open_blocks_are_kept_per_origin_and_dropped_when_closed(store: SqliteStore):
    """Issue 17: the tracebacks still open after a batch are stored with it and read back whole."""
    a = Origin("w0", 0, "job-1", "n0", "/logs/a.log", "file", (("team", "x"),))
    b = Origin("w1", None, "job-1", "n0", "stderr", "forward")
    store.write([OpenBlocks([(a, b"Traceback (most recent call last):\n", 5.0, frozenset({3})),
                             (b, b"x\n", 6.0, frozenset())], T0)])
    store.write([OpenBlocks([(b, None, 0.0, frozenset())], T0 + 1)])           # b's block closed
    [(origin, data, base, skip)] = store.open_blocks()
    assert (origin, origin.labels, data, base, skip) == (a, a.labels, b"Traceback (most recent call last):\n",
                                                          5.0, frozenset({3}))
