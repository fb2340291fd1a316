"""``watch`` batches of many origins (issue 16): one scan and one step-tap call per batch, a
backlog taken in one go, and per-origin state (open blocks, ranks) never mixed across origins."""

from __future__ import annotations

import io
import itertools
import queue
import sys
import threading
import time
from pathlib import Path

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Origin
from ftwatch.pipeline.build import build_engine
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sources import batches as batches_mod
from ftwatch.pipeline.sources.base import Shipped, ShippedBatch
from ftwatch.pipeline.sources.batches import GroupedBacklog, MergedBatch, group_lines
from ftwatch.pipeline.watch import Watcher
from ftwatch.testing import FakeClock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rules"))
from engine_samples import GLOO_TB, KEYERROR_TB  # noqa: E402


def resolve(batch):
    for s in batch:
        m = s.meta
        yield Origin(m["pod"], m.get("rank"), m["job"], m["node"], "stderr", "forward"), s.line, s.time


def make(tmp_path: Path, clock: FakeClock, **watch) -> tuple[Watcher, Recorder]:
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path / "state")},
                                    "watch": {"settle": 5.0, "cooldown": 60.0, **watch},
                                    "health": {"straggler": {"min_steps": 5}}})
    recorder = Recorder(out=io.StringIO(), resolve_after=None)
    return Watcher(config, build_engine(config), recorder, resolve, clock=clock), recorder


def shipped(clock: FakeClock, pod: str, rank: int, text: str, job: str = "llm") -> Shipped:
    return Shipped(clock.time(), text.encode(), {"job": job, "node": "node-0", "pod": pod, "rank": rank})


def interleave(*streams: list[Shipped]) -> list[Shipped]:
    return [s for group in itertools.zip_longest(*streams) for s in group if s is not None]


@pytest.mark.parametrize("cut", [None, 4])
def test_interleaved_tracebacks_of_two_pods_stay_apart(tmp_path, cut):
    """Two pods print a traceback each, line by line interleaved in the batch (and a third pod
    step lines between them): each pod's block joins only its own lines, whole, as if it had
    come alone; cut across two batches, each pod's open block is carried and closed alone.
    Mixed into one chunk, pod a's traceback would take pod b's lines (or end at b's last line).
    Both reach the desk: the second pod's finding is taken though the first one's opened the
    incident in the same batch (``output_many`` once skipped it: ``trigger or self._take(...)``)."""
    clock = FakeClock()
    w, _ = make(tmp_path, clock)
    a = [shipped(clock, "llm-worker-0", 0, text) for text in KEYERROR_TB]
    b = [shipped(clock, "llm-worker-1", 1, text) for text in GLOO_TB]
    steps = [shipped(clock, "llm-worker-2", 2, f"step {n}/100 loss 0.5") for n in range(1, 12)]
    lines = interleave(a, steps, b)
    for batch in ([lines] if cut is None else [lines[:cut * 3], lines[cut * 3:]]):
        w.ingest(batch)
    found = {f.origin.instance: f for f in w.jobs["llm"].findings if len(f.evidence) > 1}
    assert set(found) == {"llm-worker-0", "llm-worker-1"}
    assert list(found["llm-worker-0"].evidence) == KEYERROR_TB
    assert list(found["llm-worker-1"].evidence) == GLOO_TB
    assert (found["llm-worker-0"].rule_id, found["llm-worker-1"].rule_id) == (
        "python.key_error", "gloo.connection_closed_by_peer")


@pytest.mark.parametrize("hits", [False, True])
def test_a_batch_of_many_pods_step_lines_is_one_step_tap_call(tmp_path, monkeypatch, hits):
    """Step lines of 12 pods per batch go to the step tap in one call per job (``Engine.feed_steps``),
    and the tap still names the slow rank a straggler. With ``hits``, a rule also hits a third of
    the pods' chunks: such a chunk is fed to the engine alone, but its step lines join the batch's
    one tap call (``Engine.feed``'s ``defer``), each pod with the step times of feeding it alone;
    a step line after a traceback's start waits, with the block carried over, as a step line."""
    clock = FakeClock()
    w, _ = make(tmp_path, clock)
    tap = w.engine.steps
    calls = []
    real = tap.take_chunk
    monkeypatch.setattr(tap, "take_chunk", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    found = []
    for n in range(1, 10):
        batch = []
        for r in range(12):
            t = clock.time() + n * (0.3 if r == 5 else 0.1)
            meta = {"job": "llm", "node": f"node-{r // 4}", "pod": f"llm-worker-{r}", "rank": r}
            if hits and r % 3 == 0:         # a rule hit in the same chunk as the step line
                batch.append(Shipped(t, b"RuntimeError: NCCL communicator was aborted on rank 0.", meta))
            batch.append(Shipped(t, f"step {n}/100 loss 0.5".encode(), meta))
        w.ingest(batch)
    found = [f for f in w.jobs["llm"].findings if f.kind == "straggler"]
    assert [f.rank for f in found] == [5]
    assert len(calls) == 9 and all(callable(c) for c in calls)      # one per batch, many origins in each
    ranks = w.engine.steps.jobs["llm"].ranks
    assert {name: len(rank.samples) for name, rank in ranks.items()} == {f"llm-worker-{r}": 8 for r in range(12)}
    if hits:                                # steps 2-9 above; an open block's lines wait for it
        meta = {"job": "llm", "node": "node-0", "pod": "llm-worker-0", "rank": 0}
        w.ingest([Shipped(clock.time(), b"Traceback (most recent call last):", meta),
                  Shipped(clock.time(), b"step 10/100 loss 0.5", meta)])
        assert len(ranks["llm-worker-0"].samples) == 8


def test_a_backlog_is_taken_in_one_go_and_each_batch_acked(tmp_path, monkeypatch):
    """``next_batch`` takes the batches queued behind the first, up to ``MERGE_LINES`` lines, as
    one batch; ingesting it acknowledges each (a file tail's offsets); the rest stays queued."""
    monkeypatch.setattr(batches_mod, "MERGE_LINES", 5)
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    acked = []
    batches = [ShippedBatch([shipped(clock, f"llm-worker-{k}", k, "plain text") for k in range(2)],
                            commit=lambda n=n: acked.append(n) or True) for n in range(4)]
    for batch in batches:
        w.queue.put(batch)
    merged = w.next_batch(0.0)
    assert isinstance(merged, GroupedBacklog) and len(merged) == 6    # 2 + 2 + 2 >= 5: three batches
    w.ingest(merged)
    assert acked == [0, 1, 2] and all(b.acked for b in batches[:3]) and not batches[3].acked
    assert w.next_batch(0.0) is batches[3]                              # alone: handed over as it is
    assert w.next_batch(0.0) is None
    assert rec.metrics is not None
    with pytest.raises(queue.Empty):
        w.queue.get_nowait()


def test_a_backlog_is_resolved_as_it_is_taken_and_ingested_as_its_batches_would_be(tmp_path, monkeypatch):
    """``next_batch`` resolves a backlog's batches as it takes them (issue 16: a record's metadata
    map is not held while the rest of the backlog is gathered): the merged batch holds the
    lines ``resolve`` gives for the batches in queue order, keeps only the batches it must
    acknowledge (a plain list's Shipped are dropped), grouped per origin as the batches' lines
    grouped at once would be, is true while it took any Shipped, and ingesting it finds what
    ingesting the same batches unresolved finds. A batch alone is handed over as it is."""
    monkeypatch.setattr(batches_mod, "MERGE_LINES", 10)
    clock = FakeClock()
    lines = list(KEYERROR_TB)
    pods = [[shipped(clock, f"llm-worker-{k}", k, line) for line in lines] for k in range(2)]
    plain = [s for pod in pods for s in pod][:6]
    tail = [s for pod in pods for s in pod][6:]
    acked = []
    carried = ShippedBatch(tail, commit=lambda: acked.append(1) or True)
    w, rec = make(tmp_path, clock)
    calls = []
    w.resolve = lambda batch: calls.append(len(batch)) or resolve(batch)
    w.queue.put(list(plain))
    w.queue.put(carried)
    merged = w.next_batch(0.0)
    assert isinstance(merged, GroupedBacklog) and merged.batches == [carried]
    assert merged.groups == group_lines(resolve(plain + tail)) and calls == [len(plain), len(tail)]
    assert list(merged.groups) == [resolve([pod[0]]).__next__()[0] for pod in pods]      # in order of first line
    assert len(merged) == len(plain + tail)
    assert bool(GroupedBacklog([], {}, taken=2, lines=0)) and not GroupedBacklog([], {}, taken=0, lines=0)
    w.ingest(merged)
    assert acked == [1] and carried.acked and calls == [len(plain), len(tail)]   # not resolved again

    w2, rec2 = make(tmp_path / "unresolved", clock)
    w2.ingest(plain + tail)
    for watcher in (w, w2):
        watcher.close()
    assert rec.finding_count == rec2.finding_count > 0

    alone = list(plain)
    w.queue.put(alone)
    assert w.next_batch(0.0) is alone and calls == [len(plain), len(tail)]


def test_a_consumer_behind_a_full_queue_gathers_the_batches_its_sources_send_next(monkeypatch):
    """``take_backlog`` (issue 16): a bounded queue found full means its sources wait on the
    consumer, so it takes what is queued and then waits (up to ``GATHER_SECONDS`` each) for the
    batches the unblocked source sends next, up to ``MERGE_LINES`` lines; a queue not full is
    taken as it stands, with no wait."""
    monkeypatch.setattr(batches_mod, "MERGE_LINES", 6)
    monkeypatch.setattr(batches_mod, "GATHER_SECONDS", 30.0)   # a put ends the wait at once
    full: queue.Queue = queue.Queue(maxsize=2)
    first, second, third = ([Shipped(0.0, f"{n}-{k}".encode(), {}) for k in range(2)] for n in range(3))
    full.put(first)
    full.put(second)

    def source() -> None:                       # sends its next batch once the consumer took both
        with full.not_full:                     # (woken at each get)
            full.not_full.wait_for(lambda: not full.queue, timeout=5.0)
        full.put(third)

    sender = threading.Thread(target=source)
    sender.start()
    merged = batches_mod.take_backlog(full, 0.0)
    sender.join(5.0)
    assert isinstance(merged, MergedBatch) and merged.batches == [first, second, third]

    roomy: queue.Queue = queue.Queue(maxsize=4)
    roomy.put(first)
    roomy.put(second)
    started = time.monotonic()
    merged = batches_mod.take_backlog(roomy, 0.0)
    assert merged.batches == [first, second] and time.monotonic() - started < 5.0   # no 30 s wait


def test_a_trickle_behind_a_full_queue_holds_the_consumer_gather_seconds_at_most(monkeypatch):
    """However steadily its sources keep sending, a consumer that found its queue full hands its
    backlog over ``GATHER_SECONDS`` after taking the first batch (not once ``MERGE_LINES`` lines
    came): a trickle of small batches cannot hold the lines it took."""
    monkeypatch.setattr(batches_mod, "MERGE_LINES", 10**9)
    monkeypatch.setattr(batches_mod, "GATHER_SECONDS", 0.2)
    full: queue.Queue = queue.Queue(maxsize=2)
    done = threading.Event()

    def source() -> None:                       # one line a batch, as fast as it is taken
        for n in range(1_000_000):
            if done.is_set():
                return
            try:
                full.put([Shipped(0.0, b"x", {})], timeout=0.01)
            except queue.Full:
                continue

    sender = threading.Thread(target=source, daemon=True)
    full.put([Shipped(0.0, b"x", {})])
    full.put([Shipped(0.0, b"x", {})])
    sender.start()
    started = time.monotonic()
    merged = batches_mod.take_backlog(full, 0.0)
    done.set()
    sender.join(5.0)
    assert len(merged) >= 2 and time.monotonic() - started < 5.0


def test_rank_prefixes_of_many_pods_stay_each_pods_own(tmp_path):
    """Two pods running torchrun (no rank from the pod) both print ``[rank0]:`` and ``[rank1]:``
    step lines, interleaved in one batch: the step tap, handed the batch's step lines in one
    call, keeps four ranks (``<pod>/rank<k>``), each with its own lines' step times (mixed by rank
    alone: two ranks, each with both pods' repeated step numbers). A pod's lines of a batch share
    its latest time, so each rank takes one step time a batch: the pod's own, 0.1 s or 0.2 s."""
    clock = FakeClock()
    w, _ = make(tmp_path, clock)
    for steps in ((1, 2, 3), (4, 5, 6)):
        batch = []
        for n in steps:
            for pod in ("llm-a", "llm-b"):
                for r in (0, 1):
                    batch.append(Shipped(clock.time() + n * (0.2 if pod == "llm-b" else 0.1),
                                         f"[rank{r}]: step {n}/100 loss 0.5".encode(),
                                         {"job": "llm", "node": "node-0", "pod": pod, "rank": None}))
        w.ingest(batch)
    ranks = w.engine.steps.jobs["llm"].ranks
    assert sorted(ranks) == ["llm-a/rank0", "llm-a/rank1", "llm-b/rank0", "llm-b/rank1"]
    assert {name: list(rank.samples) for name, rank in ranks.items()} == {
        "llm-a/rank0": [pytest.approx(0.1)], "llm-a/rank1": [pytest.approx(0.1)],
        "llm-b/rank0": [pytest.approx(0.2)], "llm-b/rank1": [pytest.approx(0.2)]}


def test_a_backlog_in_flight_stays_under_the_ingest_collector_threshold():
    """``tune_gc_for_ingest`` (issue 16): the young collection counts tracked objects alive. A
    backlog in flight is its lines grouped per origin as taken (``GroupedBacklog``: bytes, which
    the collector does not track, in one list per origin), so ``MERGE_LINES`` lines of 1,000
    pods with 24,576 Forward records queued behind them (a record map with Kubernetes metadata
    and labels, its Shipped) stay under the threshold, and ingesting them runs no collection
    that could only find them alive."""
    import gc

    from ftwatch.pipeline.sources.forward import _shipped
    from ftwatch.pipeline.sources.identity import Identity
    from ftwatch.pipeline.watch import INGEST_GC_THRESHOLD, tune_gc_for_ingest

    def entry(i: int) -> tuple:
        return (1.7e9 + i, {"log": f"line {i}\n", "stream": "stderr",
                            "kubernetes": {"pod_name": f"llm{i % 10}-worker-{i // 10 % 100}", "namespace_name": "train",
                                           "host": f"node-{i % 125}",
                                           "labels": {"training.kubeflow.org/job-name": f"llm{i % 10}"}}}, {})

    def requests(n: int) -> list:
        return [_shipped("kube.var.log", [entry(i) for i in range(k, min(k + 1000, n))]) for k in range(0, n, 1000)]

    full: queue.Queue = queue.Queue(maxsize=1000)
    for batch in requests(batches_mod.MERGE_LINES):
        full.put(batch)
    identity = Identity()
    before = gc.get_threshold()
    gc.disable()
    try:
        young = gc.get_count()[0]
        backlog = batches_mod.take_backlog(full, 0.0, identity.resolve)
        queued = requests(24_576)
        alive = gc.get_count()[0] - young
        tune_gc_for_ingest()
        assert gc.get_threshold()[0] == INGEST_GC_THRESHOLD
        assert isinstance(backlog, GroupedBacklog) and len(backlog) == batches_mod.MERGE_LINES
        assert len(backlog.groups) == 1_000 and sum(map(len, queued)) == 24_576
        assert 0 < alive < INGEST_GC_THRESHOLD
    finally:
        gc.set_threshold(*before)
        gc.enable()
