"""Alerts from a real `ftwatch run` reach a real webhook, survive a dead receiver, and AIMaster
flags given as one string (`--aimaster-args`) drive run and replay.

Each test starts the real command line in a subprocess; the webhook is a local
``ThreadingHTTPServer`` on 127.0.0.1 in a thread. The jobs are one-line ``python -c`` scripts,
so no torch is needed and each run takes about a second.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ftwatch.testing import CLEAN_JOB, KEYERROR_JOB, SIGKILL_JOB

ROOT = Path(__file__).resolve().parents[2]
SIGKILL_LOG = ROOT / "tests" / "golden" / "torchrun_sigkill" / "combined.log"


class Hook:
    """A real HTTP server on 127.0.0.1 that records every POST and answers 200."""

    def __init__(self, port: int = 0):
        self.requests: list[dict] = []
        self.arrived = threading.Condition()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                           "raw": body}
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                with owner.arrived:
                    owner.requests.append(request)
                    owner.arrived.notify_all()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def wait_for(self, count: int, deadline: float = 10.0) -> list[dict]:
        """The requests once at least ``count`` have arrived (fails after ``deadline`` s)."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.requests) >= count, timeout=deadline):
                raise AssertionError(f"{len(self.requests)} requests arrived, expected {count}")
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, read, closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp: Path, port: int, language: str = "en", name: str = "cfg.yaml") -> Path:
    path = tmp / name
    path.write_text(
        "alerting:\n"
        f"  language: {language}\n"
        "  receivers:\n"
        "    - {type: console, name: console}\n"
        f"    - {{type: webhook, name: ops, url: 'http://127.0.0.1:{port}/hook', "
        "timeout: 2, max_retries: 0, headers: {X-Team: ml-infra}}\n",
        encoding="utf-8")
    return path


def ftwatch(tmp: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the real command line in ``tmp``; stdout and stderr kept apart."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("FTWATCH_JOB_ID", None)
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, errors="replace", timeout=timeout)


def run_job(tmp: Path, command: list[str], *flags: str, state: str = "state") -> subprocess.CompletedProcess:
    return ftwatch(tmp, "run", *flags, "--nproc-per-node", "1", "--state-dir", str(tmp / state),
                   "--decisions-file", str(tmp / "decisions.jsonl"), "--grace-period", "1",
                   "--", *command)


def decisions(tmp: Path) -> list[dict]:
    path = tmp / "decisions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def deliveries(state: Path, receiver: str = "ops") -> list[tuple[str, str]]:
    """(notification id, status) of each delivery the SQLite store recorded for ``receiver``."""
    with sqlite3.connect(state / "ftwatch.db") as conn:
        return conn.execute("SELECT notification_id, status FROM alerts WHERE receiver = ? "
                            "ORDER BY time, id", (receiver,)).fetchall()


def pending(state: Path) -> list[Path]:
    return sorted((state / "spool").glob("*.json"))


def out(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


# -- 1. a failing job's alert reaches the webhook -------------------------------------------

def test_fail_job_alert_reaches_webhook_once_in_english(tmp_path, hook):
    """KeyError job -> exactly one JSON POST: fail_job, the KeyError root cause, idempotency key, en text."""
    proc = run_job(tmp_path, KEYERROR_JOB, "--config", str(write_config(tmp_path, hook.port)))
    assert proc.returncode == 1, out(proc)
    [request] = hook.wait_for(1)
    assert [d["action"] for d in decisions(tmp_path)] == ["fail_job"], out(proc)
    assert request["path"] == "/hook"
    assert request["headers"]["content-type"] == "application/json"
    assert request["headers"]["x-team"] == "ml-infra"
    body = json.loads(request["raw"])
    assert body["decision"]["action"] == "fail_job"
    assert body["decision"]["root_cause"]["failure_class"] == "user_code"
    assert "KeyError" in body["decision"]["root_cause"]["line"]
    assert request["headers"]["idempotency-key"] == body["id"]
    assert body["id"].endswith("-ops") and body["receiver"] == "ops"
    assert "[ftwatch] fail_job" in body["text"]
    assert "- Root cause: `KeyError: 'lr'`" in body["text"]
    # the console receiver printed it too, and the store says both were delivered
    assert "fail_job for job" in proc.stdout
    assert deliveries(tmp_path / "state") == [(body["id"], "delivered")]
    assert pending(tmp_path / "state") == []
    assert len(hook.requests) == 1


def test_fail_job_alert_in_chinese(tmp_path, hook):
    """alerting.language zh -> the webhook text is the Chinese template (根因 with the KeyError line)."""
    proc = run_job(tmp_path, KEYERROR_JOB, "--config", str(write_config(tmp_path, hook.port, "zh")))
    assert proc.returncode == 1, out(proc)
    [request] = hook.wait_for(1)
    body = json.loads(request["raw"].decode("utf-8"))
    assert body["decision"]["action"] == "fail_job"
    assert "【ftwatch】任务" in body["text"]
    assert "- 根因：`KeyError: 'lr'`" in body["text"]
    assert "故障类别" in body["text"] and "Root cause" not in body["text"]


# -- 2. durable delivery: spooled while the receiver is down, resent once it is up ---------

def test_unreachable_webhook_spools_then_resends_exactly_once(tmp_path):
    """Receiver down -> same exit status, alert spooled and stored as spooled; next run resends it once, never again."""
    port = free_port()
    config = str(write_config(tmp_path, port))
    state = tmp_path / "state"

    first = run_job(tmp_path, KEYERROR_JOB, "--config", config)
    assert first.returncode == 1, out(first)
    assert [d["action"] for d in decisions(tmp_path)] == ["fail_job"]
    [spooled] = pending(state)
    entry = json.loads(spooled.read_text(encoding="utf-8"))
    nid = entry["notification"]["id"]
    assert spooled.name == f"{nid}.json" and entry["notification"]["receiver"] == "ops"
    assert entry["notification"]["alert"]["decision"]["action"] == "fail_job"
    assert "unreachable" in entry["last_error"]
    assert deliveries(state) == [(nid, "spooled")]
    assert deliveries(state, "console") == [(nid.removesuffix("-ops") + "-console", "delivered")]

    hook = Hook(port)
    try:
        second = run_job(tmp_path, CLEAN_JOB, "--config", config)
        assert second.returncode == 0, out(second)
        [request] = hook.wait_for(1)
        body = json.loads(request["raw"])
        assert request["headers"]["idempotency-key"] == nid == body["id"]
        assert body["decision"]["action"] == "fail_job"
        assert "KeyError" in body["decision"]["root_cause"]["line"]
        assert pending(state) == []
        assert deliveries(state) == [(nid, "spooled"), (nid, "delivered")]

        third = run_job(tmp_path, CLEAN_JOB, "--config", config)
        assert third.returncode == 0, out(third)
        assert len(hook.requests) == 1, hook.requests
        assert pending(state) == []
        assert deliveries(state) == [(nid, "spooled"), (nid, "delivered")]
    finally:
        hook.close()


# -- 3. AIMaster flags as one string -----------------------------------------------------------

def test_aimaster_args_string_restarts_then_fails_on_budget(tmp_path):
    """--aimaster-args "... --max-num-of-job-restart=1" with a job SIGKILLed each time -> restart_job, fail_job, exit 1."""
    proc = run_job(tmp_path, SIGKILL_JOB, "--aimaster-args",
                   "--job-execution-mode=Sync --enable-job-restart=True --max-num-of-job-restart=1")
    assert proc.returncode == 1, out(proc)
    made = decisions(tmp_path)
    assert [d["action"] for d in made] == ["restart_job", "fail_job"], out(proc)
    assert all(d["root_cause"]["failure_class"] == "retryable_infra" for d in made)
    assert "SIGKILL" in made[0]["root_cause"]["line"]
    assert (made[0]["restarts_used"], made[0]["restarts_left"]) == (1, 0)
    assert made[1]["restarts_left"] == 0 and "budget" in made[1]["policy_clause"]


def test_aimaster_args_bad_value_is_a_usage_error_before_any_worker(tmp_path):
    """--aimaster-args with --enable-job-restart=maybe -> exit 2 naming the flag; no worker started."""
    marker = tmp_path / "started"
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    proc = run_job(tmp_path, job, "--aimaster-args",
                   "--job-execution-mode=Sync --enable-job-restart=maybe --max-num-of-job-restart=1")
    assert proc.returncode == 2, out(proc)
    assert "--enable-job-restart=maybe" in proc.stderr
    assert "--job-execution-mode" not in proc.stderr, "only the bad flag is named"
    assert not marker.exists()
    assert "starting" not in proc.stdout and decisions(tmp_path) == []


def test_aimaster_args_unknown_flag_is_a_usage_error(tmp_path):
    """--aimaster-args with a flag AIMaster does not have -> exit 2 naming it; no worker started."""
    marker = tmp_path / "started"
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    proc = run_job(tmp_path, job, "--aimaster-args", "--enable-job-restart=True --max-restarts=4")
    assert proc.returncode == 2, out(proc)
    assert "--max-restarts=4" in proc.stderr
    assert not marker.exists()


# -- 4. replay with --aimaster-args ------------------------------------------------------------

def replay_decision(tmp: Path, *flags: str) -> dict:
    proc = ftwatch(tmp, "replay", *flags, str(SIGKILL_LOG), "--json")
    assert proc.returncode == 0, out(proc)
    [line] = proc.stdout.splitlines()
    return json.loads(line)


def test_replay_aimaster_args_never_fails_the_job(tmp_path):
    """replay --aimaster-args "--fault-tolerant-policy=Never" -> fail_job; --enable-job-restart=True alone -> restart_job."""
    never = replay_decision(tmp_path, "--aimaster-args", "--fault-tolerant-policy=Never")
    assert never["action"] == "fail_job"
    assert "Never" in never["policy_clause"]
    assert never["root_cause"]["rule_id"] == "exit.sigkill" and never["root_cause"]["rank"] == 1
    restart = replay_decision(tmp_path, "--enable-job-restart=True")
    assert restart["action"] == "restart_job"
    assert restart["root_cause"] == never["root_cause"]
    both = replay_decision(tmp_path, "--aimaster-args",
                           "--enable-job-restart=True --fault-tolerant-policy=Never")
    assert both["action"] == "fail_job"


# -- 4. SIGKILL while the receiver is down: every alert arrives exactly once after a restart -----

MESSAGES_JOB = [sys.executable, "-c", (
    "import os, sys, time\n"
    "from ftwatch.sdk import Monitor\n"
    "m = Monitor()\n"
    "for i in range(3):\n"
    "    st = m.send_custom_message(f'loss is NaN #{i}')\n"
    "    assert st.ok(), st.to_string()\n"
    "print('sent', flush=True)\n"
    "parent, end = os.getppid(), time.time() + 60\n"
    "while os.getppid() == parent and time.time() < end:\n"
    "    time.sleep(0.05)\n")]


def write_event_config(tmp: Path, port: int) -> Path:
    """Receiver `ops` gets every alert at once; receiver `later` gets custom messages grouped
    for an hour (so they wait, held on disk, when ftwatch is killed). Both on one port."""
    path = tmp / "events.yaml"
    hook = f"http://127.0.0.1:{port}"
    path.write_text(
        "alerting:\n"
        "  receivers:\n"
        f"    - {{type: webhook, name: ops, url: '{hook}/ops', timeout: 2, max_retries: 0}}\n"
        f"    - {{type: webhook, name: later, url: '{hook}/later', timeout: 2, max_retries: 0}}\n"
        "  route:\n"
        "    receivers: [ops]\n"
        "    routes:\n"
        "      - match: {event_type: [custom_message]}\n"
        "        receivers: [later]\n"
        "        group_by: [job]\n"
        "        group_wait: 1h\n"
        "        continue: true\n"
        "      - match: {event_type: [custom_message]}\n"
        "        receivers: [ops]\n",
        encoding="utf-8")
    return path


@pytest.mark.slow
def test_sigkill_with_the_receiver_down_then_restart_delivers_every_alert_exactly_once(tmp_path):
    """N4: `ftwatch run` is SIGKILLed while its receiver is down, with alerts spooled (receiver
    `ops`) and alerts waiting in a group (receiver `later`); the next `ftwatch run` (a trivial
    job) with the receiver up delivers each alert once: counted by id at the receiver."""
    port = free_port()
    config = str(write_event_config(tmp_path, port))
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("FTWATCH_JOB_ID", None)
    proc = subprocess.Popen([sys.executable, "-m", "ftwatch", "run", "--config", config,
                             "--nproc-per-node", "1", "--state-dir", str(state), "--job-id", "killed",
                             "--", *MESSAGES_JOB], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(pending(state)) == 3 and len(list((state / "held").glob("*.json"))) == 3:
                break
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.05)
        else:
            raise AssertionError(f"spool {pending(state)}, held {list((state / 'held').glob('*'))}")
        proc.kill()                                        # SIGKILL: no shutdown flush
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    spooled_ids = sorted(json.loads(p.read_text())["notification"]["id"] for p in pending(state))
    assert all(i.endswith("-ops") for i in spooled_ids)
    held_ids = sorted(p.stem for p in (state / "held").glob("*.json"))
    assert sorted(i.removesuffix("-ops") for i in spooled_ids) == held_ids

    hook = Hook(port)
    try:
        again = run_job(tmp_path, CLEAN_JOB, "--config", config)
        assert again.returncode == 0, out(again)
        hook.wait_for(4)
        third = run_job(tmp_path, CLEAN_JOB, "--config", config)
        assert third.returncode == 0, out(third)
        bodies = [(r["path"], json.loads(r["raw"])) for r in hook.requests]
        ops = sorted(b["id"] for path, b in bodies if path == "/ops")
        assert ops == spooled_ids                        # each spooled alert exactly once
        [later] = [b for path, b in bodies if path == "/later"]   # the held group, once, as one batch
        assert sorted(later["annotations"]["grouped_alerts"].split(",")) == held_ids
        assert all(f"loss is NaN #{i}" in later["text"] for i in range(3))
        assert len(hook.requests) == 4
        assert pending(state) == [] and list((state / "held").glob("*.json")) == []
    finally:
        hook.close()


# -- 5. a receiver that never answers holds up neither the job nor its alerts (N4) -----------

class Silent:
    """A real TCP server on 127.0.0.1 that accepts every connection, reads, and never answers
    (a webhook that hangs: each attempt ends only at the client's timeout)."""

    def __init__(self, port: int = 0):
        self.sock = socket.create_server(("127.0.0.1", port))
        self.conns: list[socket.socket] = []
        self.arrived = threading.Condition()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.arrived:
                self.conns.append(conn)
                self.arrived.notify_all()

    def wait_for(self, count: int, deadline: float = 30.0) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.conns) >= count, deadline), self.conns

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)   # wakes the blocked accept (close alone does not)
        except OSError:
            pass
        self.sock.close()
        for conn in self.conns:
            conn.close()
        self.thread.join(5)


def write_hook_config(tmp: Path, port: int, timeout: float, retries: int) -> Path:
    path = tmp / "slow.yaml"
    path.write_text(
        "health: {bootcheck: false, troubleshooting: false}\n"
        "alerting:\n"
        "  receivers:\n"
        f"    - {{type: webhook, name: ops, url: 'http://127.0.0.1:{port}/hook', "
        f"timeout: {timeout}, max_retries: {retries}}}\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_webhook_that_never_answers_does_not_delay_the_restart(tmp_path):
    """The job is SIGKILLed once (restart_job), then succeeds. The webhook accepts and never
    answers (timeout 2 s, 1 retry: about 4.5 s per alert if the runner waited). The restart is
    stored before the receiver's outcome for the restart alert (both its attempts), and at
    shutdown both alerts (the restart and its resolution) are left in the spool for the next
    start."""
    silent = Silent()
    marker = tmp_path / "killed-once"
    job = [sys.executable, "-c", (
        "import os, signal\n"
        f"if not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "print('ok')\n")]
    try:
        proc = run_job(tmp_path, job, "--config", str(write_hook_config(tmp_path, silent.port, 2, 1)),
                       "--job-execution-mode=Sync", "--enable-job-restart=True",
                       "--max-num-of-job-restart=1")
        assert proc.returncode == 0, out(proc)
        assert [d["action"] for d in decisions(tmp_path)] == ["restart_job", "none"], out(proc)
        silent.wait_for(1)
    finally:
        silent.close()
    state = tmp_path / "state"
    with sqlite3.connect(state / "ftwatch.db") as conn:
        [(decision_id,)] = conn.execute("SELECT decision_id FROM decisions "
                                        "WHERE action = 'restart_job'").fetchall()
        restart_id = decision_id + "-ops"
        [restarted] = conn.execute("SELECT time FROM events WHERE kind = 'job_restart'").fetchone()
        rows = conn.execute("SELECT notification_id, status, attempts, time FROM alerts "
                            "WHERE receiver = 'ops' ORDER BY time").fetchall()
    outcome = [r for r in rows if r[0] == restart_id]
    assert [(s, a) for _, s, a, _ in outcome] == [("spooled", 2)], rows
    assert restarted < outcome[0][3], (restarted, rows)   # acted first, the receiver's answer later
    kept = sorted(json.loads(p.read_text())["notification"]["id"] for p in pending(state))
    assert len(kept) == 2 and restart_id in kept, kept    # the restart alert and its resolution


SDK_MESSAGE_JOB = [sys.executable, "-c", (
    "import os, sys, time, warnings\n"
    "from ftwatch.sdk import Monitor\n"
    "warnings.simplefilter('error')\n"           # a 'cannot reach the monitor' warning fails it
    "st = Monitor().send_custom_message('loss is NaN')\n"
    "assert st.ok(), st.to_string()\n"
    "open(sys.argv[1], 'w').write('sent')\n"
    "parent, end = os.getppid(), time.time() + 120\n"
    "while os.getppid() == parent and time.time() < end:\n"
    "    time.sleep(0.05)\n")]


@pytest.mark.slow
def test_sigkill_during_the_first_attempt_then_restart_delivers_the_alert_exactly_once(tmp_path):
    """N4 write-ahead: a custom message's notification is in the spool before its first attempt
    ends. ftwatch is SIGKILLed while that attempt hangs (the receiver never answers); the next
    `ftwatch run` with the receiver up delivers it once, and a third run not again (counted by id
    at the receiver)."""
    silent = Silent()
    port = silent.port
    config = str(write_hook_config(tmp_path, port, 30, 3))
    state = tmp_path / "state"
    sent = tmp_path / "sent"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("FTWATCH_JOB_ID", None)
    proc = subprocess.Popen([sys.executable, "-m", "ftwatch", "run", "--config", config,
                             "--nproc-per-node", "1", "--state-dir", str(state), "--job-id", "killed",
                             "--", *SDK_MESSAGE_JOB, str(sent)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        silent.wait_for(1, deadline=60)            # the first attempt is in flight (hangs 30 s)
        deadline = time.monotonic() + 30
        while not sent.exists() and time.monotonic() < deadline:   # the SDK call got its reply
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.05)
        [spooled] = pending(state)                 # on disk while the attempt has not ended
        entry = json.loads(spooled.read_text(encoding="utf-8"))
        proc.kill()                                # SIGKILL during the attempt: no shutdown
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
        silent.close()
    assert proc.returncode == -signal.SIGKILL
    assert sent.read_text() == "sent"
    nid = entry["notification"]["id"]
    assert entry["attempts"] == 0 and nid.endswith("-ops")
    assert "loss is NaN" in entry["notification"]["body"]

    hook = Hook(port)
    try:
        again = run_job(tmp_path, CLEAN_JOB, "--config", config)
        assert again.returncode == 0, out(again)
        hook.wait_for(1)
        third = run_job(tmp_path, CLEAN_JOB, "--config", config)
        assert third.returncode == 0, out(third)
        ids = [json.loads(r["raw"])["id"] for r in hook.requests]
        assert ids == [nid], ids                   # exactly once
        assert hook.requests[0]["headers"]["idempotency-key"] == nid
        assert pending(state) == []
        assert deliveries(state)[-1] == (nid, "delivered")
    finally:
        hook.close()
