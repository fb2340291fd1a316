"""Job hang and exit hang (R5) and staged intervals (R6), under a FakeClock."""

from __future__ import annotations

from ftwatch.clock import FakeClock
from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Origin, Severity, iso
from ftwatch.pipeline.sources.control import ControlHandler
from ftwatch.rules.timers import HangTracker

W = [Origin(f"worker-{r}", rank=r, job="j") for r in range(3)]


def start_all(tracker: HangTracker, clock: FakeClock) -> None:
    for o in W:
        tracker.started(o, clock.time())


def test_job_hang_fires_at_the_interval_not_before_and_names_the_first_silent_rank():
    clock = FakeClock()
    t0 = clock.time()
    hang = HangTracker(job_hang_interval=60, exit_hang_interval=None)
    start_all(hang, clock)
    clock.advance(1)
    hang.output("worker-1", clock.time())    # rank 1's last output: t0+1
    clock.advance(1)
    hang.output("worker-0", clock.time())
    hang.output("worker-2", clock.time())    # newest output: t0+2
    clock.advance(59.5)
    assert hang.check(clock.time()) == []
    clock.advance(0.5)                       # exactly 60 s after the newest output
    [f] = hang.check(clock.time())
    assert f.kind == "hang" and f.rule_id == "hang.job"
    assert f.failure_class is FailureClass.HANG and f.action is Action.RESTART_JOB
    assert f.severity is Severity.ERROR
    assert f.origin == W[1]
    assert f.time == clock.time()
    assert f.line == (f"no output from any of 3 instances for 60 s; rank 1 went silent first "
                      f"(last output {iso(t0 + 1)})")
    assert f.fields["interval"] == 60 and f.fields["instances"] == 3
    # once per attempt
    clock.advance(600)
    assert hang.check(clock.time()) == []


def test_any_output_postpones_the_hang():
    clock = FakeClock()
    hang = HangTracker(30, None)
    start_all(hang, clock)
    for _ in range(10):
        clock.advance(29)
        hang.output("worker-2", clock.time())
        assert hang.check(clock.time()) == []
    clock.advance(30)
    [f] = hang.check(clock.time())
    # worker-0 never wrote anything: it went silent first (at its start)
    assert f.origin == W[0] and "no output since its start" in f.line


def test_reset_rearms_and_restarts_the_silence_clock():
    clock = FakeClock()
    hang = HangTracker(10, None)
    start_all(hang, clock)
    clock.advance(10)
    assert len(hang.check(clock.time())) == 1
    hang.reset(clock.time())
    clock.advance(9)
    assert hang.check(clock.time()) == []
    clock.advance(1)
    assert len(hang.check(clock.time())) == 1


def test_staged_interval_takes_effect_at_once():
    clock = FakeClock()
    hang = HangTracker(1800, None)           # init phase: 1800 s
    start_all(hang, clock)
    clock.advance(200)
    assert hang.check(clock.time()) == []
    hang.set_job_hang_interval(180, clock.time())  # training: 180 s; 200 s of silence already counts
    assert [f.rule_id for f in hang.check(clock.time())] == ["hang.job"]


def test_staged_interval_disabled_then_enabled():
    clock = FakeClock()
    hang = HangTracker(60, None)
    start_all(hang, clock)
    hang.set_job_hang_interval(None, clock.time())         # evaluation: off
    clock.advance(10_000)
    assert hang.check(clock.time()) == []
    hang.set_job_hang_interval(-1, clock.time())           # the SDK's -1 also means off
    assert hang.check(clock.time()) == []
    hang.set_job_hang_interval(60, clock.time())           # on again: the silence clock restarts now
    assert hang.check(clock.time()) == []
    clock.advance(59)
    assert hang.check(clock.time()) == []
    clock.advance(1)
    [f] = hang.check(clock.time())
    assert f.fields["silent_for"] == 10_060                 # the finding still tells the real silence
    assert "detection_on_since" in f.fields


def test_leaving_a_disabled_scope_does_not_count_its_silence():
    """interval 180, hang_detect(-1) from t=0 to t=600: no hang at 600.1, a hang at 780."""
    clock = FakeClock()
    hang = HangTracker(180, None)
    start_all(hang, clock)
    handler = ControlHandler(None, hang, None, "j", lambda kw: [], 180, clock=clock.time)
    scope = handler({"op": "hang_detect_push", "seconds": -1, "rank": 0})["scope"]
    clock.advance(600)
    assert handler({"op": "hang_detect_pop", "scope": scope})["job_hang_interval"] == 180
    clock.advance(0.1)
    assert hang.check(clock.time()) == []
    clock.advance(179)
    assert hang.check(clock.time()) == []
    hang.output(W[1].instance, clock.time())                # output inside the new window counts
    clock.advance(179.9)
    assert hang.check(clock.time()) == []
    clock.advance(0.1)
    assert [f.rule_id for f in hang.check(clock.time())] == ["hang.job"]


def test_reset_config_enabling_detection_restarts_the_silence_clock():
    clock = FakeClock()
    hang = HangTracker(None, None)
    start_all(hang, clock)
    handler = ControlHandler(None, hang, None, "j", lambda kw: [], None, clock=clock.time)
    handler.recorder = type("R", (), {"event": lambda *a, **k: None})()
    clock.advance(5000)
    assert handler({"op": "reset_config", "config": {"job_hang_interval": 100}})["ok"]
    clock.advance(99)
    assert hang.check(clock.time()) == []
    clock.advance(1)
    assert len(hang.check(clock.time())) == 1


def test_off_never_fires():
    clock = FakeClock()
    hang = HangTracker(None, None)
    start_all(hang, clock)
    hang.exited(W[0], ok=True, time=clock.time())
    clock.advance(10 ** 7)
    assert hang.check(clock.time()) == []


def test_no_running_instance_no_hang():
    clock = FakeClock()
    hang = HangTracker(10, 10)
    start_all(hang, clock)
    for o in W:
        hang.exited(o, ok=True, time=clock.time())
    clock.advance(100)
    assert hang.check(clock.time()) == []


def test_a_launchers_clean_finish_ends_its_own_workers_only():
    """A pod's torchrun agent (instance ``pod-1``) finished its group: the pod's stream and its
    ranks' (``pod-1/rank0``, ``pod-1/rank1``) stop being timed; ``pod-10`` (a prefix, no ``/``)
    and ``pod-2`` are another launcher's and still hang."""
    clock = FakeClock()
    hang = HangTracker(60, None)
    own = [Origin("pod-1", job="j"), Origin("pod-1/rank0", rank=0, job="j"), Origin("pod-1/rank1", rank=1, job="j")]
    others = [Origin("pod-10", job="j"), Origin("pod-2/rank2", rank=2, job="j")]
    for o in own + others:
        hang.started(o, clock.time())
    clock.advance(5)
    hang.launcher_finished(own[0], clock.time())
    assert hang.running == tuple(others)
    clock.advance(60)
    [f] = hang.check(clock.time())
    assert f.fields["instances"] == 2
    for o in others:
        hang.launcher_finished(o, clock.time())
    assert hang.running == () and not hang.hang_due


def test_a_running_exit_hang_timer_is_still_due():
    """Job-hang detection off: nothing is due until an instance exits 0; then the exit hang is,
    until it fires (``watch`` keeps such a job's state however long it is silent)."""
    clock = FakeClock()
    hang = HangTracker(None, 60)
    start_all(hang, clock)
    assert not hang.hang_due
    hang.exited(W[0], ok=True, time=clock.time())
    assert hang.hang_due
    clock.advance(60)
    [f] = hang.check(clock.time())
    assert f.kind == "exit_hang" and not hang.hang_due


def test_output_from_unknown_or_exited_instance_is_ignored():
    clock = FakeClock()
    hang = HangTracker(10, None)
    hang.started(W[0], clock.time())
    hang.exited(W[0], ok=False, time=clock.time())
    hang.started(W[1], clock.time())
    clock.advance(5)
    hang.output("worker-0", clock.time())
    hang.output("nobody", clock.time())
    clock.advance(5)
    [f] = hang.check(clock.time())
    assert f.origin == W[1] and "any of 1 instance " in f.line


def test_exit_hang_fires_at_the_interval_after_the_first_ok_exit():
    clock = FakeClock()
    hang = HangTracker(None, 600)
    start_all(hang, clock)
    clock.advance(100)
    hang.output("worker-2", clock.time())
    hang.exited(W[0], ok=True, time=clock.time())   # first success: the exit-hang timer starts
    clock.advance(50)
    hang.exited(W[2], ok=True, time=clock.time())   # a later success does not move it
    clock.advance(549)
    assert hang.check(clock.time()) == []
    clock.advance(1)
    [f] = hang.check(clock.time())
    assert f.kind == "exit_hang" and f.rule_id == "hang.exit"
    assert f.failure_class is FailureClass.HANG and f.action is Action.RESTART_JOB
    assert f.origin == W[1]                           # the one still running
    assert "1 still running" in f.line and "rank 1" in f.line
    clock.advance(1000)
    assert hang.check(clock.time()) == []             # once per attempt


def test_exit_hang_names_the_instance_silent_longest():
    clock = FakeClock()
    hang = HangTracker(None, 10)
    start_all(hang, clock)
    clock.advance(1)
    hang.output("worker-1", clock.time())
    hang.exited(W[0], ok=True, time=clock.time())
    clock.advance(10)
    [f] = hang.check(clock.time())
    assert f.origin == W[2]                           # never spoke, silent since the start


def test_failed_exit_does_not_start_the_exit_hang_timer():
    clock = FakeClock()
    hang = HangTracker(None, 10)
    start_all(hang, clock)
    hang.exited(W[0], ok=False, time=clock.time())
    clock.advance(100)
    assert hang.check(clock.time()) == []


def test_exit_hang_cleared_by_reset():
    clock = FakeClock()
    hang = HangTracker(None, 10)
    start_all(hang, clock)
    hang.exited(W[0], ok=True, time=clock.time())
    hang.reset(clock.time())
    hang.started(W[0], clock.time())
    clock.advance(100)
    assert hang.check(clock.time()) == []


def test_both_timers_in_one_check():
    clock = FakeClock()
    hang = HangTracker(60, 60)
    start_all(hang, clock)
    hang.exited(W[0], ok=True, time=clock.time())
    clock.advance(60)
    assert sorted(f.kind for f in hang.check(clock.time())) == ["exit_hang", "hang"]


def test_from_policy():
    off = HangTracker.from_policy(PolicyConfig())
    assert off.job_hang_interval is None and off.exit_hang_interval is None
    on = HangTracker.from_policy(PolicyConfig(enable_job_hang_detection=True, job_hang_interval=60,
                                              enable_job_exit_hang_detection=True))
    assert on.job_hang_interval == 60 and on.exit_hang_interval == 600
    async_ = HangTracker.from_policy(PolicyConfig(job_execution_mode="Async", enable_job_hang_detection=True,
                                                  enable_job_exit_hang_detection=True))
    assert async_.job_hang_interval is None and async_.exit_hang_interval is None
