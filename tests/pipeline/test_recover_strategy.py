"""MindCluster recover-strategy (SPEC M3, D5; seed 004), elastic local isolation (A1) and the scene
text (A3): the pure parts, golden scenarios with a FakeClock, and the SDK's retry/dump ops over a
real control socket. Real jobs: tests/integration/test_recovery_e2e.py.
"""

from __future__ import annotations

import io
import threading
import time

import pytest
from pydantic import ValidationError

from ftwatch import sdk
from ftwatch.clock import FakeClock
from ftwatch.config.model import Config, load_config
from ftwatch.config.mindcluster import MindClusterConfig, policy_overrides, signal_number
from ftwatch.config.supervisor import ElasticRange, SupervisorConfig, default_devices, parse_elastic_range
from ftwatch.errors import ConfigError
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.sources.control import ControlServer
from ftwatch.pipeline.actuators.recovery import DumpWatch, RecoveryHandler, RetryWatch
from ftwatch.pipeline.actuators.scene import Scene
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.actuators.slots import Slots
from ftwatch.policy.plan import apply_strategies as plan, isolation, retry_candidate
from ftwatch.rules.loader import rules_from_keywords
from ftwatch.rules.timers import HangTracker
from ftwatch.testing import CaptureSink

CLOCK = FakeClock()


def finding(rule="exit.sigkill", kind="exit_code", cls=FailureClass.RETRYABLE_INFRA, action=Action.RESTART_JOB,
            rank=1, severity=Severity.ERROR, line="worker-1 (rank 1) was killed by signal 9 (SIGKILL)"):
    return Finding(rule, kind, cls, action, severity, Origin(f"worker-{rank}", rank, "job", "n1"), line, CLOCK.time())


def decision(action=Action.RESTART_JOB, rank=None, rc=None, clause="D2 policy"):
    rc = rc or finding()
    target = Target("job", f"worker-{rank}" if rank is not None else None, rank, "n1" if rank is not None else None)
    return Decision(CLOCK.time(), action, target, rc, clause, 1, 2, (rc,), 0)


MC = MindClusterConfig


def isolate_devices(decision, slots):
    """What a run does with an ``isolate_node`` decision: the policy picks the devices
    (``isolation`` over ``slots.facts()``), the slots exclude them (``Slots.exclude``)."""
    decided, excluded = isolation(decision, slots.facts())
    slots.exclude(excluded, decided.time, decided.attempt)
    return decided, [e.device for e in excluded]


def isolate(decision, slots):
    """``isolate_devices``, with only the first device isolated (the root cause's), or None."""
    decided, devices = isolate_devices(decision, slots)
    return decided, devices[0] if devices else None


# -- configuration (M3) ------------------------------------------------------------------------------

def test_strategies_are_comma_combined_case_insensitive_in_precedence_order():
    assert MC(recover_strategy="dump, Recover-In-Place").recover_strategy == ["recover-in-place", "dump"]
    assert MC(recover_strategy=["exit", "retry", "retry"]).recover_strategy == ["retry", "exit"]
    assert MC().enabled is False and MC(recover_strategy="exit").enabled


def test_unknown_strategy_is_rejected_naming_the_choices():
    with pytest.raises(ValidationError, match="unknown strategy reschedule; expected a comma-combination of retry"):
        MC(recover_strategy="recover,reschedule")


def test_policy_translation_enables_restarts_only_for_a_recovering_strategy():
    assert policy_overrides(MC()) == {}
    assert policy_overrides(MC(recover_strategy="dump,exit")) == {"enable_job_restart": False}
    assert policy_overrides(MC(recover_strategy="recover-in-place", max_restarts=5)) == {
        "enable_job_restart": True, "max_num_of_job_restart": 5}
    assert policy_overrides(MC(max_restarts=2)) == {"max_num_of_job_restart": 2}


def test_dump_signal_names_and_numbers():
    assert signal_number("SIGUSR1") == signal_number("usr1") == signal_number("10") == 10
    assert MC(dump_signal="usr2").dump_signal == "USR2"
    with pytest.raises(ValidationError, match="unknown signal"):
        MC(dump_signal="SIGNOPE")


def test_yaml_section_and_bad_values_with_file_and_line(tmp_path):
    good = tmp_path / "ok.yaml"
    good.write_text("mindcluster:\n  recover_strategy: recover-in-place,dump\n  max_restarts: 5\n"
                    "  monitor_interval: 10\nsupervisor:\n  nproc_per_node: '2:4'\n  keep_scene_seconds: 30\n")
    config = load_config(good)
    assert config.mindcluster.recover_strategy == ["recover-in-place", "dump"]
    assert config.mindcluster.monitor_interval == 10
    assert config.supervisor.nproc_range == ElasticRange(2, 4) and config.supervisor.keep_scene_seconds == 30
    bad = tmp_path / "bad.yaml"
    bad.write_text("mindcluster:\n  recover_strategy: retry,redo\nsupervisor:\n  nproc_per_node: '4:2'\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    lines = {(i.line, i.message.split(":")[0]) for i in err.value.issues}
    assert lines == {(2, "mindcluster.recover_strategy"), (4, "supervisor.nproc_per_node")}


# -- elastic ranges and slots (A1) ---------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [(3, (3, 3)), ("3", (3, 3)), ("2:4", (2, 4)), (" 1 : 2 ", (1, 2))])
def test_elastic_range_parses(text, expected):
    rng = parse_elastic_range(text)
    assert (rng.min, rng.max) == expected
    assert str(rng) == (str(expected[1]) if expected[0] == expected[1] else f"{expected[0]}:{expected[1]}")


@pytest.mark.parametrize("text, message", [("0", ">= 1"), ("3:2", "MIN must not exceed MAX"), ("a", "N or MIN:MAX"),
                                           ("1:2:3", "N or MIN:MAX"), (True, "N or MIN:MAX"), ("-1", "N or MIN:MAX")])
def test_elastic_range_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_elastic_range(text)


def test_supervisor_nproc_keeps_a_plain_number_an_int():
    assert SupervisorConfig(nproc_per_node="3").nproc_per_node == 3
    assert SupervisorConfig(nproc_per_node="2:3").nproc_per_node == "2:3"
    with pytest.raises(ValidationError):
        SupervisorConfig(nproc_per_node=0)


def test_default_devices_from_the_environment_else_modelled_slots():
    assert default_devices(3, {"CUDA_VISIBLE_DEVICES": "4,5"}) == ["4", "5"]
    assert default_devices(3, {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"}) == ["0", "1", "2", "3"]
    assert default_devices(3, {"CUDA_VISIBLE_DEVICES": ""}) == ["0", "1", "2"]
    assert default_devices(3, {"CUDA_VISIBLE_DEVICES": "-1", "ASCEND_RT_VISIBLE_DEVICES": "4,5"}) == ["4", "5"]


@pytest.mark.parametrize("value", ["", "-1", "-1,0"])
def test_an_environment_that_hides_every_gpu_keeps_it_for_the_workers_and_the_checks(tmp_path, value):
    """Recorded on an H200 (tools/gpu_capture.sh no_gpu): torchrun with CUDA_VISIBLE_DEVICES= gave
    the worker no GPU, but ftwatch run exported its modelled slot 0 and the job trained on GPU 0.
    Hidden GPUs stay hidden: the slots are modelled (isolation still counts workers), the workers'
    variable is the one set, and the checks' agents are put on no device."""
    slots = Slots.for_job(tmp_path, "job", ElasticRange(1, 2), env={"CUDA_VISIBLE_DEVICES": value})
    assert slots.active == ["0", "1"] and slots.nproc == 2
    assert slots.env() == {"CUDA_VISIBLE_DEVICES": value, "ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    assert slots.checked is None
    slots.isolate("1", rank=1, rule="xid.79")
    assert slots.nproc == 1 and slots.env()["CUDA_VISIBLE_DEVICES"] == value
    shown = Slots.for_job(tmp_path, "job2", ElasticRange(1, 2), env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert shown.env()["CUDA_VISIBLE_DEVICES"] == "2,3" and shown.checked == ["2", "3"]


def test_isolating_shrinks_the_job_then_fails_below_min_and_persists(tmp_path):
    """Golden: 2:3 on devices 0,1,2; rank 1's device goes twice; the second time 1 < MIN."""
    slots = Slots.for_job(tmp_path, "job", ElasticRange(2, 3), env={})
    assert slots.env()["CUDA_VISIBLE_DEVICES"] == "0,1,2" and slots.nproc == 3
    xid = finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE,
                  line="NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    d, device = isolate(decision(Action.ISOLATE_NODE, rank=1, rc=xid), slots)
    assert device == "1" and d.action is Action.ISOLATE_NODE
    assert "A1 local: isolated device 1 (rank 1); restart with 2 worker(s) on 0,2 (--nproc-per-node 2:3)" in d.policy_clause
    assert slots.env() == {"CUDA_VISIBLE_DEVICES": "0,2", "ASCEND_RT_VISIBLE_DEVICES": "0,2"}
    # a restarted ftwatch continues the job: the isolation is still there
    again = Slots.for_job(tmp_path, "job", ElasticRange(2, 3), env={})
    assert again.active == ["0", "2"] and again.isolated["1"]["rule"] == "xid.79"
    d2, device2 = isolate(decision(Action.ISOLATE_NODE, rank=1, rc=xid), again)
    assert device2 == "2" and d2.action is Action.FAIL_JOB
    assert "1 healthy device(s) left, below the minimum 2 of --nproc-per-node 2:3 → fail_job" in d2.policy_clause
    assert not again.viable
    again.close("failed")            # the job ended: its next run starts with every device
    assert Slots.for_job(tmp_path, "job", ElasticRange(2, 3), env={}).active == ["0", "1", "2"]


def test_a_spare_device_fills_the_slot(tmp_path):
    slots = Slots([str(i) for i in range(4)], ElasticRange(3, 3))
    d, device = isolate(decision(Action.ISOLATE_NODE, rank=1), slots)
    assert device == "1" and slots.active == ["0", "2", "3"] and d.action is Action.ISOLATE_NODE


def test_isolation_without_a_rank_isolates_nothing_and_other_actions_pass():
    slots = Slots(["0", "1"], ElasticRange(1, 2))
    d, device = isolate(decision(Action.ISOLATE_NODE, rank=None), slots)
    assert device is None and "no device known" in d.policy_clause and slots.active == ["0", "1"]
    same = decision(Action.RESTART_JOB)
    assert isolate(same, slots) == (same, None)


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."


def two_xids(rank_a=1, rank_b=2):
    """An isolate_node decision whose incident has Xid 79 on two ranks (and fallout elsewhere)."""
    a = finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, rank=rank_a, line=XID79)
    b = finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, rank=rank_b, line=XID79)
    fallout = finding("nccl.remote_error", "keyword", FailureClass.FALLOUT, Action.ISOLATE_NODE, rank=0)
    target = Target("job", f"worker-{rank_a}", rank_a, "n1")
    return Decision(CLOCK.time(), Action.ISOLATE_NODE, target, a, "D2 policy", 1, 2, (fallout, a, b), 0)


def test_every_rank_with_an_isolate_level_finding_loses_its_device(tmp_path):
    """CUDA_VISIBLE_DEVICES=4,5,6,7, 2:3: ranks 1 and 2 (devices 5, 6) both print Xid 79 in one
    incident: both devices go at once (not one per restart); fallout on rank 0 isolates nothing."""
    slots = Slots(["4", "5", "6", "7"], ElasticRange(2, 3))
    d, devices = isolate_devices(two_xids(), slots)
    assert devices == ["5", "6"] and d.action is Action.ISOLATE_NODE
    assert slots.active == ["4", "7"]
    assert "isolated device 5 (rank 1), device 6 (rank 2); restart with 2 worker(s) on 4,7" in d.policy_clause


def test_isolating_several_devices_below_min_fails_the_job():
    slots = Slots(["0", "1", "2"], ElasticRange(2, 3))
    d, devices = isolate_devices(two_xids(), slots)
    assert devices == ["1", "2"] and d.action is Action.FAIL_JOB
    assert "1 healthy device(s) left, below the minimum 2 of --nproc-per-node 2:3 → fail_job" in d.policy_clause


def test_too_few_devices_for_min_is_a_config_error():
    with pytest.raises(ConfigError, match="needs at least 3 devices"):
        Slots(["0", "1"], ElasticRange(3, 4))


# -- plans per strategy (D5) ---------------------------------------------------------------------------

def test_without_mindcluster_the_policy_action_stands():
    d = decision()
    same, p = plan(d, MC(), {1}, True)
    assert same is d and p.kind == "job"
    assert plan(decision(Action.FAIL_JOB), MC(), set(), False)[1].kind == "fail"


def test_recover_in_place_restarts_only_the_failed_ranks_while_the_others_run():
    d, p = plan(decision(), MC(recover_strategy="recover-in-place"), {1}, True)
    assert p.kind == "in_place" and p.ranks == (1,)
    assert d.action is Action.RESTART_IN_PLACE and d.target.instance == "worker-1" and d.target.rank == 1
    assert d.policy_clause.endswith("D5 MindCluster recover-in-place → restart rank 1 in place, the other workers run on")


def test_recover_in_place_with_nobody_running_or_a_device_to_exclude_restarts_all():
    mc = MC(recover_strategy="recover-in-place")
    assert plan(decision(), mc, {0, 1}, False)[1].kind == "job"
    d, p = plan(decision(Action.ISOLATE_NODE, rank=1), mc, {1}, True)
    assert p.kind == "job" and "a device must be excluded" in d.policy_clause


def test_recover_restarts_the_job_and_wins_over_in_place_for_isolation():
    d, p = plan(decision(Action.ISOLATE_NODE, rank=1), MC(recover_strategy="recover,recover-in-place"), {1}, True)
    assert p.kind == "job" and "D5 MindCluster recover → restart the job without the isolated device" in d.policy_clause
    d, p = plan(decision(), MC(recover_strategy="recover"), {1}, True)
    assert p.kind == "job" and d.action is Action.RESTART_JOB


def test_exit_stops_and_fails():
    d, p = plan(decision(Action.FAIL_JOB), MC(recover_strategy="dump,exit"), {1}, True)
    assert p.kind == "fail" and "recover-strategy dump,exit: no recover strategy → exit: stop and fail" in d.policy_clause


def test_notify_is_left_alone():
    d = decision(Action.NOTIFY)
    same, p = plan(d, MC(recover_strategy="recover"), set(), True)
    assert same is d and p.kind == "none"


# -- retry (D5) ---------------------------------------------------------------------------------------

def test_retry_answers_live_log_faults_short_of_isolation():
    assert retry_candidate(finding("custom.retryable.link_flap", "keyword"))
    assert retry_candidate(finding("npu.hbm_uce", "fault_code", FailureClass.HARDWARE_NODE, Action.RESTART_IN_PLACE))
    assert not retry_candidate(finding())                                     # an exit: the process is gone
    assert not retry_candidate(finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE))
    assert not retry_candidate(finding("gloo.closed", "keyword", FailureClass.FALLOUT))
    assert not retry_candidate(finding("python.key_error", "keyword", FailureClass.USER_CODE, Action.FAIL_JOB))
    assert not retry_candidate(finding("x", "keyword", severity=Severity.WARNING))


def test_retry_golden_recovered_after_every_worker_acknowledged_and_stepped():
    clock = FakeClock()
    w = RetryWatch("r1", finding("custom.retryable.x", "keyword"), {"worker-0", "worker-1"}, clock.mono(), 10)
    w.step("worker-0", 4)                      # before its answer: not a resumed step
    w.answer("worker-0", True)
    w.answer("worker-9", False, "not asked")   # ignored
    clock.advance(1)
    assert w.outcome(clock.mono()) == "pending"
    w.step("worker-0", 5)
    w.answer("worker-1", True)
    w.step("worker-1", 5)
    assert w.outcome(clock.mono()) == "recovered" and w.stepped == {"worker-0": 5, "worker-1": 5}


def test_retry_golden_fails_on_a_refusal_a_timeout_or_an_exit():
    clock = FakeClock()
    w = RetryWatch("r1", finding(), {"worker-0", "worker-1"}, clock.mono(), 10)
    w.answer("worker-1", False, "RuntimeError: cannot rebuild")
    assert w.outcome(clock.mono()) == "failed: worker-1 could not recover (RuntimeError: cannot rebuild)"
    w = RetryWatch("r2", finding(), {"worker-0", "worker-1"}, clock.mono(), 10)
    w.answer("worker-0", True)
    w.step("worker-0", 3)
    clock.advance(9.9)
    assert w.outcome(clock.mono()) == "pending"
    clock.advance(0.1)
    assert w.outcome(clock.mono()) == "failed: no step from worker-1 within 10 s"
    w = RetryWatch("r3", finding(), {"worker-0"}, clock.mono(), 10)
    w.fail("worker-0 ended (exit 1)")
    assert w.outcome(clock.mono()) == "failed: worker-0 ended (exit 1)"


# -- dump (D5) ----------------------------------------------------------------------------------------

def test_dump_golden_waits_for_everyone_or_the_grace_period():
    clock = FakeClock()
    w = DumpWatch({"worker-0": 10, "worker-2": 12, "worker-3": 13}, clock.mono(), 30)
    w.done("worker-0", "/ckpt/last.pt", True)
    w.exit("worker-2", "exit 0")
    w.done("worker-7", None, True)             # not asked: ignored
    clock.advance(29)
    assert not w.complete(clock.mono())
    clock.advance(1)
    assert w.complete(clock.mono())
    assert w.outcomes() == {"worker-0": "dumped /ckpt/last.pt", "worker-2": "exited (exit 0) without dump_done",
                            "worker-3": "no answer within 30 s"}
    quick = DumpWatch({"worker-0": 10}, clock.mono(), 30)
    quick.done("worker-0", None, False)
    assert quick.complete(clock.mono()) and quick.outcomes() == {"worker-0": "dump failed"}


# -- keep the scene (A3) ----------------------------------------------------------------------------------

def test_scene_text_names_pids_states_and_how_to_attach(tmp_path):
    proc = tmp_path / "proc"
    (proc / "101").mkdir(parents=True)
    (proc / "101" / "stat").write_text("101 (python3) S 1 101 101 0 -1")
    (proc / "102").mkdir()
    (proc / "102" / "stat").write_text("102 (python (x) 3) T 1 102 102 0 -1")
    scene = Scene()
    for rank in (0, 1, 2):
        scene.started(f"worker-{rank}", rank, 101 + rank)
    scene.exited("worker-2", None, 9)
    text = scene.attach_text(30, tmp_path / "state", {"MASTER_PORT": "29500"}, "/work", proc=proc)
    assert "keeping the scene for 30 s" in text
    assert "worker-0 (rank 0)  pid 101  running (sleeping)" in text
    assert "worker-1 (rank 1)  pid 102  stopped (SIGSTOP)" in text
    assert "worker-2 (rank 2)  pid 103  signal SIGKILL" in text
    assert "py-spy dump --pid 101" in text and "gdb -p 102" in text and "gdb -p 103" not in text
    assert f"state dir  {(tmp_path / 'state').resolve()}" in text and "MASTER_PORT=29500" in text
    assert scene.pids() == {"worker-0": 101, "worker-1": 102}


# -- the SDK's retry and dump over a real control socket ------------------------------------------------

def test_on_retry_receives_the_pushed_notice_and_answers_over_the_socket(tmp_path):
    server = ControlServer(tmp_path).start()
    store = CaptureSink()
    recorder = Recorder(store, out=io.StringIO())
    handler = RecoveryHandler(None, HangTracker(None, None), recorder, "job", rules_from_keywords, None,
                              hang_supported=False)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            server.drain(handler)
            time.sleep(0.01)

    threading.Thread(target=loop, daemon=True).start()
    try:
        monitor = sdk.Monitor(socket_path=str(server.path), token=server.token)
        monitor.rank, monitor.instance = 1, "worker-1"
        seen = []
        assert monitor.on_retry(lambda notice: seen.append(notice) or True).ok()
        deadline = time.monotonic() + 5
        while "worker-1" not in server.subscribers.instances("retry") and time.monotonic() < deadline:
            time.sleep(0.01)
        handler.retry = RetryWatch("r1", finding(), {"worker-1"}, 0.0, 60)
        assert server.subscribers.notify("retry", {"id": "r1", "rule": "x"}, {"worker-1"}) == {"worker-1"}
        while not handler.retry.answers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen and seen[0]["event"] == "retry" and seen[0]["id"] == "r1"
        assert handler.retry.answers == {"worker-1": (True, "")}
        assert monitor.report_step(7).ok()
        while not handler.retry.stepped and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handler.retry.outcome(1.0) == "recovered"
        handler.dump = DumpWatch({"worker-1": 1}, 0.0, 30)
        assert monitor.dump_done("/ckpt/last.pt").ok()
        assert handler.dump.outcomes() == {"worker-1": "dumped /ckpt/last.pt"}
        assert store.kinds() == ["retry_done", "dump_done"]
        wrong = sdk.Monitor(socket_path=str(server.path), token="nope")
        assert not wrong.on_retry(lambda n: True).ok()
    finally:
        stop.set()
        server.stop()


def test_on_retry_without_a_monitor_is_a_no_op():
    with pytest.warns(sdk.MonitorUnavailableWarning):
        sdk._warned = False
        assert not sdk.Monitor(socket_path="").on_retry(lambda n: True).ok()


def test_config_default_is_off():
    assert Config().mindcluster.enabled is False and Config().supervisor.keep_scene_seconds == 0



def test_supervisor_resize_starts_fewer_workers_with_the_new_devices():
    import sys

    from ftwatch.pipeline.sources.supervisor import Output, Supervisor
    code = "import os; print(os.environ['WORLD_SIZE'], os.environ['CUDA_VISIBLE_DEVICES'], os.environ['MA_PROC_START_CNT'])"
    with Supervisor([sys.executable, "-c", code], 3, grace_period=1) as sup:
        sup.resize(3, {"CUDA_VISIBLE_DEVICES": "0,1,2"})
        for restart, (n, devices) in enumerate([(3, "0,1,2"), (2, "0,2")]):
            sup.resize(n, {"CUDA_VISIBLE_DEVICES": devices})
            sup.start_all(restart)
            lines, deadline = [], time.monotonic() + 30
            while len(lines) < n and time.monotonic() < deadline:
                lines += [i.data.decode().strip() for i in sup.poll(0.2) if isinstance(i, Output)]
            assert sorted(lines) == [f"{n} {devices} {restart + 1}"] * n
            while sup.running() and time.monotonic() < deadline:
                sup.poll(0.1)
            sup.stop_all()
        with pytest.raises(ValueError):
            sup.resize(0, {})


def test_run_flags_are_validated_together_before_any_worker(tmp_path, capsys):
    from ftwatch.cli import main
    status = main(["run", "--state-dir", str(tmp_path), "--nproc-per-node", "3:2", "--recover-strategy", "foo",
                   "--keep-scene", "-1", "--", "true"])
    err = capsys.readouterr().err
    assert status == 2
    assert "--recover-strategy: unknown strategy foo" in err
    assert "--nproc-per-node: MIN must not exceed MAX" in err and "--keep-scene:" in err
    assert not (tmp_path / "ftwatch.db").exists()
