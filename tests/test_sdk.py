"""``ftwatch.sdk.Monitor`` against no monitor and against a real ``ControlServer`` (SPEC N5, K1, R2, R6).

The server is the real one on a real Unix socket; a small loop in a thread plays the runner's
part (``drain`` with a real ``ControlHandler``) over a real engine, hang tracker and Recorder, the
Recorder writing to ``ftwatch.testing``'s capture sink and notifier.
"""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings

import pytest

from ftwatch import sdk
from ftwatch.alerting.notify import Sender
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.spool import Spool
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sources.control import ENV_SOCKET, ENV_TOKEN, ControlHandler, ControlServer
from ftwatch.rules.loader import rules_from_keywords
from ftwatch.rules.engine import Engine
from ftwatch.rules.timers import HangTracker
from ftwatch.testing import CaptureNotifier, CaptureSink


class Served:
    """A started ControlServer (``server``, else a new one under ``tmp``) drained by a thread, as the
    runner's loop does."""

    def __init__(self, tmp, hang=60.0, hang_supported=True, server: ControlServer | None = None):
        self.engine = Engine([])
        self.store, self.notifier = CaptureSink(), CaptureNotifier("ops")
        dispatcher = Sender([self.notifier], TemplateRenderer("en"), Spool(tmp / "spool"), sleep=lambda s: None)
        self.recorder = Recorder(self.store, dispatcher=dispatcher, out=io.StringIO())
        self.tracker = HangTracker(hang, None)
        self.outputs = []
        real_output = self.tracker.output
        self.tracker.output = lambda inst, t: (self.outputs.append(inst), real_output(inst, t))
        self.handler = ControlHandler(self.engine, self.tracker, self.recorder, "job-1", rules_from_keywords,
                                      hang, hang_supported=hang_supported, budgets=lambda: (1, 2))
        self.server = server or ControlServer(tmp).start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            self.server.drain(self.handler)
            self._stop.wait(0.01)

    def monitor(self, **kw):
        return sdk.Monitor(socket_path=str(self.server.path), token=self.server.token, **kw)

    def close(self):
        self._stop.set()
        self._thread.join(2)
        self.server.stop()


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def fresh_warning(monkeypatch):
    monkeypatch.setattr(sdk, "_warned", False)
    for name in (ENV_SOCKET, ENV_TOKEN, "RANK", "FTWATCH_INSTANCE"):
        monkeypatch.delenv(name, raising=False)


# -- no monitor ----------------------------------------------------------------------------------

def test_no_monitor_every_call_is_a_noop_that_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = sdk.Monitor(config=sdk.PyTorchConfig(job_hang_interval=1800))
        results = [m.set_retryable_errors(["x"]), m.reset_config(job_hang_interval=10),
                   m.send_custom_message("loss is NaN"), m.report_step(3)]
        with m.hang_detect(2) as st:
            results.append(st)

        @m.hang_detect(-1)
        def f(x):
            return x * 2

        assert f(21) == 42
    assert all(not r.ok() for r in results)
    assert all(r.to_string().startswith("error: ") for r in results)
    ours = [w for w in caught if issubclass(w.category, sdk.MonitorUnavailableWarning)]
    assert len(ours) == 1 and sdk.ENV_SOCKET in str(ours[0].message)


@pytest.mark.parametrize("how", ["method", "with", "decorator"])
def test_the_warning_points_at_the_training_codes_line(how):
    """The one warning names the caller's file and line, not a line inside ftwatch.sdk."""
    import inspect
    m = sdk.Monitor()

    @m.hang_detect(-1)
    def evaluate():
        return 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "method":
            line = inspect.currentframe().f_lineno + 1
            m.send_custom_message("hi")
        elif how == "with":
            line = inspect.currentframe().f_lineno + 1
            with m.hang_detect(2):
                pass
        else:
            line = inspect.currentframe().f_lineno + 1
            evaluate()
    [w] = [w for w in caught if issubclass(w.category, sdk.MonitorUnavailableWarning)]
    assert (w.filename, w.lineno) == (__file__, line)


def test_unreachable_socket_is_a_noop_too(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_SOCKET, str(tmp_path / "nothing.sock"))
    monkeypatch.setenv(ENV_TOKEN, "t")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = sdk.Monitor()
        assert not m.send_custom_message("hi").ok()
        assert not m.report_step(1).ok()
    assert len([w for w in caught if issubclass(w.category, sdk.MonitorUnavailableWarning)]) == 1


def test_sdk_imports_nothing_heavy():
    code = ("import sys; import ftwatch.sdk; "
            "bad = [m for m in sys.modules if m in ('torch', 'jinja2', 'pydantic', 'yaml') "
            "or m.startswith(('ftwatch.pipeline', 'ftwatch.rules', 'ftwatch.alerting', 'ftwatch.parsers'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# -- against a real control server ---------------------------------------------------------------

def test_socket_is_private_and_removed_on_stop(tmp_path):
    s = Served(tmp_path)
    path = s.server.path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert s.server.env() == {ENV_SOCKET: str(path), ENV_TOKEN: s.server.token}
    s.close()
    assert not path.exists()


def test_set_retryable_errors_adds_rules(served):
    st = served.monitor().set_retryable_errors(["my flaky storage error", "connect timeout"])
    assert st.ok(), st.to_string()
    assert [r.patterns[0].text for r in served.engine.rules] == [
        "my flaky storage error", "connect timeout"]
    assert all(r.action.label == "restart_job" for r in served.engine.rules)
    bad = served.monitor().set_retryable_errors([""])
    assert not bad.ok() and "non-empty" in bad.to_string()


def test_reset_config_changes_the_interval_and_refuses_unknown_keys(served):
    m = served.monitor()
    assert m.reset_config(job_hang_interval=10).ok()
    assert served.tracker.job_hang_interval == 10
    assert m.reset_config({"job_hang_interval": -1}).ok()
    assert served.tracker.job_hang_interval is None
    st = m.reset_config(job_hang_interval=5, foo=1)
    assert not st.ok() and "foo" in st.to_string()
    assert served.tracker.job_hang_interval is None


def test_hang_detect_nests_and_restores(served, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    m = served.monitor()
    assert served.tracker.job_hang_interval == 60
    with m.hang_detect(180) as st:
        assert st.ok(), st.to_string()
        assert served.tracker.job_hang_interval == 180
        with m.hang_detect(-1):
            assert served.tracker.job_hang_interval is None
        assert served.tracker.job_hang_interval == 180
    assert served.tracker.job_hang_interval == 60

    seen = []

    @m.hang_detect(2)
    def phase(depth):
        seen.append(served.tracker.job_hang_interval)
        if depth:
            phase(depth - 1)
        return "done"

    assert phase(1) == "done" and seen == [2, 2]
    assert served.tracker.job_hang_interval == 60
    with pytest.raises(ValueError):
        with m.hang_detect(3):
            raise ValueError("training code's own error passes through")
    assert served.tracker.job_hang_interval == 60


def test_two_ranks_share_the_scope_until_both_leave(served):
    r0, r1 = served.monitor(), served.monitor()
    r0.rank, r1.rank = 0, 1
    a, b = r0.hang_detect(2), r1.hang_detect(2)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert served.tracker.job_hang_interval == 2
    b.__exit__(None, None, None)
    assert served.tracker.job_hang_interval == 60


def test_new_attempt_forgets_scopes_and_resets(served):
    m = served.monitor()
    m.reset_config(job_hang_interval=30)
    m.hang_detect(2).__enter__()          # the worker was killed inside: never popped
    assert served.tracker.job_hang_interval == 2
    served.handler.new_attempt()
    assert served.tracker.job_hang_interval == 60


def test_hang_ops_refused_when_hang_detection_is_off(tmp_path):
    s = Served(tmp_path, hang=None, hang_supported=False)
    try:
        st = s.monitor().reset_config(job_hang_interval=5)
        assert not st.ok() and "off" in st.to_string()
        with s.monitor().hang_detect(5) as st:
            assert not st.ok()
        assert s.tracker.job_hang_interval is None
    finally:
        s.close()


def test_send_custom_message_and_report_step(served, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("FTWATCH_INSTANCE", "worker-0")
    m = served.monitor()
    assert m.send_custom_message("loss is NaN").ok()
    [sent] = served.notifier.sent                 # the job, the text, who sent it and the budgets
    a = sent.alert                                # an alert of its own, no stand-in decision
    target = (a.labels["job"], a.labels["instance"], a.labels["rank"], a.labels["node"])
    assert a.decision is None
    assert (target, a.annotations["root_cause_line"], a.budgets["restarts_used"], a.budgets["restarts_left"]) == (
        ("job-1", "worker-0", "0", ""), "loss is NaN", 1, 2)
    assert [(e.kind, e.job, e.instance, e.rank, e.detail) for e in served.store.events] == [
        ("custom_message", "job-1", "worker-0", 0, {"content": "loss is NaN"})]
    assert m.report_step(7).ok()                  # answered on receipt, applied at the next drain
    deadline = time.monotonic() + 5
    while served.outputs != ["worker-0"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.outputs == ["worker-0"] and served.handler.last_step == {"worker-0": 7}
    assert not m.report_step("x").ok()


def test_wrong_token_is_rejected_and_never_reaches_the_runner(served):
    m = sdk.Monitor(socket_path=str(served.server.path), token="not-the-token")
    st = m.send_custom_message("sneaky")
    assert not st.ok() and "bad token" in st.to_string()
    assert served.notifier.sent == [] and served.store.events == []
    with socket.socket(socket.AF_UNIX) as s:       # raw: no token at all, then garbage
        s.connect(str(served.server.path))
        s.sendall(b'{"op": "report_step", "step": 1}\nnot json\n')
        f = s.makefile("rb")
        assert json.loads(f.readline()) == {"ok": False, "error": "bad token"}
        assert json.loads(f.readline())["ok"] is False
    assert served.outputs == []


def test_unknown_op_and_unanswered_requests(tmp_path):
    server = ControlServer(tmp_path, answer_timeout=0.3).start()
    try:
        m = sdk.Monitor(socket_path=str(server.path), token=server.token)
        st = m.send_custom_message("x")            # nobody drains: times out, not-ok, no raise
        assert not st.ok() and "did not take" in st.to_string()
        assert server.drain(lambda msg: {"ok": True}) == 0      # the dropped one is not answered
        served = Served(tmp_path, hang=None, hang_supported=False, server=server)
        try:
            st = m._call("no_such_op")
        finally:
            served.close()
        assert not st.ok() and "unknown op" in st.to_string()
    finally:
        server.stop()


def test_long_state_dir_falls_back_to_a_short_socket_path(tmp_path):
    deep = tmp_path / ("d" * 120)
    server = ControlServer(deep).start()
    try:
        assert len(str(server.path)) < 108 and server.path.exists()
    finally:
        server.stop()
    assert not server.path.exists()


def test_relative_state_dir_reaches_a_worker_that_changes_directory(tmp_path, monkeypatch):
    """``--state-dir`` defaults to the relative ``.ftwatch-state``: the socket path handed to the
    workers is absolute, so a worker that chdir()s elsewhere still reaches ftwatch."""
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    served = Served(tmp_path, hang=None, server=ControlServer(".ftwatch-state").start())
    server, handler = served.server, served.handler
    try:
        assert os.path.isabs(server.env()[ENV_SOCKET])
        code = ("import os, sys; os.chdir(sys.argv[1]); from ftwatch.sdk import Monitor; "
                "st = Monitor().set_retryable_errors(['connect timeout']); print(st.ok(), st.to_string())")
        env = {**os.environ, **server.env()}
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "elsewhere")], env=env,
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.startswith("True"), out.stdout + out.stderr
        assert handler.retryable == ["connect timeout"]
    finally:
        served.close()
