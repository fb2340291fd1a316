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


def test_a_token_acts_on_its_own_job_only(watched, monkeypatch):
    w, rec, clock = watched
    monkeypatch.setenv(sdk.ENV_JOB, "train/llm-b")         # llm-a's token, another job
    st = call(w, lambda: sdk.Monitor().send_custom_message("hello"))
    assert not st.ok() and "bad token for job train/llm-b" in st.to_string()
    assert "train/llm-b" not in w.jobs


OTHER = "train/llm-b"
FLAKY = "flaky storage: EIO on /mnt/ckpt"


def test_retryable_errors_restart_the_callers_job_and_leave_another_jobs_decisions_alone(watched):
    """Job llm-a declares ``flaky storage`` retryable: its line restarts llm-a (rule scoped to
    it), while the same line of job llm-b, which declared nothing, decides nothing."""
    w, rec, clock = watched
    for job, pod in ((JOB, "llm-a-worker-1"), (OTHER, "llm-b-worker-0")):
        w.ingest([line(clock, job, "node-1", pod, 0, "step 1 loss 0.5")])
    st = call(w, lambda: sdk.Monitor().set_retryable_errors(["flaky storage"]))
    assert st.ok(), st.to_string()
    (rule_id,) = st.data["rules"]
    assert rule_id == f"custom.retryable.flaky_storage@{JOB}"
    (event,) = [e for e in rec.store.events(JOB) if e["kind"] == "retryable_errors"]
    assert event["rank"] == 2 and event["instance"] == "llm-a-worker-1"     # who declared them
    engine_rules = len(w.engine.rules)
    assert call(w, lambda: sdk.Monitor().set_retryable_errors(["flaky storage"])).ok()   # another rank
    assert len(w.engine.rules) == engine_rules
    w.ingest([line(clock, OTHER, "node-1", "llm-b-worker-0", 0, FLAKY),
              line(clock, JOB, "node-1", "llm-a-worker-1", 2, FLAKY)])
    clock.advance(6)
    w.tick()
    (decision,) = rec.decisions
    assert decision.target.job == JOB and decision.action.label == "restart_job"
    assert decision.root_cause.rule_id == rule_id
    assert not [f for f in rec.store.findings_for(OTHER) if f["rule_id"].startswith("custom.retryable")]


IMPORT_ERROR = ("Traceback (most recent call last):", '  File "train.py", line 1, in <module>',
                "ModuleNotFoundError: No module named 'foo'")


def retryable(rec, job):
    return [f for f in rec.store.findings_for(job) if f["rule_id"].startswith("custom.retryable")]


def test_retryable_errors_leave_the_engine_when_their_job_ends(watched):
    """Job llm-a declares ``flaky storage`` retryable: while it runs its line restarts it; once it
    ends (``fail_job``: watch forgets it), the rule is out of the shared engine, so neither job
    llm-b nor a fresh llm-a (same name, nothing declared) finds the same line retryable."""
    w, rec, clock = watched
    rules_before = {r.id for r in w.engine.rules}
    w.ingest([line(clock, JOB, "node-1", "llm-a-worker-1", 2, "step 1 loss 0.5")])
    st = call(w, lambda: sdk.Monitor().set_retryable_errors(["flaky storage"]))
    assert st.ok(), st.to_string()
    (rule_id,) = st.data["rules"]
    w.ingest([line(clock, JOB, "node-1", "llm-a-worker-1", 2, FLAKY)])
    clock.advance(6)
    w.tick()
    (restart,) = rec.decisions                                    # its own line, while it runs
    assert restart.action.label == "restart_job" and restart.root_cause.rule_id == rule_id
    clock.advance(61)                                             # past the cooldown
    w.ingest([line(clock, JOB, "node-1", "llm-a-worker-1", 2, text) for text in IMPORT_ERROR])
    clock.advance(6)
    w.tick()
    assert [d.action.label for d in rec.decisions] == ["restart_job", "fail_job"] and JOB not in w.jobs
    assert {r.id for r in w.engine.rules} == rules_before         # recompiled without llm-a's rule
    found = len(retryable(rec, JOB))
    w.ingest([line(clock, OTHER, "node-1", "llm-b-worker-0", 0, FLAKY),
              line(clock, JOB, "node-1", "llm-a-worker-0", 0, FLAKY)])   # llm-a again, started fresh
    clock.advance(6)
    w.tick()
    assert len(rec.decisions) == 2                                # neither line decides anything
    assert retryable(rec, OTHER) == [] and len(retryable(rec, JOB)) == found


def test_reset_config_sets_the_callers_jobs_interval_only(watched):
    w, rec, clock = watched
    for job, pod in ((JOB, "llm-a-worker-1"), (OTHER, "llm-b-worker-0")):
        w.ingest([line(clock, job, "node-1", pod, 0, "step 1 loss 0.5")])
    assert call(w, lambda: sdk.Monitor().reset_config(job_hang_interval=30)).ok()
    assert w.jobs[JOB].tracker.job_hang_interval == 30
    assert w.jobs[OTHER].tracker.job_hang_interval == 1800
    for _ in range(60):
        clock.advance(1)
        w.tick()
    assert [d.target.job for d in rec.decisions] == [JOB]          # llm-b's 60 s of silence: no hang


def test_the_endpoint_over_tls_is_verified_with_the_ca_in_the_environment(tmp_path, cert, monkeypatch):
    """HTTPS: the SDK trusts the endpoint's self-signed cert through FTWATCH_MONITOR_CA; without
    it the call fails verification (and nothing reaches the job); plain HTTP gets no answer."""
    from ftwatch.pipeline.sources.tls import server_context
    clock = FakeClock()
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, job_hang_interval=1800)
    server = MonitorServer("127.0.0.1", 0, SECRET, tls=server_context(*cert, "watch.monitor")).start()
    w.monitor = server
    try:
        monkeypatch.setattr(sdk, "_warned", True)          # the failures below are meant: no warning
        monkeypatch.delenv(sdk.ENV_SOCKET, raising=False)
        monkeypatch.setenv(sdk.ENV_URL_TOKEN, job_token(SECRET, JOB))
        monkeypatch.setenv(sdk.ENV_JOB, JOB)
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv(sdk.ENV_URL, f"http://127.0.0.1:{server.port}")
        assert not call(w, lambda: sdk.Monitor().send_custom_message("plain")).ok()
        monkeypatch.setenv(sdk.ENV_URL, f"https://localhost:{server.port}")
        monkeypatch.delenv(sdk.ENV_CA, raising=False)
        st = call(w, lambda: sdk.Monitor().send_custom_message("unverified"))
        assert not st.ok() and "CERTIFICATE_VERIFY_FAILED" in st.to_string()
        monkeypatch.setenv(sdk.ENV_CA, str(cert[0]))
        st = call(w, lambda: sdk.Monitor().reset_config(job_hang_interval=30))
        assert st.ok(), st.to_string()
        assert w.jobs[JOB].tracker.job_hang_interval == 30
        assert [e["detail"]["job_hang_interval"] for e in rec.store.events(JOB) if e["kind"] == "hang_interval"] \
            == [30.0]
        assert not [e for e in rec.store.events(JOB) if e["kind"] == "custom_message"]
    finally:
        server.stop()


def test_watch_refuses_a_monitor_certificate_it_cannot_load_in_one_line(tmp_path, capsys):
    from ftwatch.cli import main
    (tmp_path / "secret").write_bytes(SECRET)
    config = tmp_path / "ftwatch.yaml"
    config.write_text(f"storage: {{state_dir: {tmp_path / 'state'}}}\n"
                      f"watch:\n  sources: [{{type: stdin}}]\n"
                      f"  monitor: {{enabled: true, port: 0, secret_file: {tmp_path / 'secret'}, "
                      f"tls_cert: {tmp_path / 'missing.pem'}}}\n")
    assert main(["watch", "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ftwatch watch: watch.monitor: TLS certificate") and "\n" not in err


def test_watch_prints_a_jobs_token(tmp_path, capsys):
    from ftwatch.cli import main
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    config = tmp_path / "ftwatch.yaml"
    config.write_text(f"watch:\n  monitor: {{enabled: true, secret_file: {tmp_path / 'secret'}}}\n")
    assert main(["watch", "--config", str(config), "--monitor-token", JOB]) == 0
    assert capsys.readouterr().out.strip() == job_token(SECRET, JOB)
