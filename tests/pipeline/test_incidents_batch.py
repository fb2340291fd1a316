"""``IncidentDesk.output_many`` (issue 16 item 1, ``watch``): a batch's chunks of many origins fed
in one call decide and find exactly what feeding each origin with ``output`` does, and a chunk
that no rule hit costs no engine feed."""

from __future__ import annotations

import io
from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Origin
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sources.hostlog import host_origin
from ftwatch.policy import progress
from ftwatch.testing import T0, CaptureSink, finding

JOB = "team/batch-test"


def pod(n: int, rank: int | None = None) -> Origin:
    return Origin(f"batch-test-worker-{n}", n if rank is None else rank, JOB, f"node-{n % 2}", "stderr", "shipped")


TORCHRUN = Origin("batch-test-launcher-0", None, JOB, "node-0", "stdout", "shipped")   # ranks from prefixes
REFUSED = (b"Traceback (most recent call last):\n"
           b"  File \"/opt/conda/lib/python3.10/site-packages/urllib3/connection.py\", line 174, in _new_conn\n"
           b"ConnectionRefusedError: [Errno 111] Connection refused\n")
SUMMARY = b"".join(line + b"\n" for line in [
    b"Root Cause (first observed failure):", b"[0]:", b"  time      : 2026-11-21_11:02:19",
    b"  host      : node-0", b"  rank      : 1 (local_rank: 1)", b"  exitcode  : -9 (pid: 18989)",
    b"  error_file: <N/A>", b"  traceback : Signal 9 (SIGKILL) received by PID 18989", b"=" * 55])


def step(n: int) -> bytes:
    return f" iteration {n:8d}/ 1000 | elapsed time per iteration (ms): 1234.5 | loss 0.5\n".encode()


def batches() -> list[list[tuple[Origin, bytes]]]:
    """Batches as ``watch`` groups them: one chunk per origin, quiet pods beside the eventful ones."""
    quiet = b"loading shard 3 of 8\n"
    out = []
    for b in range(8):
        batch = [(pod(n), quiet) for n in range(6)]
        batch += [(TORCHRUN, b"[rank2]: " + step(b + 1))]
        if b == 1:
            batch[2] = (pod(2), REFUSED)                    # survivable: waits for pod 2's progress
        if b in (2, 3):
            batch[2] = (pod(2), step(b))                    # ... which outlives it
        if b == 3:
            batch[4] = (pod(4), b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n")
        if b == 4:
            batch[4] = (pod(4), b"KeyError: 'lr'\n")        # the traceback carried over one batch
            batch.append((TORCHRUN, SUMMARY))
            batch.append((host_origin("node-1", JOB, "kmsg"), b"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n"))
        if b == 6:
            batch[0] = (pod(0), b"RuntimeError: NCCL communicator was aborted on rank 0.\n")   # a hit, nothing open
        if b == 5:
            batch[5] = (pod(5), b"\x1b[31mRuntimeError: CUDA error: an illegal memory access was encountered\x1b[0m\n")
        out.append(batch)
    return out


def desk(tmp_path: Path):
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}}).with_policy(enable_job_restart=True)
    sink = CaptureSink()
    recorder = Recorder(sink, out=io.StringIO(), resolve_after=None)
    engine = build_engine(config)
    d = IncidentDesk(JOB, engine, build_policy(config, JOB), recorder, exits=False, settle=5.0, summaries="live")
    d.new_attempt(T0)
    return d, sink


def feed(d: IncidentDesk, many: bool) -> list:
    triggers = []
    for k, batch in enumerate(batches()):
        now = T0 + 10.0 * k
        if many:
            hits = d.engine.scan_many([data for _, data in batch])
            triggers.append(d.output_many([(o, data, now, h) for (o, data), h in zip(batch, hits)], mono=now))
        else:
            found = [d.output(o, data, now, now) for o, data in batch]
            triggers.append(next((f for f in found if f is not None), None))
    return triggers


def summary(d: IncidentDesk, sink: CaptureSink, triggers: list) -> dict:
    d.recorder.flush_output()
    key = lambda f: (f.rule_id, f.origin.instance, f.rank, f.time, f.line, f.kind)  # noqa: E731
    decision = d.close(T0 + 100.0)
    return {
        "stored": [key(f) for f in sink.findings],
        "evidence": [key(f) for f in d.evidence()],
        "notices": [key(f) for f in d.notices],
        "triggers": [None if t is None else key(t) for t in triggers],
        "instances": list(d.instances),
        "tails": dict(d._tails),
        "output": sorted(sink.output),
        "stats": (d.engine.stats.bytes, d.engine.stats.lines, d.engine.stats.findings),
        "decision": None if decision is None else (decision.action, key(decision.root_cause), decision.target),
        "failed": sorted(d.failed),
    }


def test_feeding_a_batch_at_once_equals_feeding_each_origin(tmp_path):
    one, one_sink = desk(tmp_path / "one")
    many, many_sink = desk(tmp_path / "many")
    expected = summary(one, one_sink, feed(one, many=False))
    got = summary(many, many_sink, feed(many, many=True))
    assert got == expected
    rules = {f[0] for f in expected["stored"]}          # the scenario exercises what it means to
    assert {"exit.sigkill"} <= rules and expected["notices"] and expected["decision"] is not None
    assert any(f[0] == "python.keyerror" or "KeyError" in f[4] for f in expected["evidence"])


def test_a_quiet_chunk_is_not_fed_to_the_engine(tmp_path, monkeypatch):
    d, sink = desk(tmp_path)
    fed = []
    real = d.engine.feed
    monkeypatch.setattr(d.engine, "feed", lambda origin, *a, **k: fed.append(origin) or real(origin, *a, **k))
    chunks = [(pod(n), b"loading shard 3 of 8\n") for n in range(5)] + [(pod(5), b"KeyError: 'lr'\n")]
    hits = d.engine.scan_many([data for _, data in chunks])
    d.output_many([(o, data, T0, h) for (o, data), h in zip(chunks, hits)], mono=T0)
    assert fed == [pod(5)]                              # only the chunk a rule hit
    assert list(d.instances) == [pod(n).instance for n in range(6)]     # every pod was met
    assert d.engine.stats.lines == 6
    d.recorder.flush_output()
    assert sum(row[5] for row in sink.output) == 6


def test_survival_watches_only_the_streams_of_a_waiting_instance():
    s = progress.Survival()
    assert not s.watches(pod(1))
    s.wait(finding("net.refused", at=Origin("pod-a/rank3", 3, JOB, "n", "stderr", "shipped")))
    assert s.watches(Origin("pod-a", None, JOB, "n", "stderr", "shipped"))      # its rank prefixes
    assert not s.watches(Origin("pod-a", 1, JOB, "n", "stderr", "shipped"))     # a known rank keeps the instance
    assert not s.watches(Origin("pod-b", None, JOB, "n", "stderr", "shipped"))
    assert s.watches(Origin("rank0", None, JOB, "n", "x", "replay"))            # a combined log's ranks


def test_output_reads_progress_only_for_a_waiting_instance_and_summaries_only_where_one_may_be(tmp_path):
    d, _ = desk(tmp_path)
    read = []
    outlived = d.survival.outlived
    d.survival.outlived = lambda origin, *a: read.append(("progress", origin.instance)) or outlived(origin, *a)
    summary = d._exits.summary
    d._exits.summary = lambda origin, *a: read.append(("summary", origin.instance)) or summary(origin, *a)
    d.output(pod(2), REFUSED, T0, T0)                   # pod 2's error waits for its progress (read from here on)
    assert d.survival
    d.output(pod(3), step(1), T0 + 1, T0 + 1)           # another pod's step line: nothing to read
    d.output(pod(2), step(1), T0 + 2, T0 + 2)
    d.output(TORCHRUN, SUMMARY, T0 + 3, T0 + 3)
    assert read == [("progress", pod(2).instance)] * 2 + [("summary", TORCHRUN.instance)]


def test_a_chunk_is_quiet_only_with_no_rule_hit_no_step_line_and_nothing_carried(tmp_path):
    d, _ = desk(tmp_path)
    engine = d.engine
    chunks = [b"loading shard 3 of 8\n", step(7), b"KeyError: 'lr'\n"]
    quiet, stepped, hit = engine.scan_many(chunks)
    assert engine.count_if_quiet(pod(0), chunks[0], quiet)
    assert engine.stats.lines == 1
    assert not engine.count_if_quiet(pod(0), chunks[1], stepped)     # the step tap reads it
    assert not engine.count_if_quiet(pod(0), chunks[2], hit)
    assert not engine.count_if_quiet(pod(0), chunks[0], None)        # not scanned yet
    engine.feed(pod(1), b"Traceback (most recent call last):\n", T0)  # an open block of pod 1
    assert not engine.count_if_quiet(pod(1), chunks[0], quiet)
    assert engine.stats.lines == 1                                    # nothing counted for a chunk not quiet
