"""`ftwatch check` and `ftwatch test-rules` from the command line (T1, T2)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ftwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_check_accepts_the_example_configs():
    """The shipped example configs, their custom rules, the tables and the templates are valid."""
    for config in ("examples/ftwatch.yaml", "examples/watch.yaml", "examples/watch-stdin.yaml"):
        proc = ftwatch("check", config)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("ok:")


def test_check_reports_every_error_with_file_and_line(tmp_path):
    """Config errors and rule errors all come out at once, each with file:line."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: my.rule\n    keywords: [oops]\n    class: nope\n    action: restart_job\n"
                     "  - id: my.other\n    regex: ['(a']\n    class: user_code\n    action: fail_job\n")
    config = tmp_path / "ftwatch.yaml"
    config.write_text(f"policy:\n  job_hang_interval: -5\n  bogus: 1\nrules:\n  files: [{rules}]\n")
    proc = ftwatch("check", str(config))
    assert proc.returncode == 1
    out = proc.stdout
    assert f"{config}:2:" in out and "job_hang_interval" in out
    assert f"{config}:3:" in out and "bogus" in out
    assert f"{rules}:4:" in out and "nope" in out
    assert f"{rules}:7:" in out and "(a" in out


def test_test_rules_fails_on_a_missed_example(tmp_path):
    """A rule whose example does not hit makes test-rules exit non-zero and name it."""
    rules = tmp_path / "r.yaml"
    rules.write_text("rules:\n  - id: my.rule\n    keywords: [disk quota exceeded]\n    class: retryable_infra\n"
                     "    action: restart_job\n    examples: ['OSError: [Errno 122] Disk quota exceeded']\n"
                     "    counterexamples: ['quota ok']\n")
    proc = ftwatch("test-rules", "--no-builtin", str(rules))
    assert proc.returncode == 1
    assert "my.rule" in proc.stdout


def test_test_rules_exit_status_counterexample_hit_and_all_passing(tmp_path, capsys):
    """T2: a counterexample that hits fails the run too (exit 1); a file whose examples and
    counterexamples all behave exits 0 (in-process, through the CLI's main)."""
    from ftwatch.cli import main
    head = "rules:\n  - id: my.rule\n    keywords: [Disk quota exceeded]\n    class: retryable_infra\n    action: restart_job\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(head + "    examples: ['OSError: [Errno 122] Disk quota exceeded']\n"
                          "    counterexamples: ['warning: Disk quota exceeded soon']\n")
    assert main(["test-rules", "--no-builtin", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "counterexample hits the rule (expected no hit)" in out and "1 rules tested: 1 failure" in out
    good = tmp_path / "good.yaml"
    good.write_text(head + "    examples: ['OSError: [Errno 122] Disk quota exceeded']\n"
                           "    counterexamples: ['OSError: [Errno 28] No space left on device']\n")
    assert main(["test-rules", "--no-builtin", str(good)]) == 0
    assert "1 rules tested: ok" in capsys.readouterr().out
