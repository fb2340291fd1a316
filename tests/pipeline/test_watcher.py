"""The watch loop: many jobs from shipped lines, decided per job, with a fake clock."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from ftwatch.alerting.notify import Sender
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.spool import Spool
from ftwatch.config.model import Config
from ftwatch.events import Origin
from ftwatch.pipeline.actuators.exec import ExecActuator
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.watch import Watcher
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.testing import CaptureNotifier, FakeClock

RULES = load_rules()
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, GPU has fallen off the bus."


def resolve(batch):
    """Test identity: meta carries job, node, pod and rank directly."""
    for s in batch:
        m = s.meta
        yield Origin(m["pod"], m.get("rank"), m["job"], m["node"], "stderr", "forward"), s.line, s.time


def line(clock, job, node, pod, rank, text):
    return Shipped(clock.time(), text.encode(), {"job": job, "node": node, "pod": pod, "rank": rank})


def make(tmp_path: Path, clock: FakeClock, actuator=None, dispatcher=None, resolve_after=300.0,
         **policy) -> tuple[Watcher, Recorder]:
    config = Config.model_validate({
        "storage": {"state_dir": str(tmp_path / "state")},
        "policy": {"enable_job_restart": True, **policy},
        "watch": {"settle": 5.0, "cooldown": 60.0},
    })
    store = SqliteStore(tmp_path / "state" / "ftwatch.db")
    recorder = Recorder(store, tmp_path / "decisions.jsonl", dispatcher, out=io.StringIO(),
                        resolve_after=resolve_after)
    return Watcher(config, Engine(RULES), recorder, resolve, actuator, clock), recorder


def alerting(tmp_path: Path) -> tuple[CaptureNotifier, Sender]:
    keep = CaptureNotifier("keep")
    return keep, Sender([keep], TemplateRenderer("en"), Spool(tmp_path / "spool"))


NCCL = "RuntimeError: NCCL error: unhandled system error"


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


def fail(clock, w, job, node="n0", rank=1):
    """One NCCL error of ``job``; its restart is decided after the 5 s settle."""
    w.ingest([line(clock, job, node, f"{job}-worker-{rank}", rank, NCCL)])


def test_watch_resolves_each_jobs_alerts_after_its_own_quiet_period(tmp_path):
    """Two jobs in one watch: each restart alert resolves resolve_after (300 s) after that job's
    last incident; a job's new incident restarts its own quiet period and no other's."""
    clock = FakeClock()
    keep, dispatcher = alerting(tmp_path)
    w, rec = make(tmp_path, clock, dispatcher=dispatcher)

    def run_for(seconds):
        for _ in range(int(seconds)):
            clock.advance(1)
            w.tick()

    fail(clock, w, "a")
    run_for(6)                                          # a: restart at ~t0+5
    t_a = rec.decisions[-1].time
    run_for(94)
    fail(clock, w, "b")
    run_for(6)                                          # b: restart at ~t0+105
    t_b = rec.decisions[-1].time
    assert keep.log() == [("a", "firing"), ("b", "firing")]
    run_for(t_a + 300 - clock.time() - 1)
    assert keep.log() == [("a", "firing"), ("b", "firing")]    # a: not quite 300 s yet
    run_for(2)
    assert keep.log()[2:] == [("a", "resolved")]                 # a alone
    assert keep.sent[2].alert.ends_at - t_a >= 300
    fail(clock, w, "b")                                 # b again, after its cooldown
    run_for(6)
    t_b2 = rec.decisions[-1].time
    assert t_b2 > t_b + 60 and keep.log()[3:] == [("b", "firing")]
    run_for(t_b + 300 - clock.time() + 5)
    assert ("b", "resolved") not in keep.log()          # its quiet period started again
    run_for(t_b2 + 300 - clock.time() + 2)
    assert keep.log()[4:] == [("b", "resolved")]
    events = [e for e in rec.store.events("a") if e["kind"] == "alert_resolved"]
    assert len(events) == 1 and "no new incident for 300s" in events[0]["detail"]["reason"]
    assert "1 alert(s) of job a resolved" in rec.out.getvalue()


def test_a_settling_incident_holds_the_resolution(tmp_path):
    """A job whose next incident is still settling when its quiet period ends keeps its alert
    open; the new decision then restarts the quiet period."""
    clock = FakeClock()
    keep, dispatcher = alerting(tmp_path)
    w, rec = make(tmp_path, clock, dispatcher=dispatcher, resolve_after=100)
    fail(clock, w, "a")
    clock.advance(6)
    w.tick()                                             # restart decided at t+6
    clock.advance(98)
    w.tick()
    fail(clock, w, "a")                                  # a new incident at t+104 (after cooldown)
    clock.advance(3)
    w.tick()                                             # t+107: quiet for 101 s, but settling
    assert keep.log() == [("a", "firing")]
    clock.advance(3)
    w.tick()                                             # decided: a second firing
    assert keep.log() == [("a", "firing"), ("a", "firing")]
    clock.advance(99)
    w.tick()
    assert len(keep.log()) == 2
    clock.advance(2)
    w.tick()
    assert keep.log()[2:] == [("a", "resolved")]


def test_a_clean_finish_in_the_launchers_log_resolves_that_job_at_once(tmp_path):
    """torchelastic's "worker group successfully finished" from job a's launcher resolves a's
    restart alert at once; job b's stays open."""
    clock = FakeClock()
    keep, dispatcher = alerting(tmp_path)
    w, rec = make(tmp_path, clock, dispatcher=dispatcher)
    fail(clock, w, "a")
    fail(clock, w, "b")
    clock.advance(6)
    w.tick()
    assert sorted(keep.log()) == [("a", "firing"), ("b", "firing")]
    clock.advance(30)
    w.ingest([line(clock, "a", "n0", "a-launcher", None,
                   "I1121 11:02:19.507000 18964 torch/distributed/elastic/agent/server/api.py:933] "
                   "[default] worker group successfully finished. Waiting 300.0 seconds for other "
                   "agents to finish.")])
    assert keep.log()[2:] == [("a", "resolved")]
    assert rec.open_jobs() == {"b"}
    assert "finished successfully" in rec.store.events("a")[-1]["detail"]["reason"]


FINISHED = ("I1121 11:02:19.507000 18964 torch/distributed/elastic/agent/server/api.py:933] "
            "[default] worker group successfully finished. Waiting 300.0 seconds for other agents to finish.")


def restarted(tmp_path, clock, **policy):
    """A watch with job-hang detection on (600 s) whose job a restarted once, 60 s ago."""
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, job_hang_interval=600, **policy)
    fail(clock, w, "a")
    clock.advance(6)
    w.tick()
    clock.advance(60)
    return w, rec


def test_a_job_its_launchers_finished_is_no_hang_and_ends_succeeded_when_let_go(tmp_path):
    """Two pods, each a torchrun agent with its rank: after a restart, both agents log their
    clean finish and the job falls silent. Its silence is no hang (detection on, 600 s); let go
    after job_idle_seconds, it ends as succeeded at the finish (a none decision, its run
    "succeeded", its budgets closed), so the same name failing later restarts on a fresh budget."""
    clock = FakeClock()
    w, rec = restarted(tmp_path, clock, max_num_of_job_restart=2)
    w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=2))
    clock.advance(10)
    finished_at = clock.time()
    w.ingest([line(clock, "a", "node-0", f"a-worker-{r}", None, FINISHED) for r in range(2)])
    for _ in range(40):                       # 4,000 s: past the hang interval and job_idle_seconds
        clock.advance(100)
        w.tick()
    assert "a" not in w.jobs
    assert [(d.action.label, d.restarts_used) for d in rec.decisions] == [("restart_job", 1), ("none", 1)]
    assert rec.decisions[-1].policy_clause == "the job ended by itself: job succeeded → none"
    assert rec.decisions[-1].time == finished_at
    assert [(r["attempt"], r["status"], r["ended"]) for r in rec.store.runs("a")] == [
        (0, "restarted", finished_at - 70), (1, "succeeded", finished_at)]
    fail(clock, w, "a")
    clock.advance(6)
    w.tick()
    assert [(d.action.label, d.restarts_used, d.restarts_left) for d in rec.decisions[2:]] == [("restart_job", 1, 1)]


def test_a_launchers_clean_finish_leaves_the_other_launchers_workers_timed(tmp_path):
    """Only pod a-worker-0's agent finished; a-worker-1 went silent with it: the job hangs
    (restart_job, a-worker-1 the culprit), and a job that restarted has no clean finish to end."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, job_hang_interval=600)
    w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=2))
    w.ingest([line(clock, "a", "node-0", "a-worker-0", None, FINISHED)])
    for _ in range(7):
        clock.advance(100)
        w.tick()
    [d] = rec.decisions
    assert (d.action.label, d.root_cause.rule_id, d.root_cause.origin.instance) == (
        "restart_job", "hang.job", "a-worker-1")
    assert w.jobs["a"].finished_at is None


def test_a_pod_still_running_job_exit_hang_interval_after_another_finished_is_an_exit_hang(tmp_path):
    """Exit-hang detection on (600 s), job-hang off: a-worker-0's agent finished; a-worker-1
    keeps printing (no job hang) but has not finished 600 s later: an exit hang restarts the job,
    a-worker-1 the culprit. Without the finish line, no exit hang (nothing exited 0)."""
    for finish in (True, False):
        clock = FakeClock()
        w, rec = make(tmp_path / str(finish), clock, enable_job_exit_hang_detection=True,
                      job_exit_hang_interval=600)
        w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=2))
        if finish:
            w.ingest([line(clock, "a", "node-0", "a-worker-0", None, FINISHED)])
        for _ in range(12):
            clock.advance(50)
            w.ingest([line(clock, "a", "node-0", "a-worker-1", 1, "waiting for the exit barrier")])
            w.tick()
        if not finish:
            assert rec.decisions == []
            continue
        [d] = rec.decisions
        assert (d.action.label, d.root_cause.kind, d.root_cause.origin.instance) == (
            "restart_job", "exit_hang", "a-worker-1")
        assert d.time == clock.time()


AGENT_START = ("I1121 11:40:02.101000 20011 torch/distributed/elastic/agent/server/api.py:889] "
               "[default] starting workers for entrypoint: python")


def finish_and_rerun(clock, w, pods, trailing=""):
    """Job a's two pods (each a torchrun agent) finish; 300 s later (inside job_idle_seconds)
    ``pods`` print a torchelastic agent's start, after ``trailing`` from a-worker-0 if given."""
    w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=2))
    clock.advance(10)
    w.ingest([line(clock, "a", "node-0", f"a-worker-{r}", None, FINISHED) for r in range(2)])
    finished_at = clock.time()
    for _ in range(3):
        clock.advance(100)
        w.tick()
    if trailing:
        w.ingest([line(clock, "a", "node-0", "a-worker-0", None, trailing)])
    w.ingest([line(clock, "a", "node-0", pod, None, AGENT_START) for pod in pods])
    return finished_at


def test_a_job_run_again_after_its_clean_finish_is_a_new_run_with_fresh_budgets_and_timers(tmp_path):
    """The job restarted once (its one restart spent), both agents finished, and 300 s later the
    same pods start agents again (the PyTorchJob applied again): the finished run ends succeeded
    at its finish, the new run is a run of its own, and its silence is a hang restarted on a
    fresh budget. Before, the pods stayed finished: the new run was never timed (no decision)."""
    clock = FakeClock()
    w, rec = restarted(tmp_path, clock, max_num_of_job_restart=1)
    finished_at = finish_and_rerun(clock, w, ["a-worker-0", "a-worker-1"])
    rerun_at = clock.time()
    assert [(d.action.label, d.time) for d in rec.decisions[1:]] == [("none", finished_at)]
    for _ in range(7):
        clock.advance(100)
        w.tick()
    assert [(d.action.label, d.root_cause.rule_id, d.restarts_used, d.restarts_left)
            for d in rec.decisions[2:]] == [("restart_job", "hang.job", 1, 0)]
    assert [(r["attempt"], r["status"]) for r in rec.store.runs("a")] == [
        (0, "restarted"), (1, "succeeded"), (0, "restarted"), (1, "running")]
    assert rec.store.runs("a")[2]["started"] == rerun_at


def test_new_pods_starting_agents_once_every_pod_finished_are_a_new_run(tmp_path):
    """The job applied again with new pod names (a plain Job's generated ones): once none of its
    pods runs, an agent starting anywhere in it is a new run too."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    finished_at = finish_and_rerun(clock, w, ["a-worker-7"])
    assert [(d.action.label, d.time) for d in rec.decisions] == [("none", finished_at)]
    assert [r["status"] for r in rec.store.runs("a")] == ["succeeded", "running"]


def test_finishes_and_starts_again_in_one_batch_end_the_run_once(tmp_path):
    """One batch holds both pods' finishes and their agents' starts after them (one chunk per pod,
    finish then start), then the new run's error: the finished run ends once (none), the new
    run takes both starts (no second end) and restarts for its error on its own budget."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, max_num_of_job_restart=1)
    w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=2))
    clock.advance(10)
    w.ingest([line(clock, "a", "node-0", f"a-worker-{r}", None, text)
              for text in (FINISHED, AGENT_START) for r in range(2)])
    fail(clock, w, "a")
    clock.advance(6)
    w.tick()
    assert [(d.action.label, d.restarts_used) for d in rec.decisions] == [("none", 0), ("restart_job", 1)]
    assert [(r["attempt"], r["status"]) for r in rec.store.runs("a")] == [
        (0, "succeeded"), (0, "restarted"), (1, "running")]


def test_what_a_finished_pod_prints_after_its_finish_is_not_a_new_run(tmp_path):
    """After a-worker-0's agent finished: its trailing lines and a script run after torchrun are
    the finished run's, and an agent starting in a pod new to the job while a-worker-1 still runs
    (a node joining) is the same run. No decision, one run."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=2))
    w.ingest([line(clock, "a", "node-0", "a-worker-0", None, FINISHED)])
    clock.advance(100)
    w.ingest([line(clock, "a", "node-0", "a-worker-0", None, text) for text in (
        "I1121 11:07:19.511000 18964 torch/distributed/elastic/agent/server/api.py:948] "
        "Done waiting for other agents. Elapsed: 0.0012 seconds", "uploading checkpoint to s3://ckpt/a")])
    w.ingest([line(clock, "a", "node-0", "a-worker-9", None, AGENT_START)])
    w.tick()
    assert rec.decisions == []
    assert [r["status"] for r in rec.store.runs("a")] == ["running"]
    assert w.jobs["a"].finished_at is not None


def test_stdin_at_eof_ends_the_jobs_a_launcher_finished(tmp_path):
    """The input ended: a job whose agent finished ends as succeeded then; one without a clean
    finish is left as it was (no decision, its run open)."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    w.ingest(cluster_batch(clock, "a", nodes=1, ranks_per_node=1) + cluster_batch(clock, "b", nodes=1, ranks_per_node=1))
    w.ingest([line(clock, "a", "node-0", "a-worker-0", None, FINISHED)])
    clock.advance(5)
    w.close()
    assert [(d.target.job, d.action.label) for d in rec.decisions] == [("a", "none")]
    assert [r["status"] for r in rec.store.runs("a")] == ["succeeded"]
    assert [r["status"] for r in rec.store.runs("b")] == ["running"]


def test_a_failed_job_resolves_its_restart_alerts_as_superseded(tmp_path):
    """Budget spent: the job's second incident fails it; its open restart alert resolves
    (superseded), the fail_job alert itself stays (it never resolves)."""
    clock = FakeClock()
    keep, dispatcher = alerting(tmp_path)
    w, rec = make(tmp_path, clock, dispatcher=dispatcher, max_num_of_job_restart=1)
    fail(clock, w, "a")
    clock.advance(6)
    w.tick()
    clock.advance(70)
    fail(clock, w, "a")
    clock.advance(6)
    w.tick()
    assert [d.action.label for d in rec.decisions] == ["restart_job", "fail_job"]
    assert [(n.alert.event_type, n.alert.status) for n in keep.sent] == [
        ("job_restart", "firing"), ("job_failed", "firing"), ("job_restart", "resolved")]
    assert rec.open_jobs() == set()
    reasons = [e["detail"]["reason"] for e in rec.store.events("a") if e["kind"] == "alert_resolved"]
    assert reasons == ["superseded: the job failed"]


def test_a_job_run_again_under_the_name_of_one_watch_failed_is_explained_by_its_own_findings(tmp_path):
    """The store keeps a run per attempt of a job from when watch meets it; failing the job ends
    its run, so the cluster's next job of that name (attempt 0 again: fresh budgets) is a run of
    its own, and explain gives its decision its own findings, not the failed job's."""
    from ftwatch.alerting.explain import explain
    clock = FakeClock()
    w, rec = make(tmp_path, clock, max_num_of_job_restart=1)
    for _ in range(2):                                     # restart_job (attempt 0), then fail_job (1)
        fail(clock, w, "a")
        clock.advance(6)
        w.tick()
        clock.advance(70)
    w.ingest([line(clock, "a", "n0", "a-worker-0", 0, XID_79)])      # the same name again
    clock.advance(6)
    w.tick()
    assert [(d.action.label, d.attempt) for d in rec.decisions] == [
        ("restart_job", 0), ("fail_job", 1), ("isolate_node", 0)]
    assert [(r["attempt"], r["status"]) for r in rec.store.runs("a")] == [
        (0, "restarted"), (1, "failed"), (0, "restarted"), (1, "running")]     # isolating starts attempt 1
    first, again = explain(rec.store, rec.decisions[0].decision_id), explain(rec.store, rec.decisions[2].decision_id)
    assert "NCCL" in first and "Xid" not in first
    assert "Xid" in again and "NCCL" not in again


C4D_WARN = "[C4D] Warn RankCommHang rank=1 node=node-1 duration=12s times=1"
C4D_ERROR = "[C4D] Error RankCommHang rank=1 node=node-1 times=18"


def test_a_c4d_warn_opens_an_incident_that_only_notifies_and_leaves_no_cooldown(tmp_path):
    """R8: a Warn is below severity error but still asks a person; after a notify nothing was done,
    so a real error right after it is decided (no cooldown)."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    w.ingest([line(clock, "j", "node-0", "j-worker-0", 0, C4D_WARN)])
    clock.advance(6)
    w.tick()
    assert [d.action.label for d in rec.decisions] == ["notify"]
    assert "R8 C4D Warning RankCommHang on node node-1" in rec.decisions[0].policy_clause
    clock.advance(1)
    w.ingest([line(clock, "j", "node-0", "j-worker-1", 1, NCCL)])
    clock.advance(6)
    w.tick()
    assert [d.action.label for d in rec.decisions] == ["notify", "restart_job"]


def test_a_c4d_error_with_c4d_detection_isolates_the_node_it_names(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, enable_c4d_hang_detection=True)
    w.ingest([line(clock, "j", "node-0", "j-master-0", 0, C4D_ERROR)])
    clock.advance(6)
    w.tick()
    [d] = rec.decisions
    assert d.action.label == "isolate_node" and d.target.node == "node-1", d.policy_clause
    assert "R8 C4D Error RankCommHang on node node-1 rank 1" in d.policy_clause


def test_a_c4d_info_below_the_log_level_opens_nothing(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    w.ingest([line(clock, "j", "node-0", "j-worker-0", 0, "[C4D] Info RankCommSlow rank=1 node=node-1")])
    clock.advance(6)
    w.tick()
    assert rec.decisions == []


def test_a_batch_of_many_origins_is_scanned_once(tmp_path):
    """1,000 pods in one batch: one matcher scan for the batch, not one per origin; the Xid line
    of one of them still decides for its node."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock)
    scans = []
    real = w.engine.matcher.scan
    w.engine.matcher.scan = lambda data: scans.append(len(data)) or real(data)
    batch = cluster_batch(clock, "llm-a", nodes=125, ranks_per_node=8)
    batch[17] = line(clock, "llm-a", "node-2", "llm-a-worker-17", 17, XID_79)
    w.ingest(batch)
    assert len(scans) == 1
    clock.advance(5)
    w.tick()
    (decision,) = rec.decisions
    assert decision.action.label == "isolate_node" and decision.target.node == "node-2"
