"""N4: write-ahead spooling and background delivery (one worker thread per receiver).

The receivers here are in-process notifiers that block on a ``threading.Event`` the test
controls, so "the caller did not wait for the receiver" is shown by the order of events, never
by timing. Waiting for a worker uses ``Sender.drain`` (or an Event with a deadline).
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

from ftwatch.alerting.notify import (DELIVERED, QUEUED, SHUTDOWN, SPOOLED, DeliveryResult,
                                         Sender)
from ftwatch.alerting.notifiers import ConsoleNotifier
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.spool import Spool
from ftwatch.alerting.alerts import Alert, alert_from_decision
from ftwatch.errors import NotifyError
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target

DEADLINE = 30.0   # seconds a test waits for a worker before failing (never reached when it works)


def make_alert(t: float = 1_795_250_000.5) -> Alert:
    """A restart_job alert whose decision is made at ``t`` (epoch s): a new ``t``, a new id."""
    rc = Finding("exit.sigkill", "exit_code", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB,
                 Severity.ERROR, Origin("worker-1", 1, "job-7", "node-b"), "exited by SIGKILL", t - 1)
    d = Decision(t, Action.RESTART_JOB, Target("job-7"), rc, "Sync: restart the whole job", 1, 2,
                 attempt=1)
    return alert_from_decision(d, f"ftwatch explain {d.decision_id}")


class Gate:
    """A receiver that blocks in ``send`` until the test opens the gate; it notes whether the
    notification was already in the spool when the attempt began."""

    def __init__(self, name: str, spool: Spool | None = None, fail: int = 0, timeout: float = 1.0):
        self.name, self.kind, self.timeout = name, "webhook", timeout
        self.spool = spool
        self.fail = fail                      # the first ``fail`` attempts fail retryably
        self.open = threading.Event()
        self.entered = threading.Event()
        self.sent: list[str] = []
        self.in_spool_at_attempt: list[bool] = []
        self.attempts = 0

    def send(self, n) -> None:
        self.attempts += 1
        if self.spool is not None:
            self.in_spool_at_attempt.append(self.spool.has(n.id))
        self.entered.set()
        assert self.open.wait(DEADLINE), "the test never opened the gate"
        if self.attempts <= self.fail:
            raise NotifyError(f"{self.name}: 503", retryable=True)
        self.sent.append(n.id)


class Results:
    """The sender's results queue, read the way the pipeline reads it (taken, never called
    back); lets a test wait for one receiver's result."""

    def __init__(self):
        self.sender: Sender | None = None
        self.taken: list[DeliveryResult] = []

    @property
    def all(self) -> list[DeliveryResult]:
        self.taken += self.sender.take_results()
        return self.taken

    def wait_for(self, receiver: str, status: str) -> DeliveryResult:
        def found():
            return next((r for r in self.taken if r.receiver == receiver and r.status == status), None)
        while found() is None:
            self.taken.append(self.sender.results.get(timeout=DEADLINE))
        return found()


def background(tmp_path: Path, *notifiers, **kw) -> tuple[Sender, Results]:
    results = Results()
    d = Sender(list(notifiers), TemplateRenderer("en"), kw.pop("spool", None) or Spool(tmp_path / "spool"),
               background=True, **kw)
    results.sender = d
    return d, results


def test_dispatch_returns_before_the_receiver_answers_and_the_spool_has_it_first(tmp_path):
    spool = Spool(tmp_path / "spool")
    slow = Gate("slow", spool)
    d, results = background(tmp_path, slow, spool=spool)
    [r] = d.dispatch(make_alert())
    assert (r.status, r.attempts) == (QUEUED, 0)             # the gate is still shut
    assert [e.id for e in spool.pending()] == [r.notification_id]
    assert results.all == []                                 # "queued" is not an outcome
    assert slow.entered.wait(DEADLINE)
    assert slow.in_spool_at_attempt == [True]                # written ahead of the attempt
    slow.open.set()
    assert d.drain(DEADLINE)
    assert [(x.status, x.attempts) for x in results.all] == [(DELIVERED, 1)]
    assert spool.pending() == [] and slow.sent == [r.notification_id]
    d.close()


def test_the_synchronous_dispatcher_also_writes_ahead(tmp_path):
    spool = Spool(tmp_path / "spool")
    gate = Gate("ops", spool)
    gate.open.set()
    [r] = Sender([gate], TemplateRenderer("en"), spool).dispatch(make_alert())
    assert r.status == DELIVERED and gate.in_spool_at_attempt == [True]
    assert spool.pending() == []


def test_a_slow_receiver_does_not_hold_up_the_others(tmp_path):
    slow, fast = Gate("slow"), Gate("fast")
    fast.open.set()
    d, results = background(tmp_path, slow, fast)
    d.dispatch(make_alert())
    assert slow.entered.wait(DEADLINE)
    results.wait_for("fast", DELIVERED)                      # while slow is still blocked
    assert not slow.open.is_set() and slow.sent == []
    slow.open.set()
    assert d.drain(DEADLINE)
    assert results.wait_for("slow", DELIVERED).attempts == 1
    d.close()


def test_the_console_receiver_stays_in_the_callers_thread(tmp_path):
    out = io.StringIO()
    slow = Gate("slow")
    d, _ = background(tmp_path, ConsoleNotifier(out, name="screen"), slow)
    screen, hook = d.dispatch(make_alert())
    assert (screen.status, hook.status) == (DELIVERED, QUEUED)
    assert "restart_job for job job-7" in out.getvalue()     # printed before dispatch returned
    slow.open.set()
    assert d.drain(DEADLINE)
    d.close()


def test_retries_happen_in_the_worker_with_backoff(tmp_path):
    sleeps: list[float] = []
    flaky = Gate("flaky", fail=2)
    flaky.open.set()
    d, results = background(tmp_path, flaky, sleep=sleeps.append)
    [r] = d.dispatch(make_alert())
    assert r.status == QUEUED
    assert d.drain(DEADLINE)
    assert [(x.status, x.attempts) for x in results.all] == [(DELIVERED, 3)]
    assert len(sleeps) == 2 and 0.4 <= sleeps[0] <= 0.6      # 0.5 s, 2 s, ±20 %
    assert d.spool.pending() == []
    d.close()


def test_close_lets_the_retries_finish_within_its_wait(tmp_path):
    flaky = Gate("flaky", fail=1)
    flaky.open.set()
    d, results = background(tmp_path, flaky, backoff=(0.01,))
    [r] = d.dispatch(make_alert())
    d.close(DEADLINE)                                        # a 503, then the retry is taken
    assert [(x.status, x.attempts) for x in results.all] == [(DELIVERED, 2)]
    assert d.spool.pending() == []


def test_after_closes_wait_the_backoff_is_cut_short_and_the_rest_stays_in_the_spool(tmp_path):
    down = Gate("down", fail=99)
    down.open.set()
    d, results = background(tmp_path, down, backoff=(600.0,))   # a wait close() must cut short
    [r1] = d.dispatch(make_alert(1_795_250_000.5))
    [r2] = d.dispatch(make_alert(1_795_250_100.5))
    assert down.entered.wait(DEADLINE)
    d.close(0)
    assert d.drain(DEADLINE)
    spooled = {x.notification_id: x for x in results.all}
    assert (spooled[r1.notification_id].status, spooled[r1.notification_id].attempts) == (SPOOLED, 1)
    assert (spooled[r2.notification_id].status, spooled[r2.notification_id].error) == (SPOOLED, SHUTDOWN)
    assert down.attempts == 1                                # no retry, no try of the second
    assert sorted(e.id for e in d.spool.pending()) == sorted([r1.notification_id, r2.notification_id])
    # after close, a new alert is still written to the spool (for the next start)
    [late] = d.dispatch(make_alert(1_795_250_200.5))
    assert late.status == SPOOLED and d.spool.has(late.notification_id)


def test_close_waits_at_most_one_notifications_time_at_the_slowest_receiver(tmp_path):
    d, _ = background(tmp_path, ConsoleNotifier(io.StringIO()), Gate("a", timeout=2.0),
                      Gate("b", timeout=1.0))
    assert d.close_wait() == 2.0 * 4 + (0.5 + 2.0 + 5.0) * 1.2   # 4 attempts, backoff +20 %
    d, _ = background(tmp_path, Gate("slow", timeout=100.0))
    assert d.close_wait() == 30.0                                # capped
    d, _ = background(tmp_path, ConsoleNotifier(io.StringIO()))
    assert d.close_wait() == 0.0                                 # nothing in the background


def test_close_does_not_wait_forever_for_a_receiver_that_never_answers(tmp_path):
    hung = Gate("hung")
    d, _ = background(tmp_path, hung)
    [r] = d.dispatch(make_alert())
    assert hung.entered.wait(DEADLINE)
    assert d.close(0.05) == []                               # bounded: returns with it in flight
    assert not d.drain(0) and d.spool.has(r.notification_id)
    hung.open.set()                                          # (lets the daemon thread end)


def test_resend_hands_spooled_notifications_to_the_worker_once(tmp_path):
    spool = Spool(tmp_path / "spool")
    down = Gate("ops", fail=99)
    down.open.set()
    old = Sender([down], TemplateRenderer("en"), spool, max_retries=0)
    a, b = make_alert(1_795_250_000.5), make_alert(1_795_250_100.5)
    ids = [old.dispatch(a)[0].notification_id, old.dispatch(b)[0].notification_id]
    assert [e.id for e in spool.pending()] == ids and down.attempts == 2

    # a receiver still down: one try in the pass, the other one waits for the next pass
    still_down = Gate("ops", fail=99)
    still_down.open.set()
    d, results = background(tmp_path, still_down, spool=spool)
    assert d.resend_pending() == 2
    assert d.drain(DEADLINE)
    assert still_down.attempts == 1 and [e.attempts for e in spool.pending()] == [2, 1]
    d.close()

    # the receiver is back: each is sent once, and nothing is sent twice while in flight
    up = Gate("ops")
    d, results = background(tmp_path, up, spool=spool)
    assert d.resend_pending() == 2
    assert up.entered.wait(DEADLINE)
    assert d.resend_pending() == 0                           # both are with the worker already
    up.open.set()
    assert d.drain(DEADLINE)
    assert up.sent == ids and spool.pending() == []
    assert d.resend_pending() == 0
    assert [(x.notification_id, x.status) for x in results.all] == [(i, DELIVERED) for i in ids]
    d.close()


def test_the_recorder_stores_the_workers_results_not_the_queued_ones(tmp_path):
    """The worker's result reaches the store when the pipeline's thread takes it from the
    queue (the recorder's tick), never from the worker's thread."""
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    store = SqliteStore(tmp_path / "ftwatch.db")
    rec = Recorder(store, out=io.StringIO(), resolve_after=None)
    hook = Gate("ops")
    d = Sender([hook], TemplateRenderer("en"), Spool(tmp_path / "spool"), background=True)
    rec.dispatcher = d
    alert = make_alert()
    rec.decision(alert.decision)
    assert store.deliveries() == []                          # the receiver has not answered yet
    hook.open.set()
    assert d.drain(DEADLINE)
    assert store.deliveries() == []                          # on the queue: no call into the pipeline
    rec.resend_due(0.0)                                      # the pipeline's tick takes it
    assert [(x["receiver"], x["status"]) for x in store.deliveries()] == [("ops", DELIVERED)]
    rec.close()


def test_results_are_written_in_the_pipelines_thread_only(tmp_path):
    """Every sink write, delivery results included, happens in the thread that runs the
    recorder; the delivery worker only puts its result on the queue."""
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.sinks.base import NULL_SINK

    class Threads:
        def __init__(self):
            self.threads: set[str] = set()
            self.records: list = []

        def write(self, batch) -> None:
            NULL_SINK.write(batch)
            self.threads.add(threading.current_thread().name)
            self.records += batch

        def close(self) -> None:
            pass

    sink = Threads()
    hook = Gate("ops")
    hook.open.set()
    d = Sender([hook], TemplateRenderer("en"), Spool(tmp_path / "spool"), background=True)
    rec = Recorder(sink, out=io.StringIO(), dispatcher=d, resolve_after=None)
    rec.decision(make_alert().decision)
    assert d.drain(DEADLINE) and hook.sent
    rec.close()
    assert sink.threads == {threading.current_thread().name}
    assert [r.status for r in sink.records if isinstance(r, DeliveryResult)] == [DELIVERED]
