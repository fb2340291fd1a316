"""README "Watching a cluster", step 3: `ftwatch watch` on standard input decides at end of input."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def watch_stdin(tmp_path: Path, log: Path, config: Path = ROOT / "examples" / "watch-stdin.yaml"
                ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    decisions = tmp_path / "d.jsonl"
    with log.open("rb") as fh:
        proc = subprocess.run([sys.executable, "-m", "ftwatch", "watch", "--config",
                               str(config), "--state-dir", str(tmp_path / "s"),
                               "--decisions-file", str(decisions)],
                              stdin=fh, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    rows = [json.loads(x) for x in decisions.read_text().splitlines()] if decisions.exists() else []
    return proc, rows


def test_keyerror_log_on_stdin_fails_the_job_naming_rank_1(tmp_path):
    """The recorded KeyError run piped in -> one fail_job naming rank 1's KeyError."""
    proc, rows = watch_stdin(tmp_path, ROOT / "tests" / "golden" / "torchrun_keyerror" / "combined.log")
    assert proc.returncode == 0, proc.stderr
    assert [r["action"] for r in rows] == ["fail_job"]
    assert rows[0]["root_cause"]["rank"] == 1 and "KeyError" in rows[0]["root_cause"]["line"]


def test_clean_log_on_stdin_decides_nothing(tmp_path):
    """A clean recorded run piped in -> no decision."""
    proc, rows = watch_stdin(tmp_path, ROOT / "tests" / "golden" / "torchrun_clean" / "combined.log")
    assert proc.returncode == 0, proc.stderr
    assert rows == []


def test_a_clean_log_whose_launcher_says_it_finished_ends_the_job_as_succeeded(tmp_path):
    """The clean recorded run, then torchrun's INFO line that its worker group finished: at the end
    of input the job ends as succeeded (one none decision), its run is "succeeded" in the store
    and its budgets file is closed, so a job of that name later starts afresh."""
    log = tmp_path / "in.log"
    log.write_bytes((ROOT / "tests" / "golden" / "torchrun_clean" / "combined.log").read_bytes()
                    + b"I1121 11:02:19.507000 18964 torch/distributed/elastic/agent/server/api.py:933] [default] "
                      b"worker group successfully finished. Waiting 300.0 seconds for other agents to finish.\n")
    proc, rows = watch_stdin(tmp_path, log)
    assert proc.returncode == 0, proc.stderr
    assert [(r["action"], r["policy_clause"]) for r in rows] == [
        ("none", "the job ended by itself: job succeeded → none")]
    with sqlite3.connect(tmp_path / "s" / "ftwatch.db") as conn:
        assert conn.execute("SELECT status FROM runs").fetchall() == [("succeeded",)]
    [budgets] = (tmp_path / "s" / "budgets").glob("*.json")
    assert json.loads(budgets.read_text())["status"] == "succeeded"


def test_a_job_that_runs_again_after_its_finish_is_a_second_run(tmp_path):
    """The clean recorded run and its launcher's finish, then a torchelastic agent starts again on
    the same stream and the recorded KeyError run follows: the first run ends succeeded (none),
    the second is a run of its own that fails (fail_job naming rank 1)."""
    golden = ROOT / "tests" / "golden"
    log = tmp_path / "in.log"
    log.write_bytes((golden / "torchrun_clean" / "combined.log").read_bytes()
                    + b"I1121 11:02:19.507000 18964 torch/distributed/elastic/agent/server/api.py:933] [default] "
                      b"worker group successfully finished. Waiting 300.0 seconds for other agents to finish.\n"
                    + b"I1121 11:40:02.101000 20011 torch/distributed/elastic/agent/server/api.py:889] [default] "
                      b"starting workers for entrypoint: python\n"
                    + (golden / "torchrun_keyerror" / "combined.log").read_bytes())
    proc, rows = watch_stdin(tmp_path, log)
    assert proc.returncode == 0, proc.stderr
    assert [r["action"] for r in rows] == ["none", "fail_job"]
    assert rows[1]["root_cause"]["rank"] == 1 and "KeyError" in rows[1]["root_cause"]["line"]
    with sqlite3.connect(tmp_path / "s" / "ftwatch.db") as conn:
        assert conn.execute("SELECT status FROM runs ORDER BY rowid").fetchall() == [("succeeded",), ("failed",)]


def test_torchrun_summary_on_stdin_names_the_sigkilled_rank(tmp_path):
    """torchrun's failure summary in the stream gives the exits: rank 1's SIGKILL is the root cause,
    not the survivors' gloo resets nor the agent's SIGTERM to them."""
    proc, rows = watch_stdin(tmp_path, ROOT / "tests" / "golden" / "torchrun_sigkill" / "combined.log")
    assert proc.returncode == 0, proc.stderr
    assert [r["action"] for r in rows] == ["restart_job"]
    rc = rows[0]["root_cause"]
    assert rc["rule_id"] == "exit.sigkill" and rc["rank"] == 1 and rc["failure_class"] == "retryable_infra"


def test_c4d_warn_on_stdin_notifies_and_the_implicit_node_is_not_blamed(tmp_path):
    """A C4D Warn piped in is a notify decision (R8); repeated Xid 94s on stdin (node unknown:
    ``localhost``) are never blamed on a node."""
    log = tmp_path / "in.log"
    log.write_text("step 1 loss 0.5\n[C4D] Warn RankCommHang rank=1 node=gpu-node-7 duration=12s times=1\n")
    proc, rows = watch_stdin(tmp_path, log)
    assert proc.returncode == 0, proc.stderr
    assert [r["action"] for r in rows] == ["notify"], rows
    config = tmp_path / "blame.yaml"
    config.write_text((ROOT / "examples" / "watch-stdin.yaml").read_text() + "recovery:\n  blame: {enabled: true}\n")
    for i in range(3):
        log.write_text("NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, Contained ECC error.\n")
        proc, rows = watch_stdin(tmp_path, log, config)
        assert proc.returncode == 0, proc.stderr
        assert rows and all("blame" not in r["policy_clause"] for r in rows), rows
