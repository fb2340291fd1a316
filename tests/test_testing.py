"""``ftwatch.testing``: the shipped doubles behave as the real parts they stand in for, and can fail
a test (a notifier that fails N times, a sink written after close, a batch never acknowledged)."""

from __future__ import annotations

import io
import os
import queue
import subprocess
import sys

import pytest

from ftwatch import clock, testing
from ftwatch.alerting.alerts import alert_from_decision
from ftwatch.alerting.notify import Sender
from ftwatch.alerting.notifiers import Notifier
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.spool import Spool
from ftwatch.errors import NotifyError
from ftwatch.events import Action, FailureClass, Origin, ProcessExit, Target
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.process import Output
from ftwatch.testing import (CaptureNotifier, CaptureSink, FakeClock, ListSource, StoredEvent, decision,
                             finding)
from ftwatch.pipeline.sinks.base import LifecycleEvent


def test_fake_clock_is_the_one_in_ftwatch_clock():
    assert FakeClock is clock.FakeClock
    c = FakeClock()
    assert c.time() == testing.T0 and c.advance(2.5).time == testing.T0 + 2.5


# --------------------------------------------------------------------------- ListSource

def test_list_source_puts_its_batches_on_the_queue_and_sees_the_acks():
    out: queue.Queue = queue.Queue(maxsize=4)
    a = [Shipped(testing.T0, b"step 1", {"job": "a"})]
    b = [Shipped(testing.T0 + 1, b"step 2", {"job": "a"}), Shipped(testing.T0 + 1, b"step 3", {"job": "a"})]
    src = ListSource([a, b], out, name="script")
    src.start()
    assert src.started and src.exhausted and src.handed == 2
    first, second = out.get_nowait(), out.get_nowait()
    assert first == a and second == b and out.empty()
    assert src.acked == 0                     # a consumer that forgets to ack shows up here
    first.ack()
    assert src.acked == 1
    src.stop()
    assert src.stopped


def test_list_source_refuses_a_queue_too_small_and_a_missing_queue():
    with pytest.raises(queue.Full):
        ListSource([[1], [2]], queue.Queue(maxsize=1)).start()
    with pytest.raises(ValueError, match="no queue"):
        ListSource([[1]]).start()


def test_list_source_polls_like_the_supervisor():
    o = testing.origin(0, stream="stdout")
    items = [[Output(o, b"step 1\n", testing.T0)],
             [ProcessExit(o, 100, 1, None, testing.T0 + 1)]]
    src = ListSource(items)
    assert src.poll(0.5) == items[0]
    assert not src.exhausted
    assert src.poll(0.5) == items[1]
    assert src.poll(0.5) == [] and src.exhausted


# --------------------------------------------------------------------------- CaptureSink

def test_capture_sink_keeps_what_the_recorder_writes():
    sink = CaptureSink()
    rec = Recorder(sink, out=io.StringIO(), color=False)
    rec.attempt = 1
    rec.run_started("job-7", 1, testing.T0, ["python", "train.py"])
    f = finding()
    rec.findings([f])
    d = decision(root_cause=f)
    rec.decision(d)
    rec.event(testing.T0 + 2, "job-7", "exit", "worker-1", 1, returncode=-9)
    rec.output(testing.origin(1), 3, 60, testing.T0)
    rec.run_ended("job-7", 1, testing.T0 + 3, "restarted")
    rec.close()
    assert sink.runs == {("job-7", 1): {"started": testing.T0, "command": ["python", "train.py"],
                                        "ended": testing.T0 + 3, "status": "restarted"}}
    assert sink.findings == [f] and sink.finding_attempts == [1]
    assert sink.decisions == [d]
    assert sink.kinds() == ["job_start", "exit"] and sink.kinds("other") == []
    assert sink.events[1] == StoredEvent(testing.T0 + 2, "job-7", "exit", "worker-1", 1, {"returncode": -9})
    assert [row[:2] + row[-2:] for row in sink.output] == [("job-7", "worker-1", 3, 60)]
    assert sink.closed


def test_capture_sink_refuses_writes_after_close():
    sink = CaptureSink()
    sink.close()
    with pytest.raises(RuntimeError, match="after close"):
        sink.write([LifecycleEvent(testing.T0, "j", "late")])
    with pytest.raises(RuntimeError):
        sink.write([decision()])


# --------------------------------------------------------------------------- CaptureNotifier

def dispatcher(tmp_path, *notifiers, **kw) -> tuple[Sender, list[float]]:
    sleeps: list[float] = []
    d = Sender(notifiers, TemplateRenderer("en"), Spool(tmp_path / "spool"), sleep=sleeps.append,
                   now=lambda: testing.T0, **kw)
    return d, sleeps


def an_alert(**kw):
    alert = alert_from_decision(decision(**kw), "ftwatch explain")
    assert alert is not None
    return alert


def test_capture_notifier_is_a_notifier_and_keeps_what_it_is_sent(tmp_path):
    keep = CaptureNotifier("ops")
    assert isinstance(keep, Notifier)
    d, sleeps = dispatcher(tmp_path, keep)
    alert = an_alert()
    [result] = d.dispatch(alert)
    assert result.status == "delivered" and keep.attempts == 1 and sleeps == []
    assert keep.ids == [f"{alert.decision_id}-ops"] and keep.log() == [("job-7", "firing")]


def test_capture_notifier_fails_n_times_then_succeeds(tmp_path):
    keep = CaptureNotifier("ops", fail=2)
    d, sleeps = dispatcher(tmp_path, keep, max_retries=3)
    [result] = d.dispatch(an_alert())
    assert (result.status, result.attempts) == ("delivered", 3)
    assert keep.attempts == 3 and len(keep.sent) == 1 and len(sleeps) == 2
    keep.fail(1, retryable=False)              # a refusal that no retry helps: a dead letter
    [result] = d.dispatch(an_alert(time=testing.T0 + 60))
    assert (result.status, result.attempts) == ("failed", 1) and len(keep.sent) == 1


def test_capture_notifier_raises_the_retryable_error_itself():
    keep = CaptureNotifier(fail=1)
    with pytest.raises(NotifyError) as err:
        keep.send(object())
    assert err.value.retryable and keep.sent == []
    keep.down = True
    with pytest.raises(NotifyError, match="is down"):
        keep.send(object())
    assert keep.attempts == 2


def test_a_down_capture_notifier_leaves_the_alert_in_the_spool(tmp_path):
    keep = CaptureNotifier("ops", max_retries=0)
    keep.down = True
    d, _ = dispatcher(tmp_path, keep)
    [result] = d.dispatch(an_alert())
    assert result.status == "spooled" and keep.sent == []
    keep.down = False
    assert d.resend_pending() == 1 and len(keep.sent) == 1


def test_capture_notifier_notes_the_clock_time_of_each_send():
    c = FakeClock()
    keep = CaptureNotifier(clock=c)
    keep.send("a")
    c.advance(5)
    keep.send("b")
    assert keep.times == [testing.T0, testing.T0 + 5]


# --------------------------------------------------------------------------- builders

def test_finding_defaults_and_overrides():
    f = finding()
    assert (f.rule_id, f.origin, f.time, f.line) == (
        "nccl.unhandled_system_error", Origin("worker-1", 1, "job-7", "node-a", "stderr", "process"),
        testing.T0, "nccl.unhandled_system_error on rank 1")
    g = finding("exit.sigkill", kind="exit_code", line="exited by SIGKILL", rank=3, job="j", node="n",
                failure_class=FailureClass.HARDWARE_NODE, fields={"signal": 9})
    assert (g.kind, g.origin.instance, g.origin.job, g.origin.node, g.fields) == (
        "exit_code", "worker-3", "j", "n", {"signal": 9})


def test_decision_targets_the_job_or_the_instance_by_action():
    d = decision()
    assert d.target == Target("job-7") and d.time == testing.T0 + 1 and d.root_cause == finding()
    inst = decision(Action.RESTART_INSTANCE)
    assert inst.target == Target("job-7", "worker-1", 1, "node-a")
    assert inst.root_cause.action is Action.RESTART_INSTANCE
    spent = decision(Action.FAIL_JOB, None, restarts_left=0)
    assert spent.root_cause is None and spent.target == Target("job-7") and spent.time == testing.T0
    assert spent.to_json()["restarts_left"] == 0


# --------------------------------------------------------------------------- worker commands

def test_the_shared_job_commands_fail_as_named():
    assert subprocess.run(testing.SIGKILL_JOB).returncode == -9
    keyerror = subprocess.run(testing.KEYERROR_JOB, capture_output=True, text=True)
    assert keyerror.returncode == 1 and "KeyError: 'lr'" in keyerror.stderr
    assert subprocess.run(testing.CLEAN_JOB, capture_output=True, text=True).stdout == "ok\n"


def test_the_nccl_crash_worker_kills_rank_1_on_the_first_attempt_only(tmp_path):
    script = testing.write_nccl_crash_worker(tmp_path / "w.py", steps=2, step_seconds=0, loss=True)

    def run(rank: int, attempt: int) -> subprocess.CompletedProcess:
        env = {**os.environ, "RANK": str(rank), "TORCHELASTIC_RESTART_COUNT": str(attempt)}
        return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=30)

    crashed = run(1, 0)
    assert crashed.returncode == -9
    assert crashed.stdout.splitlines() == ["rank 1 attempt 0 step 0 loss 1.000", "rank 1 attempt 0 step 1 loss 0.500",
                                           crashed.stdout.splitlines()[-1]]
    assert "NCCL error in:" in crashed.stdout and "unhandled system error" in crashed.stdout
    retried = run(0, 1)
    assert retried.returncode == 0 and retried.stdout.splitlines()[-1] == "rank 0 done"


def test_fake_supervisor_plays_its_script_on_the_clock_and_a_stop_ends_the_rest():
    """poll() moves the clock to the next scripted item (never past the timeout); a worker with no
    Exit runs until stop_all, which drops what it had not yet printed and reports it stopped."""
    from ftwatch.pipeline.sources.process import Started
    from ftwatch.testing import Exit, FakeSupervisor, Say, script_of
    c = FakeClock()
    sup = FakeSupervisor(c, script_of({(0, 1): [Say(5, "step 1"), Say(50, "never")], (1, 1): [Exit(2, 3)]}), 2)
    sup.start_all(0)
    assert [type(i).__name__ for i in sup.poll(0.2)] == ["Started", "Started"] and c.mono() == 0
    assert sup.poll(1) == [] and c.mono() == 1                         # nothing within the timeout
    [gone] = sup.poll(10)
    assert c.mono() == 2 and isinstance(gone, ProcessExit) and gone.returncode == 3 and sup.running() == {0}
    [out] = sup.poll(10)
    assert isinstance(out, Output) and out.data == b"step 1\n" and out.time == c.time() and c.mono() == 5
    [stopped] = sup.stop_all()
    assert stopped.stopped_by_us and sup.running() == set() and sup.poll(0) == [stopped]
    assert sup.poll(100) == [] and c.mono() == 105                      # "never" was dropped
    sup.restart_instance(1)
    assert isinstance(sup.poll(0)[0], Started) and sup.names() == ["start_all", "stop_all", "restart_instance"]
