"""N2/N4: the webhook receiver against a real local HTTP server, retries, the spool, dead letters."""

from __future__ import annotations

import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from ftwatch.alerting.alerts import Alert, alert_from_decision
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.notify import DeliveryResult, Sender
from ftwatch.alerting.notifiers import ConsoleNotifier, WebhookNotifier, build_notifiers
from ftwatch.alerting.spool import Spool
from ftwatch.events import (Action, Decision, FailureClass, Finding, Origin, Severity, Target)

SECRET = "Bearer s3cr3t-t0ken-value"
TOKEN = "q-t0ken-abcdef"


class Receiver:
    """A real HTTP server on 127.0.0.1: answers with scripted statuses, records every request."""

    def __init__(self):
        self.script: list[int] = []      # statuses to answer, one per request
        self.default = 200               # once the script is used up
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with owner.lock:
                    owner.requests.append({"path": self.path, "headers": dict(self.headers),
                                           "json": json.loads(body)})
                    status = owner.script.pop(0) if owner.script else owner.default
                payload = b'{"ok": true}' if status < 300 else b'{"error": "nope"}'
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "3")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,),
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook?access_token={TOKEN}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def make_alert(t: float = 1_795_250_000.5) -> Alert:
    rc = Finding("nccl.unhandled_system_error", "keyword", FailureClass.RETRYABLE_INFRA,
                 Action.RESTART_JOB, Severity.ERROR, Origin("worker-1", 1, "job-7", "node-b"),
                 "NCCL error: unhandled system error", t - 3, 4, ("Traceback:", "NCCL error"),
                 {"op": "allreduce"})
    fallout = Finding("gloo.peer_closed", "keyword", FailureClass.FALLOUT, Action.RESTART_JOB,
                      Severity.ERROR, Origin("worker-0", 0, "job-7", "node-a"),
                      "Connection closed by peer", t - 1)
    d = Decision(t, Action.RESTART_JOB, Target("job-7"), rc, "Sync: restart the whole job",
                 1, 2, (fallout,), attempt=1)
    alert = alert_from_decision(d, f"ftwatch explain --state-dir /s {d.decision_id}")
    assert alert is not None
    return alert


class Recorder:
    """The sleeps a sender took and the results it put on its queue."""

    def __init__(self):
        self.sleeps: list[float] = []
        self.sender: Sender | None = None
        self._results: list[DeliveryResult] = []

    @property
    def results(self) -> list[DeliveryResult]:
        self._results += self.sender.take_results()
        return self._results


def make_dispatcher(url: str, spool_dir: Path, rec: Recorder, **kw) -> Sender:
    hook = WebhookNotifier("ops-hook", url, headers={"Authorization": SECRET}, timeout=5.0)
    rec.sender = Sender([hook], TemplateRenderer("en"), Spool(spool_dir), sleep=rec.sleeps.append,
                        now=lambda: 1_795_260_000.0, **kw)
    return rec.sender


def test_200_is_delivered_with_key_and_body(receiver: Receiver, tmp_path: Path):
    rec = Recorder()
    alert = make_alert()
    [result] = make_dispatcher(receiver.url, tmp_path / "spool", rec).dispatch(alert)
    assert (result.status, result.attempts, result.error) == ("delivered", 1, "")
    assert result.notification_id == f"{alert.decision_id}-ops-hook"
    assert result.decision_id == alert.decision_id and "NCCL error" in result.text
    assert rec.sleeps == [] and rec.results == [result]
    [req] = receiver.requests
    assert req["path"] == f"/hook?access_token={TOKEN}"
    assert req["headers"]["Idempotency-Key"] == result.notification_id
    assert req["headers"]["Authorization"] == SECRET
    assert req["headers"]["Content-Type"] == "application/json"
    body = req["json"]
    assert set(body) == {"id", "receiver", "status", "labels", "annotations", "startsAt",
                         "endsAt", "text", "decision"}
    assert body["id"] == result.notification_id and body["receiver"] == "ops-hook"
    assert body["status"] == "firing" and body["endsAt"] is None
    assert body["startsAt"] == "2026-11-21T08:33:20.500+00:00"
    assert body["labels"]["alertname"] == "ftwatch_restart_job"
    assert body["labels"]["rule_id"] == "nccl.unhandled_system_error"
    assert body["annotations"]["root_cause_line"] == "NCCL error: unhandled system error"
    assert body["decision"] == alert.decision.to_json()
    assert body["text"] == TemplateRenderer("en").render("webhook", alert)
    assert Spool(tmp_path / "spool").pending() == []


def test_500_twice_then_200_is_delivered_after_retries(receiver: Receiver, tmp_path: Path):
    receiver.script = [500, 503]
    rec = Recorder()
    [result] = make_dispatcher(receiver.url, tmp_path / "spool", rec).dispatch(make_alert())
    assert (result.status, result.attempts) == ("delivered", 3)
    assert len(rec.sleeps) == 2
    assert 0.4 <= rec.sleeps[0] <= 0.6 and 1.6 <= rec.sleeps[1] <= 2.4  # 0.5 s, 2 s, ±20 %
    keys = {r["headers"]["Idempotency-Key"] for r in receiver.requests}
    assert len(receiver.requests) == 3 and keys == {result.notification_id}
    assert Spool(tmp_path / "spool").pending() == []


def test_429_honours_retry_after(receiver: Receiver, tmp_path: Path):
    receiver.script = [429]
    rec = Recorder()
    [result] = make_dispatcher(receiver.url, tmp_path / "spool", rec).dispatch(make_alert())
    assert result.status == "delivered" and result.attempts == 2
    assert rec.sleeps == [pytest.approx(3.0)]


def test_always_500_is_spooled_then_resent_exactly_once_by_a_new_dispatcher(
        receiver: Receiver, tmp_path: Path):
    receiver.default = 500
    spool_dir = tmp_path / "spool"
    rec = Recorder()
    alert = make_alert()
    [result] = make_dispatcher(receiver.url, spool_dir, rec).dispatch(alert)
    assert (result.status, result.attempts) == ("spooled", 4)  # 1 try + max_retries=3
    assert "HTTP 500" in result.error
    assert len(rec.sleeps) == 3 and 4.0 <= rec.sleeps[2] <= 6.0
    [entry] = Spool(spool_dir).pending()
    assert entry.id == result.notification_id and entry.attempts == 4
    assert entry.notification.alert.decision == alert.decision  # exact round trip
    assert len(receiver.requests) == 4

    # Still down: a resend pass counts one more attempt and keeps it.
    rec2 = Recorder()
    assert make_dispatcher(receiver.url, spool_dir, rec2).resend_pending() == 0
    assert Spool(spool_dir).pending()[0].attempts == 5 and rec2.sleeps == []
    assert len(receiver.requests) == 5

    # The server is back: a fresh dispatcher (a restarted ftwatch) delivers it once.
    receiver.default = 200
    rec3 = Recorder()
    assert make_dispatcher(receiver.url, spool_dir, rec3).resend_pending() == 1
    assert [r.status for r in rec3.results] == ["delivered"]
    assert rec3.results[0].attempts == 6
    assert len(receiver.requests) == 6
    last = receiver.requests[-1]
    assert last["headers"]["Idempotency-Key"] == result.notification_id
    assert last["json"]["decision"] == alert.decision.to_json()
    assert Spool(spool_dir).pending() == []
    # Acked: never sent again, by this dispatcher or another.
    assert make_dispatcher(receiver.url, spool_dir, Recorder()).resend_pending() == 0
    assert len(receiver.requests) == 6


def test_resend_skips_a_receiver_that_is_still_down(receiver: Receiver, tmp_path: Path):
    receiver.default = 500
    spool_dir = tmp_path / "spool"
    d = make_dispatcher(receiver.url, spool_dir, Recorder(), max_retries=0)
    d.dispatch(make_alert(1_795_250_000.0))
    d.dispatch(make_alert(1_795_250_100.0))
    assert len(Spool(spool_dir).pending()) == 2 and len(receiver.requests) == 2
    assert d.resend_pending() == 0
    assert len(receiver.requests) == 3  # one try, then the receiver is skipped in this pass


def test_dispatching_a_pending_notification_again_does_not_send_it(receiver: Receiver,
                                                                   tmp_path: Path):
    receiver.default = 500
    d = make_dispatcher(receiver.url, tmp_path / "spool", Recorder(), max_retries=0)
    alert = make_alert()
    d.dispatch(alert)
    [again] = d.dispatch(alert)
    assert again.status == "spooled" and len(receiver.requests) == 1


def test_400_fails_at_once_as_a_dead_letter_without_leaking_secrets(receiver: Receiver,
                                                                     tmp_path: Path):
    receiver.script = [400]
    rec = Recorder()
    spool_dir = tmp_path / "spool"
    d = make_dispatcher(receiver.url, spool_dir, rec)
    [result] = d.dispatch(make_alert())
    assert (result.status, result.attempts) == ("failed", 1)
    assert "HTTP 400" in result.error
    assert SECRET not in result.error and TOKEN not in result.error
    assert "access_token=***" in result.error
    assert rec.sleeps == [] and len(receiver.requests) == 1
    spool = Spool(spool_dir)
    assert spool.pending() == []
    [dead] = spool.dead_letters()
    assert dead.id == result.notification_id and dead.attempts == 1
    assert d.resend_pending() == 0 and len(receiver.requests) == 1
    for path in spool_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text()


def test_connection_refused_is_retryable_and_spooled(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rec = Recorder()
    [result] = make_dispatcher(f"http://127.0.0.1:{port}/x", tmp_path / "spool", rec,
                               max_retries=1).dispatch(make_alert())
    assert (result.status, result.attempts) == ("spooled", 2)
    assert "unreachable" in result.error and SECRET not in result.error
    assert len(Spool(tmp_path / "spool").pending()) == 1


def test_receivers_are_independent_and_broken_override_falls_back(receiver: Receiver,
                                                                  tmp_path: Path):
    receiver.default = 500
    bad = tmp_path / "bad.j2"
    bad.write_text("{{ nope }}\n")
    out = io.StringIO()
    d = Sender([ConsoleNotifier(out, name="screen"),
                    WebhookNotifier("ops-hook", receiver.url)],
                   TemplateRenderer("en", {"console": bad}), Spool(tmp_path / "spool"),
                   max_retries=0, sleep=lambda s: None)
    screen, hook = d.dispatch(make_alert())
    assert (screen.status, hook.status) == ("delivered", "spooled")
    assert "NCCL error: unhandled system error" in out.getvalue()  # built-in template used


def test_spool_survives_corrupt_files_and_leaves_no_temp_files(tmp_path: Path):
    spool = Spool(tmp_path / "spool")
    (tmp_path / "spool" / "garbage.json").write_text("{not json")
    n = Sender([WebhookNotifier("w", "http://127.0.0.1:9/")], TemplateRenderer(), spool).render(
        "w", make_alert())
    spool.put(n, attempts=2, error="boom")
    spool.put(n, attempts=3, error="boom again")
    [entry] = spool.pending()
    assert (entry.attempts, entry.last_error) == (3, "boom again")
    assert (tmp_path / "spool" / "dead" / "garbage.json.corrupt").exists()
    assert {p.name for p in (tmp_path / "spool").iterdir()} == {"dead", f"{n.id}.json"}
    assert spool.ack(n.id) and not spool.ack(n.id)
    assert Spool(tmp_path / "spool").pending() == []


def test_repr_and_url_redaction():
    hook = WebhookNotifier("w", f"https://user:pw@example.test/x?access_token={TOKEN}",
                           headers={"Authorization": SECRET})
    assert TOKEN not in repr(hook) and "pw" not in repr(hook) and SECRET not in repr(hook)


def test_a_receivers_own_max_retries_wins(receiver: Receiver, tmp_path: Path):
    receiver.default = 500
    hook = WebhookNotifier("h", receiver.url, max_retries=1)
    sleeps: list[float] = []
    d = Sender([hook], TemplateRenderer(), Spool(tmp_path / "s"), sleep=sleeps.append)
    [result] = d.dispatch(make_alert())
    assert (result.status, result.attempts, len(sleeps)) == ("spooled", 2, 1)


class _Model:
    """Stands for a pydantic receiver model (anything with model_dump)."""

    def __init__(self, **data):
        self.data = data

    def model_dump(self):
        return dict(self.data)


def test_build_notifiers_from_config_entries(receiver: Receiver):
    out = io.StringIO()
    screen, hook = build_notifiers(
        [{"type": "console", "name": "screen"},
         _Model(type="webhook", name="ops", url=receiver.url, headers={"Authorization": SECRET},
                timeout=2.0, max_retries=5)], out=out)
    assert isinstance(screen, ConsoleNotifier) and screen.stream is out and not screen.color
    assert isinstance(hook, WebhookNotifier)
    assert (hook.name, hook.timeout, hook.max_retries) == ("ops", 2.0, 5)
    assert hook.headers == {"Authorization": SECRET}
    with pytest.raises(ValueError, match="unknown type"):
        build_notifiers([{"type": "pager", "name": "p"}])
    with pytest.raises(ValueError, match="missing field 'url'") as info:
        build_notifiers([{"type": "webhook", "name": "w"}])
    assert SECRET not in str(info.value)
