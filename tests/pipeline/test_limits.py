"""The ``limits`` caps (issue 17 item 3): each is fed past its cap, holds at it, keeps the newest or
most relevant state, counts its drops in ``ftwatch_state_evicted_total``, and leaves the decisions
of a live job as they were. Idle eviction runs on a FakeClock."""

from __future__ import annotations

import gc
import io
import weakref
from pathlib import Path

from prometheus_client import generate_latest

from ftwatch.bounded import EVICTIONS
from ftwatch.clock import FakeClock
from ftwatch.config.health import StragglerConfig
from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.identity import Identity
from ftwatch.pipeline.watch import Watcher
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules, rules_from_text
from ftwatch.rules.stragglers import StepTracker
from ftwatch.telemetry import Metrics

INFO_RULE = """\
rules:
  - id: test.progress
    keywords: ["progress marker"]
    class: info
    action: none
    severity: info
"""
RULES = load_rules() + rules_from_text(INFO_RULE, "progress.yaml", [])
NCCL = "RuntimeError: NCCL error: unhandled system error"


def resolve(batch):
    for s in batch:
        m = s.meta
        yield Origin(m["pod"], m.get("rank"), m["job"], m["node"], "stderr", "forward"), s.line, s.time


def line(clock, job, pod, text, rank=0, node="n0"):
    return Shipped(clock.time(), text.encode(), {"job": job, "node": node, "pod": pod, "rank": rank})


def make(tmp_path: Path, clock: FakeClock, limits: dict | None = None, max_kept: int = 10000,
         **policy) -> tuple[Watcher, Recorder]:
    config = Config.model_validate({
        "storage": {"state_dir": str(tmp_path / "state")},
        "policy": {"enable_job_restart": True, **policy},
        "watch": {"settle": 5.0, "cooldown": 60.0},
        "limits": limits or {},
    })
    recorder = Recorder(SqliteStore(tmp_path / "state" / "ftwatch.db"), None, None, out=io.StringIO(),
                        metrics=Metrics(), max_kept=max_kept)
    return Watcher(config, Engine(RULES), recorder, resolve, None, clock), recorder


def counted(before: dict[str, int]) -> dict[str, int]:
    """The drops since ``before`` (an ``EVICTIONS.snapshot()``), by kind, non-zero only."""
    now = EVICTIONS.snapshot()
    return {k: n - before.get(k, 0) for k, n in now.items() if n != before.get(k, 0)}


def finding(job: str, n: int, severity: Severity, t: float) -> Finding:
    return Finding("test.f", "keyword", FailureClass.INFO, Action.NONE, severity,
                   Origin("p0", 0, job, "n0", "stderr", "forward"), f"finding {n}", t, n)


# -- evidence --------------------------------------------------------------------------------

def flood_then_fail(tmp_path: Path, limits: dict | None) -> tuple[Watcher, Recorder, dict]:
    clock = FakeClock()
    w, rec = make(tmp_path, clock, limits)
    before = EVICTIONS.snapshot()
    w.ingest([line(clock, "j", "j-w0", "progress marker 0")])
    w.ingest([line(clock, "j", "j-w0", "WARNING: NCCL_IB_TIMEOUT overridden by env")])   # a warning, early
    for k in range(1, 6):
        clock.advance(1)
        w.ingest([line(clock, "j", f"j-w{r}", f"progress marker {k}.{r}", rank=r) for r in range(30)])
        w.tick()
    kept = [f.line for f in w.jobs["j"].findings]
    clock.advance(1)
    w.ingest([line(clock, "j", "j-w3", NCCL, rank=3)])
    clock.advance(5.01)
    w.tick()
    return w, rec, {"kept": kept, "counted": counted(before)}


def test_info_findings_are_capped_newest_first_and_the_decision_is_unchanged(tmp_path):
    w, rec, seen = flood_then_fail(tmp_path / "capped", {"max_info_findings_per_job": 40})
    _, free, _ = flood_then_fail(tmp_path / "free", None)
    kept = seen["kept"]
    info = [k for k in kept if k.startswith("progress marker")]
    assert len(info) <= 40 and info[-1] == "progress marker 5.29"          # the newest info kept
    assert "progress marker 0" not in info                                 # the oldest gone
    assert seen["counted"]["finding"] == 151 - len(info)                   # every drop counted
    assert [(d.action, d.root_cause.rule_id, d.target.instance) for d in rec.decisions] == \
        [(d.action, d.root_cause.rule_id, d.target.instance) for d in free.decisions]
    assert len(rec.decisions) == 1 and rec.decisions[0].action is Action.RESTART_JOB


def test_all_findings_cap_drops_info_first_then_the_oldest(tmp_path):
    clock = FakeClock()
    w, _ = make(tmp_path, clock, {"max_findings_per_job": 20, "max_info_findings_per_job": 1000})
    desk = w._desk("j")
    desk.add([finding("j", 0, Severity.WARNING, 1.0)])
    desk.add([finding("j", n, Severity.INFO, 1.0 + n) for n in range(1, 15)])
    desk.add([finding("j", n, Severity.WARNING, 1.0 + n) for n in range(15, 25)])
    assert len(desk.findings) <= 20
    lines = [f.line for f in desk.findings]
    assert lines[0] == "finding 0" and lines[-1] == "finding 24"          # the early warning stays
    assert all(f"finding {n}" in lines for n in range(15, 25))
    desk.add([finding("j", n, Severity.WARNING, 1.0 + n) for n in range(25, 60)])
    assert len(desk.findings) <= 20 and desk.findings[-1].line == "finding 59"
    assert all(f.severity is Severity.WARNING for f in desk.findings)      # info went before any warning


# -- instances -------------------------------------------------------------------------------

def test_instances_and_their_hang_timers_keep_the_most_recently_active(tmp_path):
    clock = FakeClock()
    w, _ = make(tmp_path, clock, {"max_instances_per_job": 4}, enable_job_hang_detection=True,
                job_hang_interval=600)
    before = EVICTIONS.snapshot()
    for r in range(4):
        clock.advance(1)
        w.ingest([line(clock, "j", f"j-w{r}", "step", rank=r)])
    clock.advance(1)
    w.ingest([line(clock, "j", "j-w0", "step again")])                        # w0 active again: w1 is the oldest
    clock.advance(1)
    w.ingest([line(clock, "j", "j-w4", "step", rank=4)])
    desk = w.jobs["j"]
    assert list(desk.instances) == ["j-w2", "j-w3", "j-w0", "j-w4"]
    assert sorted(o.instance for o in desk.tracker.running) == ["j-w0", "j-w2", "j-w3", "j-w4"]
    assert "j-w1" not in desk._started_at
    assert counted(before) == {"instance": 1, "hang_timer": 1}


def test_straggler_ranks_per_job_are_capped():
    clock = FakeClock()
    tracker = StepTracker(StragglerConfig(min_steps=5), clock=clock, max_ranks=2)
    engine = Engine(load_rules(), steps=tracker)
    before = EVICTIONS.snapshot()
    for n in range(1, 4):
        for rank in range(3):
            engine.feed(Origin(f"w{rank}", rank, "job1", "node-a", "stdout"), f"step {n}/100 loss 0.5\n".encode(),
                        1000.0 + n)
    assert list(tracker.jobs["job1"].ranks) == ["w1", "w2"]
    assert counted(before) == {"straggler_rank": 7}         # w0, w1, w2 push each other out each step


# -- jobs ------------------------------------------------------------------------------------

def test_an_idle_job_is_forgotten_with_its_metrics_and_starts_fresh(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, {"job_idle_seconds": 100})
    before = EVICTIONS.snapshot()
    w.ingest([line(clock, "a", "a-w0", "progress marker"), line(clock, "b", "b-w0", "progress marker")])
    for _ in range(10):
        clock.advance(10)
        w.ingest([line(clock, "b", "b-w0", "step")])
        w.tick()
    assert set(w.jobs) == {"b"} and counted(before) == {"job_idle": 1}
    scrape = generate_latest(rec.metrics.registry).decode()
    assert 'job_id="a"' not in scrape and 'job_id="b"' in scrape
    assert 'ftwatch_state_evicted_total{kind="job_idle"}' in scrape
    w.ingest([line(clock, "a", "a-w0", "back")])
    assert set(w.jobs) == {"a", "b"} and w.jobs["a"].findings == [] and w.jobs_met == 3
    scrape = generate_latest(rec.metrics.registry).decode()     # its output series back, counted afresh
    assert 'ftwatch_lines_total{job_id="a"} 1.0' in scrape


def test_a_finished_job_let_go_keeps_its_none_decision_scrapeable_for_another_idle_time(tmp_path):
    """A job its launcher finished cleanly, let go at 100 s idle, ends with a none decision: its
    desk goes then, its series (that decision's among them) 100 s later, counted once, as a
    failed job's. Before, they went in the step that counted the decision: never scraped."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, {"job_idle_seconds": 100})
    before = EVICTIONS.snapshot()
    w.ingest([line(clock, "a", "a-w0", "step"), line(clock, "a", "a-w0",
              "[default] worker group successfully finished. Waiting 300 seconds for other agents to finish.")])
    decided = 'ftwatch_decisions_total{action="none",job_id="a"} 1.0'
    seen = []
    for _ in range(21):
        clock.advance(10)
        w.tick()
        seen.append(("a" in w.jobs, decided in generate_latest(rec.metrics.registry).decode(),
                     counted(before).get("job_idle", 0)))
    assert [d.action.label for d in rec.decisions] == ["none"]
    assert seen[8] == (True, False, 0)           # 90 s: still the job's
    assert seen[9] == (False, True, 0)           # 100 s: ended, its decision scrapeable
    assert seen[18] == (False, True, 0)
    assert seen[19] == (False, False, 1)         # 200 s: its series go, counted once
    assert seen[20] == (False, False, 1)


def test_forgotten_jobs_are_freed_though_the_collector_is_tuned_away(tmp_path):
    """A desk is held in reference cycles, so only the collector frees a forgotten job; ``watch``
    tunes the collector's own passes away (``tune_gc_for_ingest``), here it is off: the watcher's
    full collection after forgetting jobs frees them, at most once per FORGOTTEN_GC_SECONDS (30 s)."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, {"job_idle_seconds": 100})
    was = gc.isenabled()
    gc.disable()
    try:
        first, late = [f"first-{i}" for i in range(5)], [f"late-{i}" for i in range(3)]
        w.ingest([line(clock, job, f"{job}-w0", "progress marker") for job in first])        # t = 0
        clock.advance(10)
        w.ingest([line(clock, job, f"{job}-w0", "progress marker") for job in late])         # t = 10
        desks = {job: weakref.ref(w.jobs[job]) for job in first + late}
        seen = {}
        for t in range(20, 150, 10):           # "keep" speaks every 10 s; the others fall idle
            clock.advance(10)
            w.ingest([line(clock, "keep", "keep-w0", "step")])
            w.tick()
            seen[t] = ({job for job in first + late if job in w.jobs},
                       {job for job, desk in desks.items() if desk() is not None})
        assert seen[90] == (set(first + late), set(first + late))
        assert seen[100] == (set(late), set(late))       # forgotten at 100 s, collected at once
        assert seen[110] == (set(), set(late))           # forgotten at 110 s, 10 s after a collection
        assert seen[120] == (set(), set(late))
        assert seen[130] == (set(), set())               # 30 s after it: collected
    finally:
        if was:
            gc.enable()


def test_a_silent_job_stays_while_its_hang_timer_judges_it(tmp_path):
    """Idle past job_idle_seconds but the hang interval is longer: the hang still fires (the decision
    is as without limits), then the job is forgotten."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, {"job_idle_seconds": 100}, enable_job_hang_detection=True,
                  job_hang_interval=300)
    w.ingest([line(clock, "a", "a-w0", "step"), line(clock, "a", "a-w1", "step", rank=1)])
    for _ in range(35):
        clock.advance(10)
        w.tick()
        if not rec.decisions:
            assert "a" in w.jobs                                          # idle, but the hang timer runs
    assert [(d.action.label, d.root_cause.failure_class.value) for d in rec.decisions] == [("restart_job", "hang")]
    clock.advance(10)
    w.tick()
    assert "a" not in w.jobs


def test_a_settling_incident_holds_its_job_past_the_idle_time(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, {"job_idle_seconds": 2})
    w.ingest([line(clock, "a", "a-w0", NCCL)])
    clock.advance(3)
    w.tick()
    assert "a" in w.jobs and rec.decisions == []                          # settling (5 s): kept
    clock.advance(2.01)
    w.tick()
    assert [d.target.job for d in rec.decisions] == ["a"]
    clock.advance(1)
    w.tick()
    assert "a" not in w.jobs                                              # decided and idle: dropped


def test_max_jobs_drops_the_job_with_the_oldest_output_but_not_one_settling(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, {"max_jobs": 2})
    before = EVICTIONS.snapshot()
    w.ingest([line(clock, "a", "a-w0", "step")])
    clock.advance(1)
    w.ingest([line(clock, "b", "b-w0", "step")])
    clock.advance(1)
    w.ingest([line(clock, "c", "c-w0", "step")])
    assert set(w.jobs) == {"b", "c"} and counted(before) == {"job": 1}
    w.ingest([line(clock, "b", "b-w0", NCCL)])                               # b settles, c is now the oldest
    clock.advance(1)
    w.ingest([line(clock, "d", "d-w0", "step")])
    assert set(w.jobs) == {"b", "d"}
    clock.advance(5)
    w.tick()
    assert [d.target.job for d in rec.decisions] == ["b"]                    # b's decision as without the cap


def test_a_job_forgotten_mid_batch_takes_its_sdk_rules_out_after_the_batch(tmp_path):
    """Job a declared retryable errors (issue 13); a new job c in a batch forgets it (max_jobs).
    Its rules leave the engine only once the batch is fed: the batch's scan found b's lines with
    the rules compiled then, so b's findings are those of a run where a declared nothing (a
    recompile mid-batch would shift the ids the scan's hits name); the next tick has them out."""
    tb = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', "    lr = cfg['lr']",
          "KeyError: 'lr'"]

    def scenario(declare: bool) -> tuple[Watcher, list[str]]:
        clock = FakeClock()
        w, rec = make(tmp_path / str(declare), clock, {"max_jobs": 2})
        w.ingest([line(clock, "a", "a-w0", "step")])
        clock.advance(1)
        w.ingest([line(clock, "b", "b-w0", "step")])
        if declare:
            assert w.control({"job": "a", "op": "set_retryable_errors", "errors": ["flaky storage", "flaky fabric"],
                              "rank": 0})["ok"]
        clock.advance(1)
        w.ingest([line(clock, "c", "c-w0", "step")] + [line(clock, "b", "b-w0", text) for text in tb]
                 + [line(clock, "b", "b-w1", "NPU fault code 0x80C98002", rank=1)])
        assert set(w.jobs) == {"b", "c"}
        return w, [f["rule_id"] for f in rec.store.findings_for("b")]

    w, found = scenario(declare=True)
    assert found == scenario(declare=False)[1] and found
    assert any(r.id.endswith("@a") for r in w.engine.rules)           # still there: the batch was fed
    w.tick()
    assert [r.id for r in w.engine.rules if r.id.endswith("@a")] == []


# -- open blocks, kept decisions -------------------------------------------------------------

def test_open_blocks_past_the_cap_close_early_oldest_first(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, {"max_open_blocks": 2})
    before = EVICTIONS.snapshot()
    for r in range(3):
        w.ingest([line(clock, "j", f"j-w{r}", "Traceback (most recent call last):", rank=r),
                  line(clock, "j", f"j-w{r}", '  File "train.py", line 3, in <module>', rank=r)])
        clock.advance(0.5)
    assert len(w.engine.pending_origins()) == 3
    w.tick()
    assert sorted(o.instance for o in w.engine.pending_origins()) == ["j-w1", "j-w2"]
    assert counted(before) == {"open_block": 1}


def test_the_recorder_keeps_the_newest_decisions_and_counts_them_all(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, max_kept=2)
    before = EVICTIONS.snapshot()
    for job in "abc":
        w.ingest([line(clock, job, f"{job}-w0", NCCL)])
    clock.advance(5.01)
    w.tick()
    assert rec.decision_count == 3 and [d.target.job for d in rec.decisions] == ["b", "c"]
    assert counted(before) == {"decision": 1}
    assert len(rec.store.decisions("a")) == 1                                 # the store keeps every one


def test_the_recorder_keeps_the_origins_of_the_newest_instances_and_counts_the_rest():
    """Its map of each instance's latest origin (the output rows' labels) was cleared, uncounted,
    at 65,536 entries; now the oldest set goes past ``max_tracked_instances``."""
    rec = Recorder(out=io.StringIO(), resolve_after=None, max_origins=3)
    before = EVICTIONS.snapshot()
    for n in range(5):
        rec.output(Origin(f"w{n}", n, "j", "node-a", "stdout", "forward"), 1, 10, 1000.0 + n)
    rec.output(Origin("w3", 3, "j", "node-b", "stdout", "forward"), 1, 10, 1006.0)   # moved: set again
    assert [(key, o.node) for key, o in rec._origins.items()] == [
        (("j", "w2"), "node-a"), (("j", "w4"), "node-a"), (("j", "w3"), "node-b")]
    assert counted(before) == {"origin": 2}


def test_identity_keeps_the_devices_of_the_newest_instances():
    identity = Identity(max_devices=2)
    before = EVICTIONS.snapshot()
    for rank in range(3):
        meta = {"kubernetes": {"pod_name": f"j-worker-{rank}", "namespace_name": "team", "host": "node-1",
                               "labels": {"training.kubeflow.org/job-name": "j"}},
                "stream": "stderr", "pci_bus_ids": f"00000000:{0x3b + rank:02X}:00.0"}
        identity.origin(meta)
    assert [instance for _, instance in identity.devices] == ["j-worker-1", "j-worker-2"]
    assert counted(before) == {"device": 1}


def test_a_forgotten_rank_leaves_the_jobs_sorted_medians():
    """The step statistics keep every rank's median in sorted lists (per job, per node): a rank the
    cap forgets takes its median out of them, and a node without ranks left goes."""
    clock = FakeClock()
    tracker = StepTracker(StragglerConfig(min_steps=3), clock=clock, max_ranks=2)
    engine = Engine(load_rules(), steps=tracker)
    for rank, node in ((0, "node-a"), (1, "node-b"), (2, "node-b")):    # one after the other
        for n in range(1, 6):
            engine.feed(Origin(f"w{rank}", rank, "job1", node, "stdout"), f"step {n}/100 loss 0.5\n".encode(),
                        1000.0 + n * (1 + rank))
        if rank == 1:
            assert set(tracker.jobs["job1"].node_median) == {"node-a", "node-b"}
    job = tracker.jobs["job1"]
    assert list(job.ranks) == ["w1", "w2"] and all(r.median is not None for r in job.ranks.values())
    assert job.medians == sorted(r.median for r in job.ranks.values())
    assert set(job.node_ranks) == set(job.node_median) == {"node-b"} and len(job.node_medians) == 1
