"""End to end health checks (H1-H3) with real torch processes (gloo, CPU) and the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftwatch.pipeline.sinks.sqlite import SqliteStore

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def ftwatch(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run([PY, "-m", "ftwatch", *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def blocks(log: Path) -> list[list[str]]:
    """The fault-tolerance log split into blocks, timestamps removed."""
    out: list[list[str]] = []
    for line in log.read_text().splitlines():
        text = line[20:]
        if text.startswith("Start to run"):
            out.append([])
        out[-1].append(text)
    return out


def test_bootcheck_before_every_attempt_and_troubleshooting_after_the_failure(tmp_path):
    proc = ftwatch(["run", "--nproc-per-node", "2", "--state-dir", "st", "--enable-job-restart=True", "--",
                    PY, str(ROOT / "examples" / "train_ddp.py"), "--steps", "12", "--step-time", "0.05",
                    "--checkpoint-dir", "ck"], tmp_path, {"FTWATCH_INJECT_FAULT": "sigkill"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = blocks(tmp_path / "st" / "fault-tolerance.log")
    assert [b[0] for b in found] == ["Start to run Bootchecking...", "Start to run Troubleshooting...",
                                     "Start to run Bootchecking..."]
    assert [b[-1] for b in found] == ["Check Finished.", "Check Finished, task will be restarted.",
                                      "Check Finished."]
    for block in found:
        assert "AllReduce Check: Succeed" in block
        assert any(line.startswith("DiskTest ") and line.endswith(": Succeed") for line in block)
        assert any(line.startswith("PyTorch Version: ") for line in block)
        assert any("Bus Bandwidth Average: " in line for line in block)
        assert any(line.startswith("GPU Check: skipped: ") or line.startswith("GPU ") for line in block)
    # in the store: each Bootcheck before its attempt's workers started, the Troubleshooting after the failure
    store = SqliteStore(tmp_path / "st" / "ftwatch.db")
    kinds = [(e["kind"], e["detail"].get("attempt")) for e in store.events()
             if e["kind"] in ("bootcheck", "troubleshooting", "job_start", "instance_start", "job_restart")]
    health = [k for k in kinds if k[0] in ("bootcheck", "troubleshooting")]
    assert health == [("bootcheck", 0), ("troubleshooting", 0), ("bootcheck", 1)]
    first_start = next(i for i, k in enumerate(kinds) if k[0] == "instance_start")
    assert kinds.index(("bootcheck", 0)) < first_start
    restart = kinds.index(("job_restart", None)) if ("job_restart", None) in kinds else None
    second_boot = kinds.index(("bootcheck", 1))
    later_starts = [i for i, k in enumerate(kinds) if k[0] == "instance_start" and i > kinds.index(("troubleshooting", 0))]
    assert later_starts and second_boot < later_starts[0], kinds
    assert restart is None or restart < second_boot


def test_a_straggler_rank_from_step_lines_in_a_real_run(tmp_path):
    (tmp_path / "c.yaml").write_text("health:\n  bootcheck: false\n  troubleshooting: false\n"
                                     "  straggler:\n    min_steps: 8\n")
    proc = ftwatch(["run", "--config", "c.yaml", "--nproc-per-node", "3", "--state-dir", "st", "--job-id", "sgd",
                    "--", PY, str(ROOT / "examples" / "train_local_sgd.py"), "--steps", "20"], tmp_path,
                   {"FTWATCH_SLOW_RANK": "2", "FTWATCH_SLOW_SECONDS": "0.25"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    findings = [f for f in SqliteStore(tmp_path / "st" / "ftwatch.db").findings_for("sgd")
                if f["failure_class"] == "straggler"]
    assert [f["rank"] for f in findings] == [2], findings
    assert findings[0]["fields"]["slowdown"] >= 1.5 and findings[0]["action"] == "notify"
    assert "ftwatch: straggler: rank 2 is a straggler" in proc.stdout
    assert not (tmp_path / "st" / "fault-tolerance.log").exists()      # bootcheck: false


TQDM_WORKER = """
import os, sys, time
from tqdm import tqdm
dt = 0.09 if os.environ["RANK"] == "1" else 0.03
for _ in tqdm(range(40), mininterval=0, file=sys.stderr):
    time.sleep(dt)
print("done", flush=True)
"""


def test_real_tqdm_bars_show_the_slow_rank_while_they_run(tmp_path):
    """tqdm redraws with \\r and writes \\n only when the bar closes: the updates must still be seen."""
    pytest.importorskip("tqdm")
    (tmp_path / "w.py").write_text(TQDM_WORKER)
    (tmp_path / "c.yaml").write_text("health:\n  bootcheck: false\n  troubleshooting: false\n"
                                     "  straggler:\n    min_steps: 8\n")
    proc = ftwatch(["run", "--config", "c.yaml", "--nproc-per-node", "2", "--state-dir", "st", "--job-id", "bars",
                    "--", PY, "w.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    findings = [f for f in SqliteStore(tmp_path / "st" / "ftwatch.db").findings_for("bars")
                if f["failure_class"] == "straggler"]
    assert [f["rank"] for f in findings] == [1], proc.stdout
    assert findings[0]["fields"]["pattern"] == "tqdm_its" and findings[0]["fields"]["slowdown"] >= 2.0
    assert "ftwatch: straggler: rank 1 is a straggler" in proc.stdout
    # the echo: one line per update seen, no raw carriage returns, the bars' updates readable
    assert "\r" not in proc.stdout
    assert any(line.startswith("[rank1]! ") and "it/s]" in line for line in proc.stdout.splitlines())


NODECHECK_CONFIG = "health:\n  nodecheck:\n    gemm_size: 128\n    gemm_iters: 4\n    timeout: 20\n"


def test_nodecheck_finds_the_slow_group_and_the_one_that_crashes(tmp_path):
    (tmp_path / "c.yaml").write_text(NODECHECK_CONFIG)
    proc = ftwatch(["nodecheck", "--nnodes=2:4", "--exclude-straggler", "--config", "c.yaml", "--state-dir", "st"],
                   tmp_path, {"FTWATCH_HEALTH_SLOW": "1:1.0", "FTWATCH_HEALTH_CRASH": "3"})
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr              # 2 usable nodes >= MIN 2
    assert "Node Check node 3: faulty: The node is down." in out
    assert "Node Check node 1: straggler: The node is a straggler and exits." in out
    assert "Node Check node 0: ok" in out and "Node Check node 2: ok" in out
    assert "2 of 4 nodes usable [0, 2], excluded [1, 3]." in out
    log = (tmp_path / "st" / "fault-tolerance.log").read_text()
    assert "Start to run NodeCheck..." in log and "The node is down." in log
    findings = SqliteStore(tmp_path / "st" / "ftwatch.db").findings_for("nodecheck")
    assert {(f["fields"]["node"], f["action"]) for f in findings} == {(3, "isolate_node"), (1, "isolate_node")}


def test_network_check_with_two_slots_blames_the_one_that_died_and_starts_with_the_other(tmp_path):
    """Slot 1's check process is killed: the crash is the evidence; slot 0 is not blamed (1:2 may start with 1)."""
    (tmp_path / "c.yaml").write_text(NODECHECK_CONFIG)
    proc = ftwatch(["run", "--network-check", "--config", "c.yaml", "--nproc-per-node", "1:2", "--state-dir", "st",
                    "--", PY, "-c", "print('training started')"], tmp_path, {"FTWATCH_HEALTH_CRASH": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "worker slot 1: faulty: The node is down." in proc.stdout
    assert "worker slot 0: ok" in proc.stdout and "suspect" not in proc.stdout
    assert "1 of 2 worker slots usable [0], excluded [1]." in proc.stdout
    assert "training started" in proc.stdout


def test_network_check_with_two_slots_that_must_all_start_does_not_start(tmp_path):
    (tmp_path / "c.yaml").write_text(NODECHECK_CONFIG)
    proc = ftwatch(["run", "--network-check", "--config", "c.yaml", "--nproc-per-node", "2", "--state-dir", "st",
                    "--", PY, "-c", "print('training started')"], tmp_path, {"FTWATCH_HEALTH_CRASH": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "worker slot 1: faulty" in proc.stdout and "worker slot 0: ok" in proc.stdout
    assert "training started" not in proc.stdout


def test_watch_finds_a_straggler_in_shipped_megatron_lines(tmp_path):
    """`ftwatch watch` on stdin: Megatron's per-rank elapsed time names the slow rank (no torch here)."""
    line = ("[rank{r}]: [2026-11-21 09:00:{n:02d}] iteration {n:>8}/     100 | consumed samples: {s} | "
            "elapsed time per iteration (ms): {ms} | learning rate: 1.000E-04 | lm loss: 7.1E+00 |\n")
    log = "".join(line.format(r=r, n=n, s=64 * n, ms=ms) for n in range(1, 16)
                  for r, ms in ((0, 1001.2), (1, 998.7), (2, 1003.0), (3, 2480.5)))
    proc = subprocess.run([PY, "-m", "ftwatch", "watch", "--config", str(ROOT / "examples" / "watch-stdin.yaml"),
                           "--state-dir", "st"], input=log, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    store = SqliteStore(tmp_path / "st" / "ftwatch.db")
    found = [f for f in store.findings_for("default") if f["failure_class"] == "straggler"]   # watch.identity
    assert [f["rank"] for f in found] == [3], found
    assert found[0]["fields"]["pattern"] == "megatron"
    assert found[0]["fields"]["slowdown"] == pytest.approx(2480.5 / 1001.2, rel=0.01)
