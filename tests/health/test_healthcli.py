"""``ftwatch bootcheck`` and ``ftwatch run --network-check`` (H1, H2): the commands themselves, with
real agents, a real store and (for the run) the real command line in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from ftwatch.cli.health import cmd_bootcheck
from ftwatch.pipeline.sinks.sqlite import SqliteStore


def test_bootcheck_exits_1_on_a_failed_check_and_stores_the_event(tmp_path, capsys):
    """A configured path that is not there (a missing mount): exit 1, the block says blocked,
    the folder is not created, and the store has the event with the failed check."""
    state = tmp_path / "state"
    missing = tmp_path / "mnt" / "data"
    status = cmd_bootcheck(["--state-dir", str(state), "--path", str(missing), "--no-allreduce",
                            "--nproc-per-node", "1:2", "--job-id", "bc"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "no such folder: not mounted?" in out
    assert out.splitlines()[-2].endswith("Check Finished: blocked.")
    assert not missing.exists()
    store = SqliteStore(state / "ftwatch.db")
    events = [e for e in store.events("bc") if e["kind"] == "bootcheck"]
    assert len(events) == 1 and events[0]["detail"]["verdict"] == "blocked"
    disk = events[0]["detail"]["checks"][0]
    assert disk["check"] == "disk" and disk["status"] == "fail" and disk["action"] == "isolate_node"
    assert [f["rule_id"] for f in store.findings_for("bc")] == ["health.disk"]


def test_bootcheck_rejects_a_bad_range(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cmd_bootcheck(["--state-dir", str(tmp_path), "--nproc-per-node", "3:1"])
    assert exc.value.code == 2 and "--nproc-per-node" in capsys.readouterr().err


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]          # closed again: nothing listens there


@pytest.mark.slow
def test_run_with_network_check_and_elasticsearch_configured(tmp_path):
    """The network check's store (SQLite + the Elasticsearch buffer) is closed before the run
    opens its own: the run starts (the sink only buffers, the cluster being down)."""
    pytest.importorskip("torch")
    config = tmp_path / "ftwatch.yaml"
    config.write_text(
        f"storage:\n  state_dir: {tmp_path / 'state'}\n  elasticsearch:\n    url: http://127.0.0.1:{_dead_port()}\n"
        "    flush_interval: 60\n"
        "supervisor:\n  nproc_per_node: 2\n  restart_delay: 0\n"
        "health:\n  bootcheck: false\n  troubleshooting: false\n"
        "  nodecheck:\n    gemm_size: 64\n    allreduce_bytes: 4096\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")}
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "run", "--config", str(config), "--job-id", "esjob",
                           "--network-check", "--", sys.executable, "-c", "print('worker ok')"],
                          capture_output=True, text=True, timeout=300, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "buffer in use" not in output
    assert "[rank0] worker ok" in output and "[rank1] worker ok" in output, output
    store = SqliteStore(tmp_path / "state" / "ftwatch.db")
    kinds = [e["kind"] for e in store.events("esjob")]
    assert "nodecheck" in kinds and "job_start" in kinds
    buffered = list((tmp_path / "state" / "es-buffer").rglob("*"))
    assert buffered, "the Elasticsearch sink kept nothing on disk"
