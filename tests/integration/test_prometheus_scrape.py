"""E5: a real Prometheus (Debian's ``prometheus``) scrapes ftwatch's ``/metrics`` every second.

Each test starts Prometheus on a free loopback port with its TSDB in tmp_path, runs ftwatch for
real with ``--metrics-port``, and asks Prometheus's HTTP API (``/api/v1/query``) until the values
arrive (deadlines, no fixed sleeps). Skipped when the ``prometheus`` binary is absent.

- ``ftwatch run``: two plain-Python workers print a known number of lines; attempt 0 ends with
  rank 1's SIGKILL (restart_job), attempt 1 holds, silent, while a gate file exists, so the
  numbers are exact while Prometheus scrapes.
- ``ftwatch watch``: lines posted to its HTTP source with a record time 30 s in the past show up
  as lines and as ingest lag.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (Debian package "
                                 "`prometheus`; make test-deps installs it)")]

LINES = 5          # lines each worker prints per attempt before it holds or dies

WORKER = r'''
import os, signal, sys, time
rank = int(os.environ["RANK"]); attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
tmp = sys.argv[1]
for step in range(LINES):
    print(f"rank {rank} attempt {attempt} step {step}", flush=True)
open(os.path.join(tmp, f"printed-{attempt}-{rank}"), "w").close()
if attempt == 0:
    if rank == 1:
        while not os.path.exists(os.path.join(tmp, "printed-0-0")):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)
while os.path.exists(os.path.join(tmp, "gate")):
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
'''.replace("LINES", str(LINES))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus scraping ``target`` every second."""

    def __init__(self, tmp: Path, target: str):
        self.port = free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                       "scrape_configs:\n  - job_name: ftwatch\n"
                       f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait(lambda: httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200, 60, "ready")

    def query(self, promql: str) -> dict[tuple, float]:
        """Instant query -> {sorted label items (without __name__): value}."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): float(s["value"][1])
                for s in body["data"]["result"]}

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return next(iter(result.values())) if len(result) == 1 else None

    def wait_value(self, promql: str, check, deadline: float = 60) -> float:
        """Poll until the query has one value that satisfies ``check``; return it."""
        got: list = [None]

        def ok() -> bool:
            got[0] = self.value(promql)
            return got[0] is not None and check(got[0])
        self._wait(ok, deadline, f"{promql} (last value {got[0]})")
        return got[0]

    def _wait(self, cond, deadline: float, what: str) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}")
            try:
                if cond():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


def start_ftwatch(tmp: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ftwatch", *args], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_line(proc: subprocess.Popen, needle: str, deadline: float) -> str | None:
    """The first output line of ``proc`` containing ``needle``; None when the process ends or
    ``deadline`` seconds pass first (a reader thread: ``readline`` alone could block for ever)."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
            if needle in line:
                return
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    end = time.monotonic() + deadline
    while (left := end - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            return None
        if needle in line:
            return line.strip()
    return None


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.stdout.read() if proc.stdout else ""


def test_prometheus_scrapes_the_counts_of_a_real_run(tmp_path: Path):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "gate").touch()
    port = free_port()
    prom = Prometheus(tmp_path, f"127.0.0.1:{port}")
    ft = start_ftwatch(tmp_path, "run", "--job-id", "prom-e2e", "--nproc-per-node", "2", "--state-dir", "state",
                       "--grace-period", "1", "--enable-job-restart=True", "--max-num-of-job-restart=3",
                       "--metrics-port", str(port), "--", sys.executable, "worker.py", str(tmp_path))
    output = ""
    try:
        sel = '{job="ftwatch", job_id="prom-e2e"}'
        assert prom.wait_value(f"sum(ftwatch_lines_total{sel})", lambda v: v >= 4 * LINES) == 4 * LINES
        assert prom.wait_value('ftwatch_restarts_total{kind="job"}', lambda v: v > 0) == 1
        assert prom.value('ftwatch_decisions_total{action="restart_job"}') == 1
        findings = prom.query("ftwatch_findings_total")
        assert findings[(("failure_class", "retryable_infra"), ("instance", f"127.0.0.1:{port}"),
                         ("job", "ftwatch"), ("job_id", "prom-e2e"), ("severity", "error"))] >= 1
        assert prom.value('ftwatch_spool_items{spool="alerts", state="pending"}') == 0
        assert prom.value('up{job="ftwatch"}') == 1
        # the workers wait on the gate: nothing of theirs waits for the loop (the run's lag)
        assert prom.value("ftwatch_run_queue_bytes") == 0 and prom.value("ftwatch_run_queue_age_seconds") == 0
        (tmp_path / "gate").unlink()                      # attempt 1 finishes
        assert ft.wait(60) == 0
    finally:
        output = stop(ft)
        prom.stop()
    assert f"metrics on http://127.0.0.1:{port}/metrics" in output


def test_prometheus_scrapes_watch_lines_and_ingest_lag(tmp_path: Path):
    port = free_port()
    (tmp_path / "watch.yaml").write_text(
        "watch:\n  sources:\n    - {type: http, name: in, host: 127.0.0.1, port: 0}\n"
        "  identity: {default_job: shipped}\n")
    prom = Prometheus(tmp_path, f"127.0.0.1:{port}")
    ft = start_ftwatch(tmp_path, "watch", "--config", "watch.yaml", "--state-dir", "state",
                       "--metrics-port", str(port))
    try:
        source_port = wait_for_line(ft, "source in started on port", 60)
        assert source_port, "the http source did not start"
        source_port = int(source_port.rsplit(" ", 1)[1])
        then = time.time() - 30
        records = [{"log": f"step {i} loss 0.5", "date": then + i * 0.01} for i in range(7)]
        assert httpx.post(f"http://127.0.0.1:{source_port}/", json=records, timeout=10).status_code == 200
        assert prom.wait_value('ftwatch_lines_total{job_id="shipped"}', lambda v: v >= 7) == 7
        assert prom.wait_value("ftwatch_ingest_lag_seconds_count", lambda v: v >= 1) == 1
        assert prom.value("ftwatch_ingest_lag_last_seconds") >= 29.9
        assert prom.value('ftwatch_ingest_lag_seconds_bucket{le="10.0"}') == 0   # 30 s: above it
        assert prom.value("ftwatch_queue_batches") == 0
    finally:
        stop(ft)
        prom.stop()
