"""End to end: a real `ftwatch run` whose workers call ``ftwatch.sdk`` (SPEC N5, K1, R2, R6).

The workers are plain Python scripts (no torch); the webhook receiver is a real local HTTP
server; everything goes through the real control socket the supervisor names in the workers'
environment.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--enable-job-restart=True", "--enable-job-hang-detection=True", "--job-hang-interval=60"]

WORKER = r'''
import os, sys, time
from ftwatch.sdk import Monitor

monitor = Monitor()
rank = int(os.environ["RANK"])
attempt = int(os.environ["FTWATCH_ATTEMPT"])
mode = sys.argv[1]
print(f"rank {rank} attempt {attempt} start", flush=True)

if mode == "hang":
    if attempt == 1:
        if rank == 0:
            st = monitor.send_custom_message("loss is NaN")
            print(f"custom message sent: {st.to_string()}", flush=True)
        print("entering the scope", flush=True)
        with monitor.hang_detect(2):
            time.sleep(3.5)                      # silent inside the scope: a hang
        print("survived the scope", flush=True)  # never printed: the hang restarts the job
    else:
        time.sleep(3.5)                          # the same silence outside it: fine (60 s)
        print("done", flush=True)
    sys.exit(0)

if mode == "message":
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        st = monitor.send_custom_message(f"loss is NaN on rank {rank}")
    print(f"rank {rank} message: {st.to_string()}, {len(caught)} warnings", flush=True)
    sys.exit(0)

if mode == "retryable":
    if attempt == 1 and rank == 1:
        if os.environ.get("USE_SDK") == "1":
            st = monitor.set_retryable_errors(["my flaky storage error"])
            print(f"retryable set: {st.to_string()}", flush=True)
        print("OSError: my flaky storage error while reading shard 7", file=sys.stderr, flush=True)
        sys.exit(1)
    time.sleep(0.5 if attempt == 1 else 0)
    print("done", flush=True)
    sys.exit(0)
'''


class Hook:
    """A real HTTP server on 127.0.0.1 recording every POST body."""

    def __init__(self):
        self.bodies: list[bytes] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                owner.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def run(tmp: Path, mode: str, config: Path | None = None, env: dict | None = None) -> tuple[int, str, float]:
    worker = tmp / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    argv = [sys.executable, "-m", "ftwatch", "run", "--nproc-per-node", "2", "--state-dir", str(tmp / "state"),
            "--decisions-file", str(tmp / "decisions.jsonl"), "--grace-period", "2", *FLAGS]
    if config is not None:
        argv += ["--config", str(config)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full_env.pop("FTWATCH_JOB_ID", None)
    started = time.monotonic()
    r = subprocess.run([*argv, "--", sys.executable, str(worker), mode], cwd=tmp, env=full_env,
                       capture_output=True, text=True, errors="replace", timeout=90)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - started


def decisions(tmp: Path) -> list[dict]:
    path = tmp / "decisions.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def test_hang_detect_scope_makes_a_short_silence_a_hang_and_custom_message_reaches_receivers(tmp_path, hook):
    config = tmp_path / "cfg.yaml"
    # the time bound below is about hang detection: no Bootcheck / Troubleshooting torch starts in it
    config.write_text("health: {bootcheck: false, troubleshooting: false}\n"
                      "alerting:\n  receivers:\n    - {type: console, name: console}\n"
                      f"    - {{type: webhook, name: ops, url: 'http://127.0.0.1:{hook.server.server_address[1]}/hook', "
                      "timeout: 2, max_retries: 0}\n", encoding="utf-8")
    code, out, _ = run(tmp_path, "hang", config)
    assert code == 0, out
    ds = decisions(tmp_path)
    assert [d["action"] for d in ds] == ["restart_job", "none"], out
    assert ds[0]["root_cause"]["rule_id"] == "hang.job", out
    assert "survived the scope" not in out
    assert out.count("done") == 2                # the second attempt: 3.5 s silent, no hang
    # the hang was judged against the scope's 2 s, not the configured 60 s, and came after the
    # workers entered the scope
    silent = int(re.search(r"no output from any of 2 instances for (\d+) s", ds[0]["root_cause"]["line"])[1])
    assert 2 <= silent < 60, ds[0]
    assert out.index("entering the scope") < out.index("decision restart_job"), out

    # the custom message: printed, sent to the console receiver and the webhook, stored
    assert "custom message sent: OK" in out
    assert "ftwatch: custom message from rank 0: loss is NaN" in out
    assert "Root cause:     loss is NaN" in out          # the console receiver's alert text
    bodies = [json.loads(b) for b in hook.bodies]
    custom = [b for b in bodies if "loss is NaN" in json.dumps(b)]
    assert len(custom) == 1, bodies
    with sqlite3.connect(tmp_path / "state" / "ftwatch.db") as db:
        rows = db.execute("SELECT rank, detail FROM events WHERE kind = 'custom_message'").fetchall()
    assert [(r, json.loads(d)["content"]) for r, d in rows] == [(0, "loss is NaN")]


class Silent:
    """A real TCP server on 127.0.0.1 that accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.mark.slow
def test_custom_message_is_answered_at_once_while_the_webhook_never_answers(tmp_path):
    """R6 + N4: the webhook hangs (timeout 4 s, 1 retry: about 9 s per message, more than the
    SDK's 6 s); both ranks' ``send_custom_message`` still get OK and no 'cannot reach the
    monitor' warning, and the messages wait in the spool for the next start."""
    silent = Silent()
    config = tmp_path / "cfg.yaml"
    config.write_text("health: {bootcheck: false, troubleshooting: false}\n"
                      "alerting:\n  receivers:\n"
                      f"    - {{type: webhook, name: ops, url: 'http://127.0.0.1:{silent.sock.getsockname()[1]}/h', "
                      "timeout: 4, max_retries: 1}\n", encoding="utf-8")
    try:
        code, out, _ = run(tmp_path, "message", config)
    finally:
        silent.close()
    assert code == 0, out
    assert "rank 0 message: OK, 0 warnings" in out and "rank 1 message: OK, 0 warnings" in out, out
    assert silent.conns, "the webhook was tried"
    spooled = sorted((tmp_path / "state" / "spool").glob("*-ops.json"))
    bodies = [json.loads(p.read_text())["notification"]["body"] for p in spooled]
    assert len(bodies) == 2, bodies
    assert all(any(f"loss is NaN on rank {r}" in b for b in bodies) for r in (0, 1)), bodies


def test_set_retryable_errors_turns_a_failure_into_a_restart(tmp_path):
    code, out, _ = run(tmp_path, "retryable", env={"USE_SDK": "1"})
    assert "retryable set: OK" in out
    ds = decisions(tmp_path)
    assert code == 0, out
    assert [d["action"] for d in ds] == ["restart_job", "none"], out
    assert ds[0]["root_cause"]["rule_id"].startswith("custom.retryable."), ds[0]
    assert ds[0]["root_cause"]["line"] == "OSError: my flaky storage error while reading shard 7"


def test_without_the_sdk_call_the_same_failure_fails_the_job(tmp_path):
    code, out, _ = run(tmp_path, "retryable", env={"USE_SDK": "0"})
    assert code == 1, out
    assert [d["action"] for d in decisions(tmp_path)] == ["fail_job"], out
