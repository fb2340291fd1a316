"""The recorder retries spooled alerts during a run, not only at start (N4)."""

import io

from ftwatch.alerting.dispatch import NullAlerts
from ftwatch.events import Action, Origin
from ftwatch.pipeline.recorder import RESEND_SECONDS, Recorder
from ftwatch.testing import CaptureNotifier, decision, finding


class CountingDispatcher(NullAlerts):
    """A stand-in alert path that counts resend passes (the recorder's timing is under test)."""

    def __init__(self):
        self.passes = 0

    def resend_pending(self) -> int:
        self.passes += 1
        return 0


def test_resend_runs_every_interval_and_not_more_often():
    """No pass at the first call (start already resent), then one per RESEND_SECONDS."""
    dispatcher = CountingDispatcher()
    rec = Recorder(dispatcher=dispatcher, out=io.StringIO())
    t = 1000.0
    rec.resend_due(t)
    assert dispatcher.passes == 0
    rec.resend_due(t + RESEND_SECONDS - 0.1)
    assert dispatcher.passes == 0
    rec.resend_due(t + RESEND_SECONDS)
    assert dispatcher.passes == 1
    rec.resend_due(t + RESEND_SECONDS + 1)
    assert dispatcher.passes == 1
    rec.resend_due(t + 2 * RESEND_SECONDS)
    assert dispatcher.passes == 2


def test_no_dispatcher_is_fine():
    """Without alerting configured nothing happens."""
    assert Recorder(out=io.StringIO()).resend_due(5.0) == 0


def restart(job: str, t: float):
    rc = finding("exit.sigkill", kind="exit_code", line="exited by SIGKILL", time=t - 1,
                 at=Origin(f"{job}-w1", 1, job, "node-a"))
    return decision(Action.RESTART_JOB, rc, time=t, clause="restart")


def test_open_alerts_are_kept_and_resolved_per_job(tmp_path):
    """Two jobs' restart alerts: each resolves after its own quiet period; resolving one job
    (its end, or its quiet period) leaves the other's alert open."""
    from ftwatch.alerting.notify import Sender
    from ftwatch.alerting.rendering import TemplateRenderer
    from ftwatch.alerting.spool import Spool
    keep = CaptureNotifier("keep")
    rec = Recorder(dispatcher=Sender([keep], TemplateRenderer("en"), Spool(tmp_path / "s")),
                   out=io.StringIO(), resolve_after=300)
    t0 = 1_795_250_000.0
    rec.decision(restart("a", t0))
    rec.decision(restart("b", t0 + 200))
    assert rec.open_jobs() == {"a", "b"}
    assert rec.resolve_due(t0 + 299) == 0
    assert rec.resolve_due(t0 + 300) == 1                 # a's quiet period, not b's
    assert rec.open_jobs() == {"b"}
    assert rec.resolve_due(t0 + 499) == 0
    assert rec.resolve_due(t0 + 500, hold={"b"}) == 0     # b's next incident still settling
    rec.decision(restart("c", t0 + 510))
    assert rec.resolve_open(t0 + 520, "the job finished", job="b") == 1
    assert rec.open_jobs() == {"c"}
    assert keep.log() == [("a", "firing"), ("b", "firing"), ("a", "resolved"), ("c", "firing"),
                          ("b", "resolved")]
    assert keep.sent[2].alert.ends_at == t0 + 300
    assert "1 alert(s) of job b resolved (the job finished)" in rec.out.getvalue()
    assert rec.resolve_open(t0 + 600) == 1 and rec.open_jobs() == set()   # None: every job


class Keep(NullAlerts):
    """A stand-in alert path that keeps the alerts it is handed."""

    def __init__(self):
        self.alerts = []

    def dispatch(self, alert):
        self.alerts.append(alert)
        return []


def _decision():
    rc = finding("nccl.error", line="NCCL error", time=10.0, at=Origin("worker-1", 1, "job a", "n1"))
    return decision(Action.RESTART_JOB, rc, time=11.0, clause="clause")


def test_every_alert_has_a_link_with_an_absolute_quoted_state_dir(tmp_path, monkeypatch):
    """N1: decisions link to `ftwatch explain`, custom messages (not stored decisions) to
    `ftwatch report --job`; the state dir is absolute (the alert is read elsewhere) and quoted."""
    import shlex
    monkeypatch.chdir(tmp_path)
    keep = Keep()
    rec = Recorder(dispatcher=keep, out=io.StringIO(), state_dir=__import__("pathlib").Path("my state"))
    d = _decision()
    rec.decision(d)
    rec.custom_message(12.0, "job a", "loss is NaN", rank=0)
    explain, report = (a.annotations["explain"] for a in keep.alerts)
    assert shlex.split(explain) == ["ftwatch", "explain", "--state-dir", str(tmp_path / "my state"), d.decision_id]
    assert shlex.split(report) == ["ftwatch", "report", "--state-dir", str(tmp_path / "my state"), "--job", "job a"]
    assert rec.link(d) == explain


def test_link_url_template_is_used_for_every_alert(tmp_path):
    keep = Keep()
    rec = Recorder(dispatcher=keep, out=io.StringIO(), state_dir=tmp_path,
                   link_url="https://reports.example/{job}/{decision_id}?rank={rank}")
    d = _decision()
    rec.decision(d)
    rec.custom_message(12.0, "job a", "hello", rank=0)
    first, second = (a.annotations["explain"] for a in keep.alerts)
    assert first == f"https://reports.example/job%20a/{d.decision_id}?rank="
    assert second.startswith("https://reports.example/job%20a/") and second.endswith("?rank=0")
    assert second != first


def test_link_url_with_an_unknown_placeholder_is_a_config_error(tmp_path):
    import pytest

    from ftwatch.config.model import load_config
    from ftwatch.errors import ConfigError
    config = tmp_path / "c.yaml"
    config.write_text("alerting:\n  link_url: 'https://r/{jobid}'\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2:.*jobid"):
        load_config(config)
