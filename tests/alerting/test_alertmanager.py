"""N2: the Alertmanager receiver against the real Debian ``prometheus-alertmanager``.

Each test that needs it starts its own Alertmanager on a free loopback port (own storage path,
clustering off) whose only route is a webhook served by the test, with ``send_resolved``; waits
use deadlines, never fixed sleeps. Without the binary those tests skip (``make test-deps``
installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from ftwatch.alerting.alerts import Notification, sample_alert
from ftwatch.alerting.notify import Sender
from ftwatch.alerting.notifiers import AlertmanagerNotifier, build_notifiers
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.spool import Spool
from ftwatch.config.model import AlertingConfig
from ftwatch.events import Action, Decision, Origin, Target
from ftwatch.pipeline.recorder import Recorder
from ftwatch.testing import CaptureNotifier, decision, finding

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_alert_delivery import Hook, free_port  # noqa: E402

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_am = pytest.mark.skipif(BINARY is None, reason="prometheus-alertmanager is not installed "
                              "(`make test-deps` installs the Debian package)")


class Alertmanager:
    """A real Alertmanager routing everything to ``hook`` (group_wait 1s, send_resolved)."""

    def __init__(self, tmp: Path, hook: Hook):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "am.yml"
        config.write_text(
            "route:\n  receiver: hook\n  group_by: [alertname, job]\n"
            "  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n"
            "receivers:\n  - name: hook\n    webhook_configs:\n"
            f"      - url: http://127.0.0.1:{hook.port}/am\n        send_resolved: true\n",
            encoding="utf-8")
        self.log = (tmp / "am.log").open("wb")
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={config}", f"--storage.path={tmp / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
             "--log.level=warn"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"alertmanager did not start: {(tmp / 'am.log').read_text()}")
            time.sleep(0.05)

    def alerts(self, job: str) -> list[dict]:
        """The active alerts of ``job`` (GET /api/v2/alerts)."""
        r = httpx.get(f"{self.url}/api/v2/alerts", params={"filter": f'job="{job}"'}, timeout=5)
        r.raise_for_status()
        return r.json()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


@pytest.fixture
def am(tmp_path: Path, hook: Hook):
    if BINARY is None:
        pytest.skip("prometheus-alertmanager is not installed (`make test-deps` installs it)")
    a = Alertmanager(tmp_path, hook)
    yield a
    a.close()


def until(condition, deadline: float = 30.0, what: str = "condition"):
    """Poll ``condition`` until it returns something truthy (fails after ``deadline`` s)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def am_posts(hook: Hook, status: str) -> list[dict]:
    """The Alertmanager webhook payloads with ``status`` received so far."""
    bodies = [json.loads(r["raw"]) for r in list(hook.requests) if r["path"] == "/am"]
    return [b for b in bodies if b["status"] == status]


def fresh_alert(t: float | None = None):
    """The sample alert (a restart after an NCCL error) starting now."""
    return replace(sample_alert(), starts_at=time.time() if t is None else t)


def render(alert, receiver: str = "am") -> Notification:
    text = TemplateRenderer("en").render("alertmanager", alert)
    return Notification(receiver, alert, text.splitlines()[0], text, f"{alert.decision_id}-{receiver}")


# --------------------------------------------------------------------------- payload


def test_payload_labels_annotations_and_ends_at():
    n = AlertmanagerNotifier("am", "http://am:9093/", resolve_after=120, labels={"team": "ml"})
    assert n.request_url() == "http://am:9093/api/v2/alerts"
    alert = sample_alert()
    [item] = n.payload(render(alert))
    assert item["labels"] == {
        "alertname": "job_restart", "job": "demo-job", "severity": "warning",
        "action": "restart_job", "failure_class": "retryable_infra",
        "rule_id": "nccl.unhandled_system_error", "team": "ml"}   # empty instance/node left out
    a = item["annotations"]
    assert a["summary"] == "restart_job for job demo-job: nccl.unhandled_system_error on worker-1"
    assert "Restarts left: 2" in a["description"] and "NCCL error" in a["description"]
    assert a["root_cause"] == ("torch.distributed.DistBackendError: NCCL error: unhandled system error "
                               "(instance worker-1, rank 1, node node-a, at 2026-11-21T08:36:03.735+00:00)")
    assert a["explain"].startswith("ftwatch explain") and a["decision_id"] == alert.decision_id
    assert item["startsAt"] == "2026-11-21T08:36:05.735+00:00"
    assert item["endsAt"] == "2026-11-21T08:38:05.735+00:00"           # startsAt + resolve_after
    assert "generatorURL" not in item                                   # a command is no URL
    [resolved] = n.payload(render(alert.resolve(alert.starts_at + 30)))
    assert resolved["labels"] == item["labels"] and resolved["endsAt"] == "2026-11-21T08:36:35.735+00:00"

    failed = replace(alert, decision=replace(alert.decision, action=Action.FAIL_JOB),
                     labels={**alert.labels, "action": "fail_job", "severity": "critical",
                             "event_type": "job_failed"},
                     annotations={**alert.annotations, "explain": "https://reports.example/r/1"})
    [item] = n.payload(render(failed))
    assert item["labels"]["alertname"] == "job_failed" and "endsAt" not in item
    assert item["generatorURL"] == "https://reports.example/r/1"


def test_config_builds_the_notifier():
    cfg = AlertingConfig.model_validate({"receivers": [
        {"type": "alertmanager", "name": "am", "url": "http://127.0.0.1:9093", "labels": {"env": "prod"}}]})
    [r] = cfg.receivers
    assert (r.resolve_after, r.timeout, r.max_retries) == (300.0, 5.0, 3)
    [n] = build_notifiers(cfg.receivers)
    assert isinstance(n, AlertmanagerNotifier) and n.static_labels == {"env": "prod"}
    with pytest.raises(ValueError):
        AlertingConfig.model_validate({"receivers": [{"type": "alertmanager", "name": "am",
                                                      "url": "am:9093"}]})


def test_resolve_after_takes_the_route_timings_durations():
    """`resolve_after` reads like `group_wait`: seconds, or 30s / 5m / 1h (one parser)."""
    def resolve_after(value):
        return AlertingConfig.model_validate({"receivers": [
            {"type": "alertmanager", "name": "am", "url": "http://am:9093", "resolve_after": value}]}
        ).receivers[0].resolve_after
    assert [resolve_after(v) for v in ("1h", "5m", "30s", "1h30m", 90, "120")] == [
        3600, 300, 30, 5400, 90, 120]
    for bad in ("soon", "0s", -5, "1 hour"):
        with pytest.raises(ValueError):
            resolve_after(bad)
    [n] = build_notifiers([{"type": "alertmanager", "name": "am", "url": "http://am:9093",
                            "resolve_after": "2m"}])
    assert n.resolve_after == 120
    with pytest.raises(ValueError, match="receiver 'am' .*resolve_after"):
        build_notifiers([{"type": "alertmanager", "name": "am", "url": "http://am:9093",
                          "resolve_after": "later"}])


def restart_decision(t: float, instance: str = "worker-1") -> Decision:
    rc = finding("exit.sigkill", kind="exit_code", line="exited by SIGKILL", time=t - 1,
                 at=Origin(instance, 1, "job-r", "node-a"))
    return decision(Action.RESTART_JOB, rc, time=t, clause="restart")


def test_recorder_resolves_open_alerts_after_a_quiet_period(tmp_path: Path):
    rec = CaptureNotifier("rec")
    recorder = Recorder(dispatcher=Sender([rec], TemplateRenderer("en"), Spool(tmp_path / "s")),
                        out=open(os.devnull, "w"), resolve_after=300)
    t0 = 1_795_250_000.0
    recorder.decision(restart_decision(t0))
    assert recorder.resolve_due(t0 + 200) == 0
    recorder.decision(restart_decision(t0 + 250))        # a new incident: the quiet period restarts
    assert recorder.resolve_due(t0 + 400) == 0
    assert recorder.resolve_due(t0 + 550) == 1            # same labels: one open alert
    assert [n.alert.status for n in rec.sent] == ["firing", "firing", "resolved"]
    resolved = rec.sent[-1]
    assert resolved.alert.ends_at == t0 + 550 and resolved.id.endswith("~resolved")
    assert resolved.body.startswith("[RESOLVED]")
    assert recorder.resolve_due(t0 + 5000) == 0 and recorder.resolve_open(t0 + 5001) == 0
    fail = Decision(t0 + 600, Action.FAIL_JOB, Target("job-r"), None, "budget spent", 3, 0)
    recorder.decision(fail)                               # job_failed never resolves
    assert recorder.resolve_open(t0 + 700) == 0 and len(rec.sent) == 4


# --------------------------------------------------------------------------- real Alertmanager


@needs_am
@pytest.mark.slow
def test_alert_reaches_alertmanager_and_its_webhook_then_resolves(am: Alertmanager, hook: Hook,
                                                                   tmp_path: Path):
    n = AlertmanagerNotifier("am", am.url, resolve_after=600, labels={"team": "ml"})
    d = Sender([n], TemplateRenderer("en"), Spool(tmp_path / "spool"), sleep=lambda s: None)
    alert = fresh_alert()
    [result] = d.dispatch(alert)
    assert result.status == "delivered", result.error
    [shown] = until(lambda: am.alerts("demo-job"), what="the alert in GET /api/v2/alerts")
    assert shown["labels"] == {"alertname": "job_restart", "job": "demo-job", "severity": "warning",
                               "action": "restart_job", "failure_class": "retryable_infra",
                               "rule_id": "nccl.unhandled_system_error", "team": "ml"}
    assert shown["annotations"]["summary"].startswith("restart_job for job demo-job")
    assert shown["status"]["state"] in ("active", "unprocessed")
    assert [r["name"] for r in shown["receivers"]] == ["hook"]
    [firing] = until(lambda: am_posts(hook, "firing"), what="the firing webhook from Alertmanager")
    assert firing["alerts"][0]["labels"]["alertname"] == "job_restart"
    assert "NCCL error" in firing["alerts"][0]["annotations"]["root_cause"]

    [result] = d.dispatch(alert.resolve(time.time()))
    assert result.status == "delivered", result.error
    until(lambda: not am.alerts("demo-job"), what="the alert to leave the active list")
    [resolved] = until(lambda: am_posts(hook, "resolved"), what="the resolved webhook")
    [a] = resolved["alerts"]
    assert a["status"] == "resolved" and a["labels"] == shown["labels"]
    assert a["endsAt"] <= time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1))


@needs_am
@pytest.mark.slow
def test_an_invalid_alert_is_refused_with_400_and_not_retried(am: Alertmanager, tmp_path: Path):
    n = AlertmanagerNotifier("am", am.url, labels={"bad-label": "x"})   # not a label name
    spool = Spool(tmp_path / "spool")
    [result] = Sender([n], TemplateRenderer("en"), spool, sleep=lambda s: None).dispatch(fresh_alert())
    assert (result.status, result.attempts) == ("failed", 1) and "400" in result.error
    assert len(list(spool.dead_dir.glob("*.json"))) == 1


@needs_am
@pytest.mark.slow
def test_ftwatch_run_restart_fires_and_resolves_when_the_job_succeeds(am: Alertmanager, hook: Hook,
                                                                      tmp_path: Path):
    """The whole path: a real `ftwatch run` whose first attempt is SIGKILLed and whose second
    succeeds; the restart alert reaches Alertmanager and resolves when the job finishes."""
    from test_alert_delivery import run_job
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("alerting:\n  receivers:\n"
                   f"    - {{type: alertmanager, name: am, url: '{am.url}', max_retries: 0,"
                   " labels: {cluster: test}}\n"
                   f"    - {{type: webhook, name: ops, url: 'http://127.0.0.1:{hook.port}/ftwatch',"
                   " max_retries: 0}\n", encoding="utf-8")
    job = [sys.executable, "-c",
           "import os, signal, time\n"
           "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0': os.kill(os.getpid(), signal.SIGKILL)\n"
           "time.sleep(3)\n"]   # the second attempt runs long enough for AM to notify the firing
    proc = run_job(tmp_path, job, "--config", str(cfg), "--job-id", "am-job",
                   "--enable-job-restart=True", "--max-num-of-job-restart=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "alert(s) resolved (the job finished successfully)" in proc.stdout
    own = [json.loads(r["raw"]) for r in hook.requests if r["path"] == "/ftwatch"]
    assert [b["status"] for b in own] == ["firing", "resolved"]
    assert own[1]["endsAt"] is not None and own[0]["labels"] == own[1]["labels"]
    [firing] = until(lambda: am_posts(hook, "firing"), what="AM's firing webhook")
    assert firing["alerts"][0]["labels"]["alertname"] == "job_restart"
    assert firing["alerts"][0]["labels"]["cluster"] == "test"
    [resolved] = until(lambda: am_posts(hook, "resolved"), what="AM's resolved webhook")
    assert resolved["alerts"][0]["labels"]["job"] == "am-job"
    assert am.alerts("am-job") == []


@needs_am
@pytest.mark.slow
def test_ftwatch_watch_resolves_a_quiet_jobs_restart_alert(am: Alertmanager, hook: Hook,
                                                           tmp_path: Path):
    """`ftwatch watch` (stdin, input still open): an NCCL error restarts the job; after
    resolve_after (2s) with no new incident the watch itself resolves the alert: the webhook
    gets `resolved` with endsAt, Alertmanager its endsAt and sends its resolved webhook."""
    import threading
    cfg = tmp_path / "watch.yaml"
    cfg.write_text(json.dumps({
        "policy": {"enable_job_restart": True},
        "watch": {"sources": [{"type": "stdin"}], "settle": 0.5, "cooldown": 1.0,
                  "identity": {"default_job": "am-watch"}},
        "alerting": {"receivers": [
            {"type": "alertmanager", "name": "am", "url": am.url, "resolve_after": "2s",
             "max_retries": 0},
            {"type": "webhook", "name": "ops", "url": f"http://127.0.0.1:{hook.port}/ftwatch",
             "max_retries": 0}]}}), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "ftwatch", "watch", "--config", str(cfg),
                             "--state-dir", str(tmp_path / "state")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        proc.stdin.write("step 10 loss 0.5\nRuntimeError: NCCL error: unhandled system error\n")
        proc.stdin.flush()
        until(lambda: any("decision restart_job" in x for x in lines), what="the restart decision")
        [firing] = until(lambda: am_posts(hook, "firing"), what="AM's firing webhook")
        assert firing["alerts"][0]["labels"]["job"] == "am-watch"
        until(lambda: any("1 alert(s) of job am-watch resolved (no new incident for 2s)" in x
                          for x in lines), what="the watch to resolve the alert")
        own = until(lambda: [b for b in (json.loads(r["raw"]) for r in list(hook.requests)
                                         if r["path"] == "/ftwatch") if b["status"] == "resolved"],
                    what="the resolved alert on the webhook")
        assert own[0]["labels"]["job"] == "am-watch" and own[0]["endsAt"] is not None
        until(lambda: am_posts(hook, "resolved"), what="AM's resolved webhook")
        assert am.alerts("am-watch") == []
        assert proc.poll() is None                         # resolved while the watch runs on
    finally:
        proc.stdin.close()
        proc.wait(60)
        reader.join(5)
    assert proc.returncode == 0, "".join(lines)
