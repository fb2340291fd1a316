"""README "Watching a cluster", step 3: `ftwatch watch` on standard input decides at end of input."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def watch_stdin(tmp_path: Path, log: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    decisions = tmp_path / "d.jsonl"
    with log.open("rb") as fh:
        proc = subprocess.run([sys.executable, "-m", "ftwatch", "watch", "--config",
                               str(ROOT / "examples" / "watch-stdin.yaml"), "--state-dir", str(tmp_path / "s"),
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


def test_torchrun_summary_on_stdin_names_the_sigkilled_rank(tmp_path):
    """torchrun's failure summary in the stream gives the exits: rank 1's SIGKILL is the root cause,
    not the survivors' gloo resets nor the agent's SIGTERM to them."""
    proc, rows = watch_stdin(tmp_path, ROOT / "tests" / "golden" / "torchrun_sigkill" / "combined.log")
    assert proc.returncode == 0, proc.stderr
    assert [r["action"] for r in rows] == ["restart_job"]
    rc = rows[0]["root_cause"]
    assert rc["rule_id"] == "exit.sigkill" and rc["rank"] == 1 and rc["failure_class"] == "retryable_infra"
