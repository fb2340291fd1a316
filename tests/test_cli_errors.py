"""Clean command-line errors (issue 17, item 4): every user mistake is one line on stderr and a
documented exit status; a closed stdout ends quietly; Ctrl-C ends quietly after cleanup.

Each case runs the real ``ftwatch`` console script in a subprocess (the pipes through a real
``head`` in a shell), and asserts stderr and the exit status.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftwatch.cli.common import EXIT_STATUSES
from ftwatch.testing import KEYERROR_JOB

_SCRIPT = Path(sys.executable).with_name("ftwatch")
FTWATCH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "ftwatch"]
README = Path(__file__).resolve().parents[1] / "README.md"


def ftwatch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*FTWATCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """stderr is exactly one line, without a traceback, containing each of ``needles``."""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def piped(command: list[str], reader: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command | reader`` in bash; the returncode is ``command``'s own (PIPESTATUS)."""
    line = f"{shlex.join(command)} | {reader}; exit ${{PIPESTATUS[0]}}"
    return subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


# -- user mistakes: one line, a documented status ---------------------------------------------------

def test_replay_of_a_missing_file_is_one_line_and_a_usage_error(tmp_path):
    proc = ftwatch("replay", "nope.log", cwd=tmp_path)
    assert proc.returncode == 2
    one_line(proc, "ftwatch replay", "nope.log", "no such file")


def test_replay_of_a_directory_is_one_line_and_a_usage_error(tmp_path):
    (tmp_path / "logs").mkdir()
    proc = ftwatch("replay", "logs", cwd=tmp_path)
    assert proc.returncode == 2
    one_line(proc, "logs", "a directory")


def test_a_mistyped_training_command_is_one_line_status_127_and_starts_nothing(tmp_path):
    proc = ftwatch("run", "--nproc-per-node", "2", "--state-dir", "state", "--", "no-such-binary-ftwatch",
                   cwd=tmp_path)
    assert proc.returncode == 127
    one_line(proc, "ftwatch run", "no-such-binary-ftwatch", "command not found")
    assert not (tmp_path / "state").exists()          # checked before any store or worker


def test_a_training_script_that_is_not_executable_is_status_126(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = ftwatch("run", "--state-dir", "state", "--", "./train.py", cwd=tmp_path)
    assert proc.returncode == 126
    one_line(proc, "./train.py", "not executable")


@pytest.mark.parametrize("args, needle", [
    (["run", "--no-such-option", "--", "true"], "unrecognized arguments: --no-such-option"),
    (["run", "--nproc-per-node", "1"], "give the training command after --"),
    (["explain", "--state-dir"], "expected one argument"),
    (["no-such-command"], "unknown command 'no-such-command'"),
])
def test_a_bad_command_line_is_one_line_and_status_2(tmp_path, args, needle):
    proc = ftwatch(*args, cwd=tmp_path)
    assert proc.returncode == 2
    one_line(proc, needle)


def test_a_missing_config_file_is_one_line_and_status_2(tmp_path):
    proc = ftwatch("run", "--config", "missing.yaml", "--", "true", cwd=tmp_path)
    assert proc.returncode == 2
    one_line(proc, "ftwatch run: configuration error:", "missing.yaml")


def test_a_file_that_cannot_be_written_is_one_line_and_status_1(decided):
    """An OSError on a file the user named (its folder is a file) reaches ``main``: one line."""
    (decided / "afile").write_text("")
    proc = ftwatch("report", "--state-dir", "state", "-o", "afile/report.html", cwd=decided)
    assert proc.returncode == 1
    one_line(proc, "ftwatch report", "afile")


def test_a_listener_that_cannot_start_is_one_line_and_status_1(tmp_path):
    """A SourceError (the port is taken) reaches ``main`` and is said in one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "watch.yaml").write_text(f"watch:\n  sources:\n    - type: forward\n      port: {port}\n")
        proc = ftwatch("watch", "--config", "watch.yaml", "--state-dir", "state", cwd=tmp_path)
    assert proc.returncode == 1
    one_line(proc, "ftwatch watch", f"cannot listen on 127.0.0.1:{port}")


# -- a closed stdout ends quietly ----------------------------------------------------------------

@pytest.fixture(scope="module")
def decided(tmp_path_factory) -> Path:
    """A state directory whose store holds one decision (a job that failed on a KeyError)."""
    tmp = tmp_path_factory.mktemp("decided")
    proc = ftwatch("run", "--state-dir", "state", "--job-id", "cli-errors", "--", *KEYERROR_JOB, cwd=tmp)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return tmp


def test_explain_into_a_closed_pipe_ends_quietly(decided):
    """``ftwatch explain | head -n 0``: head has gone before the first write (no race)."""
    proc = piped([*FTWATCH, "explain", "--state-dir", "state"], "head -n 0", decided)
    assert proc.stderr == "" and proc.returncode == 141


def test_explain_into_head_1_never_shows_a_traceback(decided):
    proc = piped([*FTWATCH, "explain", "--state-dir", "state"], "head -1", decided)
    assert proc.stdout.startswith("Decision ") and proc.stdout.count("\n") == 1
    assert proc.stderr == "" and proc.returncode in (0, 141)    # 0 when it all fitted in the pipe first


def test_replay_into_a_closed_pipe_ends_quietly(tmp_path):
    (tmp_path / "rank0.log").write_text("step 1\nTraceback (most recent call last):\nKeyError: 'lr'\n")
    proc = piped([*FTWATCH, "replay", "rank0.log"], "head -n 0", tmp_path)
    assert proc.stderr == "" and proc.returncode == 141


def test_run_into_head_ends_quietly_after_stopping_its_workers(tmp_path):
    """``ftwatch run ... | head -1`` with far more output than a pipe holds: the workers are stopped
    (the worker record is gone: a clean end), nothing goes to stderr, status 141."""
    chatty = [sys.executable, "-c", "import time\nfor i in range(10**6): print(i)\ntime.sleep(600)"]
    proc = piped([*FTWATCH, "run", "--state-dir", "state", "--", *chatty], "head -1", tmp_path)
    assert proc.stdout.count("\n") == 1
    assert proc.stderr == "" and proc.returncode == 141
    assert list((tmp_path / "state" / "workers").glob("*")) == []


# -- Ctrl-C ends quietly ------------------------------------------------------------------------------

def test_ctrl_c_ends_quietly_with_130_after_cleanup(tmp_path):
    """SIGINT while ``replay`` works through a log: status 130, nothing on stderr, and its
    temporary directory (under $TMPDIR) removed on the way out."""
    log = tmp_path / "rank0.log"
    with open(log, "w") as f:
        for i in range(200_000):      # seconds of work: the signal lands while it reads
            f.write(f"2026-11-21 09:30:{i % 60:02d} INFO step {i} loss 0.{i % 9973:04d} lr 0.001\n")
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([*FTWATCH, "replay", str(log)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    try:
        end = time.monotonic() + 60
        while not _has_open(proc.pid, log):       # a real process's state: polled, bounded
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 130 and err == "", err
    assert list((tmp_path / "tmp").iterdir()) == []


def _has_open(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


# -- the statuses are documented ----------------------------------------------------------------------

def test_every_exit_status_is_in_the_help_and_the_readme():
    usage = subprocess.run([*FTWATCH, "--help"], capture_output=True, text=True, timeout=60).stdout
    section = README.read_text(encoding="utf-8").split("### Exit status", 1)[1].split("\n#", 1)[0]
    for code in EXIT_STATUSES:
        assert f"\n  {code} " in usage, code
        assert f"- `{code}`" in section, code
