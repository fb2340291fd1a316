"""The SDK over HTTP for watched jobs (issue 13 item 3): ``ftwatch.sdk.Monitor`` with
``FTWATCH_MONITOR_URL`` reaches ``watch``'s endpoint, scoped by the job's token, and its calls
change that job's hang detection as under ``run``."""

from __future__ import annotations

import threading

import pytest

from ftwatch import sdk
from ftwatch.pipeline.sources.monitor import MonitorServer, job_token
from ftwatch.testing import FakeClock
from tests.pipeline.test_watcher import line, make

SECRET = b"monitor-secret"
JOB = "train/llm-a"


@pytest.fixture
def watched(tmp_path, monkeypatch):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, job_hang_interval=1800)
    server = MonitorServer("127.0.0.1", 0, SECRET).start()
    w.monitor = server
    monkeypatch.delenv(sdk.ENV_SOCKET, raising=False)
    monkeypatch.setenv(sdk.ENV_URL, f"http://127.0.0.1:{server.port}")
    monkeypatch.setenv(sdk.ENV_URL_TOKEN, job_token(SECRET, JOB))
    monkeypatch.setenv(sdk.ENV_JOB, JOB)
    monkeypatch.setenv("HOSTNAME", "llm-a-worker-1")
    monkeypatch.setenv("RANK", "2")
    yield w, rec, clock
    server.stop()


def call(w, fn):
    """Runs an SDK call in a thread while this thread plays the watcher's loop (drain)."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    while t.is_alive():
        w.monitor.drain(w.control)
        t.join(0.01)
    w.monitor.drain(w.control)
    return out[0]


def test_reset_config_and_hang_scopes_set_the_jobs_interval_and_a_short_one_decides_a_hang(watched):
    w, rec, clock = watched
    monitor = sdk.Monitor()
    assert monitor.available and monitor.instance == "llm-a-worker-1"
    w.ingest([line(clock, JOB, "node-1", "llm-a-worker-1", 2, "step 1 loss 0.5")])
    tracker = w.jobs[JOB].tracker
    st = call(w, lambda: monitor.reset_config(job_hang_interval=30))
    assert st.ok(), st.to_string()
    assert tracker.job_hang_interval == 30

    def evaluate():                                        # scopes are per thread: one thread
        with monitor.hang_detect(-1):
            inside = tracker.job_hang_interval             # set before the push was answered
        return inside

    assert call(w, evaluate) is None                       # evaluation: no hang detection
    assert tracker.job_hang_interval == 30
    clock.advance(31)
    w.tick()
    (decision,) = rec.decisions
    assert decision.target.job == JOB and decision.root_cause.rule_id.startswith("hang")


def test_report_step_and_custom_message_are_the_callers(watched):
    w, rec, clock = watched
    monitor = sdk.Monitor()
    assert call(w, lambda: monitor.report_step(7)).ok()
    w.monitor.drain(w.control)
    assert w.controls[JOB].last_step == {"llm-a-worker-1": 7}
    assert call(w, lambda: monitor.send_custom_message("loss is NaN")).ok()
    (event,) = [e for e in rec.store.events(JOB) if e["kind"] == "custom_message"]
    assert event["instance"] == "llm-a-worker-1" and event["rank"] == 2


def test_a_token_acts_on_its_own_job_only_and_retryable_errors_are_refused(watched, monkeypatch):
    w, rec, clock = watched
    monkeypatch.setenv(sdk.ENV_JOB, "train/llm-b")         # llm-a's token, another job
    st = call(w, lambda: sdk.Monitor().send_custom_message("hello"))
    assert not st.ok() and "bad token for job train/llm-b" in st.to_string()
    assert "train/llm-b" not in w.jobs
    monkeypatch.setenv(sdk.ENV_JOB, JOB)
    st = call(w, lambda: sdk.Monitor().set_retryable_errors(["flaky storage"]))
    assert not st.ok() and "not supported under ftwatch watch" in st.to_string()


def test_watch_prints_a_jobs_token(tmp_path, capsys):
    from ftwatch.cli import main
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    config = tmp_path / "ftwatch.yaml"
    config.write_text(f"watch:\n  monitor: {{enabled: true, secret_file: {tmp_path / 'secret'}}}\n")
    assert main(["watch", "--config", str(config), "--monitor-token", JOB]) == 0
    assert capsys.readouterr().out.strip() == job_token(SECRET, JOB)
