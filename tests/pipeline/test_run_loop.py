"""``ftwatch run``'s loop (``JobRunner``) driven on a FakeClock with scripted workers: a failure and
the restart it decides, a hang, an Async instance restart, MindCluster recover-in-place, and an
isolation that shrinks the job or, below MIN, fails it. No process, no sleep: the fake supervisor
(``ftwatch.testing.FakeSupervisor``) moves the clock as the real one would block. The real engine, policy, budgets,
slots, recorder and store.
"""

from __future__ import annotations

import dataclasses
import io

from ftwatch.config.model import Config
from ftwatch.events import Action, ProcessExit
from ftwatch.pipeline.build import build_run
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.run import SETTLE_SECONDS
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.testing import Exit, FakeClock, FakeControl, FakeSupervisor, Say, script_of

JOB = "job"
SIGKILL = 9
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."


def config(tmp_path, policy=None, nproc="2", **sections):
    return Config.model_validate({
        "policy": {"fault_tolerant_policy": "OnFailure", "enable_job_restart": True, "max_num_of_job_restart": 2,
                   **(policy or {})},
        "supervisor": {"nproc_per_node": nproc, "restart_delay": 0, "devices": ["0", "1"]},
        "health": {"bootcheck": False, "troubleshooting": False},
        "storage": {"state_dir": str(tmp_path)},
        **sections,
    })


def run(tmp_path, cfg, script):
    """Run the job to its end; returns (status, recorder, supervisor, store, clock, terminal text)."""
    clock = FakeClock()
    sup = FakeSupervisor(clock, script, job=JOB)
    store = SqliteStore(tmp_path / "ftwatch.db")
    out = io.StringIO()
    recorder = Recorder(store, out=out)
    runner = build_run(cfg, ["train"], JOB, recorder, out=out, clock=clock, supervisor=sup, control=FakeControl())
    status = runner.run()
    return status, recorder, sup, store, clock, out.getvalue()


def test_a_killed_worker_restarts_the_job_and_the_restart_succeeds(tmp_path):
    """Rank 1 is SIGKILLed 2 s in while rank 0 trains on: the others get SETTLE_SECONDS, every
    worker is stopped, the job restarts (restart count 1), and the second attempt ends well."""
    script = script_of({
        (0, 1): [Say(1, "step 1")],                                   # runs until stopped
        (1, 1): [Say(1, "step 1"), Exit(2, None, SIGKILL)],
    }, default=[Say(1, "step 1"), Exit(2)])
    status, recorder, sup, store, clock, out = run(tmp_path, config(tmp_path), script)
    assert status == 0, out.getvalue()
    assert [d.action for d in recorder.decisions] == [Action.RESTART_JOB, Action.NONE]
    first = recorder.decisions[0]
    assert first.root_cause.rule_id == "exit.sigkill" and first.restarts_used == 1
    assert sup.names() == ["resize", "start_all", "stop_all", "resize", "start_all", "stop_all", "close"]
    assert [c[1] for c in sup.calls if c[0] == "start_all"] == [0, 1]          # TORCHELASTIC_RESTART_COUNT
    events = [(e["kind"], e["instance"]) for e in store.events(JOB) if e["kind"] in ("instance_exit", "job_restart")]
    assert events == [("instance_exit", "worker-1"), ("instance_exit", "worker-0"), ("job_restart", None),
                      ("instance_exit", "worker-0"), ("instance_exit", "worker-1")]
    stopped = [e for e in store.events(JOB) if e["kind"] == "instance_exit" and e["detail"].get("stopped_by_us")]
    assert [e["instance"] for e in stopped] == ["worker-0"]
    assert "ftwatch: stopping all workers" in out and "step 1" in out


def test_the_settle_window_passes_on_the_fake_clock(tmp_path):
    """The decision on a failing exit comes SETTLE_SECONDS after it while a peer still runs."""
    script = script_of({(0, 1): [Say(1, "step 1")], (1, 1): [Exit(2, None, SIGKILL)]}, default=[Exit(1)])
    clock0 = FakeClock().time()
    status, recorder, *_ = run(tmp_path, config(tmp_path), script)
    assert status == 0
    assert recorder.decisions[0].time - clock0 >= 2 + SETTLE_SECONDS - 1e-6


def test_silence_for_the_hang_interval_is_a_hang_decision_then_a_restart(tmp_path):
    """Both ranks print once and then nothing: 60 s of silence later the hang tracker's finding
    opens an incident; the job is stopped and restarted; the restart ends well."""
    cfg = config(tmp_path, {"enable_job_hang_detection": True, "job_hang_interval": 60})
    script = script_of({(0, 1): [Say(1, "step 1")], (1, 1): [Say(1, "step 1")]}, default=[Exit(1)])
    clock0 = FakeClock().time()
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    assert status == 0, out.getvalue()
    hang, done = recorder.decisions
    assert hang.action is Action.RESTART_JOB and hang.root_cause.kind == "hang", hang.policy_clause
    assert 60 <= hang.time - (clock0 + 1) < 61                       # one tick after the interval
    assert done.action is Action.NONE
    assert sup.names() == ["resize", "start_all", "stop_all", "resize", "start_all", "stop_all", "close"]


def test_async_restarts_only_the_failed_instance(tmp_path):
    cfg = config(tmp_path, {"job_execution_mode": "Async"})
    script = script_of({
        (0, 1): [Say(1, "step 1"), Exit(5)],
        (1, 1): [Exit(2, None, SIGKILL)],
        (1, 2): [Say(1, "step 1"), Exit(2)],
    })
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    assert status == 0, out.getvalue()
    assert [d.action for d in recorder.decisions] == [Action.RESTART_INSTANCE, Action.NONE]
    assert sup.names() == ["resize", "start_all", "restart_instance", "stop_all", "close"]
    assert ("restart_instance", 1) in sup.calls
    assert [e["rank"] for e in store.events(JOB) if e["kind"] == "instance_restart"] == [1]


def test_a_restarted_instance_that_exits_0_is_not_blamed_for_its_previous_traceback(tmp_path):
    """Async: rank 1's first process dies with an uncaught traceback and is restarted alone; its
    second process exits 0. That is a success, not an exit status hidden by a pipe: the
    traceback belongs to the process before the restart."""
    cfg = config(tmp_path, {"job_execution_mode": "Async"})
    traceback = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
                 "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5")
    script = script_of({
        (0, 1): [Say(1, "step 1"), Exit(5)],
        (1, 1): [Say(1, traceback, "stderr"), Exit(1.5, 1)],
        (1, 2): [Say(1, "step 1"), Exit(2)],
    })
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    assert status == 0, out.getvalue()
    assert [d.action for d in recorder.decisions] == [Action.RESTART_INSTANCE, Action.NONE], out
    assert "hidden by a pipe" not in out


def test_recover_in_place_restarts_the_failed_rank_while_the_other_runs_on(tmp_path):
    cfg = config(tmp_path, mindcluster={"recover_strategy": "recover-in-place"})
    script = script_of({
        (0, 1): [Say(1, "step 1"), Exit(6)],
        (1, 1): [Exit(2, None, SIGKILL)],
        (1, 2): [Exit(1)],
    })
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    assert status == 0, out.getvalue()
    in_place, done = recorder.decisions
    assert in_place.action is Action.RESTART_IN_PLACE and in_place.target.rank == 1
    assert in_place.policy_clause.endswith("D5 MindCluster recover-in-place → restart rank 1 in place, "
                                           "the other workers run on")
    assert sup.names() == ["resize", "start_all", "restart_instance", "stop_all", "close"]
    assert "ftwatch: restarting rank 1 in place" in out


def test_an_xid_isolates_its_device_and_the_job_restarts_with_fewer_workers(tmp_path):
    """1:2 on devices 0,1: Xid 79 on rank 1 opens an incident while both run; device 1 leaves the
    slots, the job is stopped and restarted (a rescheduling, A2) with one worker on device 0."""
    script = script_of({(0, 1): [Say(1, "step 1")], (1, 1): [Say(1, XID79)]}, default=[Exit(1)])
    status, recorder, sup, store, clock, out = run(tmp_path, config(tmp_path, nproc="1:2"), script)
    assert status == 0, out.getvalue()
    isolate, done = recorder.decisions
    assert isolate.action is Action.ISOLATE_NODE and isolate.root_cause.rule_id.startswith("xid.79")
    assert "A1 local: isolated device 1 (rank 1); restart with 1 worker(s) on 0" in isolate.policy_clause
    resizes = [c for c in sup.calls if c[0] == "resize"]
    assert [(n, env["CUDA_VISIBLE_DEVICES"]) for _, n, env in resizes] == [(2, "0,1"), (1, "0")]
    assert [c for c in sup.calls if c[0] == "start_all"] == [("start_all", 0, False), ("start_all", 1, True)]
    assert [e["detail"]["device"] for e in store.events(JOB) if e["kind"] == "device_isolated"] == ["1"]


def test_an_isolation_below_min_fails_the_job(tmp_path):
    """2 (MIN 2) on devices 0,1: losing device 1 leaves 1 < MIN, so the policy's isolate_node
    becomes fail_job (A1): the job ends, the scene is not restarted."""
    script = script_of({(0, 1): [Say(1, "step 1")], (1, 1): [Say(1, XID79)]})
    status, recorder, sup, store, clock, out = run(tmp_path, config(tmp_path), script)
    assert status == 1, out
    [fail] = recorder.decisions
    assert fail.action is Action.FAIL_JOB
    assert "1 healthy device(s) left, below the minimum 2 of --nproc-per-node 2 → fail_job" in fail.policy_clause
    assert sup.names() == ["resize", "start_all", "stop_all", "stop_all", "close"]


def test_isolations_kept_below_min_fail_before_any_start(tmp_path):
    from ftwatch.pipeline.actuators.slots import Slots
    from ftwatch.config.supervisor import ElasticRange
    Slots.for_job(tmp_path, JOB, ElasticRange(2, 2), ["0", "1"]).isolate("1", rank=1, rule="xid.79")
    status, recorder, sup, store, clock, out = run(tmp_path, config(tmp_path), script_of({}, [Exit(1)]))
    assert status == 1
    [fail] = recorder.decisions
    assert fail.action is Action.FAIL_JOB and fail.policy_clause == (
        "A1 local: devices 0 (isolated: 1 by xid.79): 1 healthy device(s), below the minimum 2 of "
        "--nproc-per-node 2 → fail_job")
    assert "start_all" not in sup.names()


NCCL = ("RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled system "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1")


def test_a_recovered_retry_is_the_policys_notify_and_training_goes_on(tmp_path):
    """MindCluster retry: rank 1 logs a retryable NCCL error while both run; both subscribed
    workers acknowledge and report a step, so the policy's decision is notify (D5) and nothing
    is stopped or restarted."""
    def answers(kind, notice, instance):
        return [{"op": "retry_done", "id": notice["id"], "ok": True, "instance": instance},
                {"op": "report_step", "step": 8, "instance": instance}]
    cfg = config(tmp_path, mindcluster={"recover_strategy": "retry,recover"})
    script = script_of({(0, 1): [Say(1, "step 7"), Exit(4)], (1, 1): [Say(1, NCCL), Exit(4)]})
    clock = FakeClock()
    sup = FakeSupervisor(clock, script, job=JOB)
    control = FakeControl({"retry": {"worker-0", "worker-1"}}, answers)
    recorder = Recorder(SqliteStore(tmp_path / "ftwatch.db"), out=io.StringIO())
    assert build_run(cfg, ["train"], JOB, recorder, out=io.StringIO(), clock=clock, supervisor=sup,
                     control=control).run() == 0
    told, done = recorder.decisions
    assert told.action is Action.NOTIFY and told.root_cause.rule_id == "nccl.unhandled_system_error"
    assert told.policy_clause == ("D5 MindCluster retry: 2 worker(s) recovered in place and resumed "
                                  "(worker-0 at step 8, worker-1 at step 8) → training goes on")
    assert done.action is Action.NONE
    assert [(kind, reached) for kind, _, reached in control.notices] == [("retry", {"worker-0", "worker-1"})]
    assert sup.names() == ["resize", "start_all", "stop_all", "close"]


class _LateExits(FakeSupervisor):
    """A worker's main process ends, but its waiter queues the ProcessExit only later (it waits
    for the last of the output first): until then the worker is gone from ``running()`` while
    ``poll()`` has no exit of it. ``wait_reported`` is what lets the exit through at once."""

    LATE = 30.0

    def _put(self, time, item):
        if isinstance(item, ProcessExit) and not item.stopped_by_us:
            item = dataclasses.replace(item)
            self.late = getattr(self, "late", []) + [item]
            time += self.LATE
        super()._put(time, item)

    def wait_reported(self, timeout):
        now = self.clock.time()
        for late in getattr(self, "late", []):
            self._queue = [(min(t, now) if q is late else t, o, q) for t, o, q in self._queue]
        self.late = []
        return True


def test_an_exit_queued_after_the_decision_stays_in_its_attempt(tmp_path):
    """The worker prints an Xid 79 and exits 1 at once; the decision (isolate_node, on the Xid)
    stops the attempt while that exit is not yet queued. Its exit belongs to the attempt it ended
    in: the next attempt (on the other device) succeeds instead of being failed for an exit 1 of
    the first one (a fresh-clone CI run of test_slurm_run failed that way)."""
    script = script_of({(0, 1): [Say(1, XID79), Exit(1, 1)]},                 # gone when the line is read
                       default=[Say(1, "step 1"), Say(20, "step 2"), Exit(40)])  # outlives the late exit
    cfg = config(tmp_path, {"fault_tolerant_policy": "ExitCodeAndErrorMsg"}, nproc="1")
    clock = FakeClock()
    sup = _LateExits(clock, script, job=JOB)
    out = io.StringIO()
    recorder = Recorder(SqliteStore(tmp_path / "ftwatch.db"), out=out)
    runner = build_run(cfg, ["train"], JOB, recorder, out=out, clock=clock, supervisor=sup, control=FakeControl())
    status = runner.run()
    assert [d.action for d in recorder.decisions] == [Action.ISOLATE_NODE, Action.NONE], out.getvalue()
    assert status == 0, out.getvalue()
