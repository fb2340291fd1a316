"""The local supervisor (S1, A1, A2) with real worker processes.

Workers are small ``python -c`` programs (each starts in a few tens of milliseconds); the tests
marked ``slow`` run the bundled PyTorch trainer on gloo. Nothing here sleeps to let time pass: the
tests wait for real events (a line, an exit, a process state) with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ftwatch.errors import SourceError
from ftwatch.events import ProcessExit
from ftwatch.pipeline.sources.supervisor import Output, Started, Supervisor

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train_ddp.py"
ASYNC = ROOT / "examples" / "worker_async.py"
DEADLINE = 30.0

# A worker that prints "ready" and then waits until it is killed.
WAIT_FOREVER = "print('ready'); import time\nwhile True: time.sleep(60)"


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


class Log:
    """Everything a supervisor reported, collected by polling until a condition holds."""

    def __init__(self, sup: Supervisor):
        self.sup = sup
        self.events: list = []

    def until(self, cond, deadline: float = DEADLINE) -> "Log":
        end = time.monotonic() + deadline
        while not cond(self):
            left = end - time.monotonic()
            assert left > 0, f"condition not met in {deadline} s; events: {self.events[-20:]}"
            self.events.extend(self.sup.poll(min(left, 0.5)))
        return self

    def exits(self, rank: int | None = None) -> list[ProcessExit]:
        return [e for e in self.events if isinstance(e, ProcessExit) and rank in (None, e.origin.rank)]

    def starts(self, rank: int | None = None) -> list[Started]:
        return [e for e in self.events if isinstance(e, Started) and rank in (None, e.origin.rank)]

    def text(self, rank: int, stream: str = "stdout") -> bytes:
        return b"".join(e.data for e in self.events if isinstance(e, Output)
                        and e.origin.rank == rank and e.origin.stream == stream)

    def has(self, rank: int, needle: bytes, stream: str = "stdout") -> bool:
        return needle in self.text(rank, stream)

    @staticmethod
    def all_exited(n: int):
        return lambda log: len(log.exits()) >= n


@pytest.fixture
def make():
    made: list[Supervisor] = []

    def _make(command, nproc=1, **kw) -> tuple[Supervisor, Log]:
        sup = Supervisor(command, nproc, **kw)
        made.append(sup)
        return sup, Log(sup)

    yield _make
    for sup in made:
        sup.close()


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...], or None if no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def gone(pid: int) -> bool:
    """True once no live process has this pid (a zombie waiting for init to reap it is not live)."""
    st = _stat(pid)
    return st is None or st[0] == "Z"


def group_gone(pgid: int) -> bool:
    """True once no live process is left in the process group."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(name)
            if st is not None and st[2] == str(pgid) and st[0] != "Z":
                return False
    return True


def wait_for(cond, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.01)   # polling a process state that has no event to wait on


# -- environment -----------------------------------------------------------------------------

ENV_KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED", "TORCHELASTIC_RESTART_COUNT",
            "MA_SCHEDULE_CNT", "MA_PROC_START_CNT", "FTWATCH_ATTEMPT", "EXTRA"]
PRINT_ENV = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS!r}}}))"


def envs(log: Log, nproc: int, start: int) -> dict[int, dict]:
    """The environment each rank printed in its last run (``start``: events already consumed)."""
    out = {}
    for r in range(nproc):
        data = b"".join(e.data for e in log.events[start:] if isinstance(e, Output) and e.origin.rank == r)
        out[r] = json.loads(data)
    return out


def test_env_per_rank_and_fresh_master_port_per_job_start(make):
    sup, log = make(py(PRINT_ENV), 3, env={"EXTRA": "x", "RANK": "overridden"})
    sup.start_all(0)
    log.until(log.all_exited(3))
    first = envs(log, 3, 0)
    for r, e in first.items():
        assert e["RANK"] == e["LOCAL_RANK"] == e["ROLE_RANK"] == str(r)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "3"
        assert e["GROUP_RANK"] == "0" and e["MASTER_ADDR"] == "127.0.0.1"
        assert e["PYTHONUNBUFFERED"] == "1" and e["EXTRA"] == "x"
        assert (e["TORCHELASTIC_RESTART_COUNT"], e["MA_SCHEDULE_CNT"], e["MA_PROC_START_CNT"],
                e["FTWATCH_ATTEMPT"]) == ("0", "1", "1", "1")
    port = int(first[0]["MASTER_PORT"])
    assert {e["MASTER_PORT"] for e in first.values()} == {str(port)}
    with socket.socket() as s:           # nobody holds it: it was free
        s.bind(("127.0.0.1", port))

    mark = len(log.events)
    sup.start_all(1)                     # a job restart: in place (seed 002)
    log.until(log.all_exited(6))
    second = envs(log, 3, mark)
    assert int(second[0]["MASTER_PORT"]) != port
    assert {(e["TORCHELASTIC_RESTART_COUNT"], e["MA_SCHEDULE_CNT"], e["MA_PROC_START_CNT"],
             e["FTWATCH_ATTEMPT"]) for e in second.values()} == {("1", "1", "2", "2")}

    mark = len(log.events)
    sup.start_all(2, reschedule=True)    # a modelled rescheduling resets MA_PROC_START_CNT
    log.until(log.all_exited(9))
    third = envs(log, 3, mark)
    assert {(e["MA_SCHEDULE_CNT"], e["MA_PROC_START_CNT"], e["FTWATCH_ATTEMPT"])
            for e in third.values()} == {("2", "1", "3")}


def test_fixed_master_port_is_kept(make):
    sup, log = make(py(PRINT_ENV), 1, master_port=29123)
    sup.start_all(0)
    log.until(log.all_exited(1))
    sup.start_all(1)
    log.until(log.all_exited(2))
    assert log.text(0).count(b'"MASTER_PORT": "29123"') == 2


# -- streams -----------------------------------------------------------------------------------

def test_stdout_and_stderr_are_separate_and_ordered(make):
    sup, log = make(py("""
        import sys
        for i in range(300):
            print(f"out {i}")
            print(f"err {i}", file=sys.stderr)
    """), 2)
    sup.start_all(0)
    log.until(log.all_exited(2))
    for r in range(2):
        assert log.text(r, "stdout") == b"".join(b"out %d\n" % i for i in range(300))
        assert log.text(r, "stderr") == b"".join(b"err %d\n" % i for i in range(300))
    for e in log.events:
        if isinstance(e, Output):
            assert e.data.endswith(b"\n")
            assert e.origin.instance == f"worker-{e.origin.rank}" and e.origin.source == "process"


def test_line_arrives_while_the_worker_still_runs(make):
    # print() without flush: PYTHONUNBUFFERED=1 from the supervisor makes it reach us at once
    sup, log = make(py(WAIT_FOREVER))
    sup.start_all(0)
    log.until(lambda lg: lg.has(0, b"ready\n"))
    assert sup.running() == {0} and not log.exits()


def test_partial_last_line_is_flushed_with_a_newline(make):
    sup, log = make(py("import sys; sys.stdout.write('a\\nb\\npartial'); sys.stderr.write('e')"))
    sup.start_all(0)
    log.until(log.all_exited(1))
    assert log.text(0) == b"a\nb\npartial\n"
    assert log.text(0, "stderr") == b"e\n"


def test_invalid_utf8_passes_through_as_bytes(make):
    raw = b"\xff\xfe bad \xc3( end\n\x00\x80\n"
    sup, log = make(py(f"import os; os.write(1, {raw!r})"))
    sup.start_all(0)
    log.until(log.all_exited(1))
    assert log.text(0) == raw


def test_exit_comes_after_the_last_output_of_both_streams(make):
    sup, log = make(py("""
        import os, sys
        for i in range(2000):
            sys.stdout.write(f"line {i}\\n"); sys.stderr.write(f"err {i}\\n")
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(0)
    """), 3)
    sup.start_all(0)
    log.until(log.all_exited(3))
    for r in range(3):
        idx = [i for i, e in enumerate(log.events) if e.origin.rank == r]
        kinds = [type(log.events[i]) for i in idx]
        assert kinds[0] is Started and kinds[-1] is ProcessExit and kinds.count(ProcessExit) == 1
        assert log.text(r).endswith(b"line 1999\n") and log.text(r, "stderr").endswith(b"err 1999\n")


# -- exits -------------------------------------------------------------------------------------

def test_exit_codes_and_signals(make):
    sup, log = make(py("""
        import os, signal, sys
        rank = int(os.environ["RANK"])
        if rank == 0: sys.exit(3)
        if rank == 1: os.kill(os.getpid(), signal.SIGKILL)
        if rank == 2: os.kill(os.getpid(), signal.SIGSEGV)
    """), 4)
    sup.start_all(0)
    log.until(log.all_exited(4))
    got = {e.origin.rank: (e.returncode, e.signal, e.stopped_by_us, e.ok) for e in log.exits()}
    assert got == {0: (3, None, False, False), 1: (None, signal.SIGKILL, False, False),
                   2: (None, signal.SIGSEGV, False, False), 3: (0, None, False, True)}
    assert {e.pid for e in log.exits()} == {s.pid for s in log.starts()}


def test_a_command_that_cannot_start_raises_source_error(make):
    sup, _ = make(["/nonexistent/ftwatch-test-binary"], 2)
    with pytest.raises(SourceError):
        sup.start_all(0)
    assert sup.running() == set()


# -- stop_all (A1) -----------------------------------------------------------------------------

def test_stop_all_terminates_gracefully_and_reports_once(make):
    sup, log = make(py(WAIT_FOREVER), 2)
    sup.start_all(0)
    log.until(lambda lg: all(lg.has(r, b"ready") for r in range(2)))
    returned = sup.stop_all(grace=10)
    assert [(e.origin.rank, e.signal, e.stopped_by_us) for e in returned] == \
        [(0, signal.SIGTERM, True), (1, signal.SIGTERM, True)]
    log.until(log.all_exited(2))
    assert sorted(log.exits(), key=lambda e: e.origin.rank) == returned   # the same events, once
    assert sup.poll(0) == [] and sup.running() == set()
    wait_for(lambda: all(group_gone(e.pid) for e in returned))


def test_worker_ignoring_sigterm_is_killed_after_the_grace(make):
    sup, log = make(py("""
        import signal, time
        signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
        print("ready", flush=True)
        while True: time.sleep(60)
    """))
    sup.start_all(0)
    log.until(lambda lg: lg.has(0, b"ready"))
    [exit_] = sup.stop_all(grace=0.5)
    assert (exit_.signal, exit_.stopped_by_us) == (signal.SIGKILL, True)
    log.until(log.all_exited(1))
    assert log.has(0, b"ignoring SIGTERM")             # it did get the SIGTERM first


def test_sigstopped_worker_is_stopped(make):
    sup, log = make(py("import os, signal; print('ready', flush=True); os.kill(os.getpid(), signal.SIGSTOP)"))
    sup.start_all(0)
    log.until(lambda lg: lg.has(0, b"ready"))
    pid = log.starts(0)[0].pid

    wait_for(lambda: _stat(pid)[0] == "T")
    assert sup.running() == {0}                        # stopped is not exited
    [exit_] = sup.stop_all(grace=10)
    assert (exit_.signal, exit_.stopped_by_us) == (signal.SIGTERM, True)
    wait_for(lambda: group_gone(pid))


def test_no_orphans_children_die_with_the_group(make):
    sup, log = make(py("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
        while True: time.sleep(60)
    """))
    sup.start_all(0)
    log.until(lambda lg: lg.has(0, b"child "))
    child = int(log.text(0).split()[1])
    pgid = log.starts(0)[0].pid
    sup.stop_all(grace=5)
    wait_for(lambda: group_gone(pgid))
    wait_for(lambda: gone(child))


def test_leftover_holding_the_pipes_is_killed_so_the_exit_is_reported(make):
    sup, log = make(py("""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
    """))
    sup.start_all(0)
    log.until(log.all_exited(1))
    [exit_] = log.exits()
    assert exit_.ok and not exit_.stopped_by_us
    wait_for(lambda: gone(int(log.text(0).split()[1])))


def test_leftover_that_let_go_of_the_pipes_lives_until_close(make):
    sup, log = make(py("""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("child", child.pid, flush=True)
    """))
    sup.start_all(0)
    log.until(log.all_exited(1))
    child = int(log.text(0).split()[1])
    assert log.exits()[0].ok and not gone(child)       # like a rank that left while a helper runs
    assert sup.stop_all(grace=5) == []                 # its main process had already exited
    wait_for(lambda: gone(child))
    wait_for(lambda: group_gone(log.starts(0)[0].pid))


def test_close_kills_everything_and_refuses_restarts(make):
    sup, log = make(py(WAIT_FOREVER), 2)
    sup.start_all(0)
    log.until(lambda lg: all(lg.has(r, b"ready") for r in range(2)))
    pids = [s.pid for s in log.starts()]
    with pytest.raises(RuntimeError):
        sup.start_all(1)                               # still running: stop_all first
    sup.close()
    sup.close()
    wait_for(lambda: all(group_gone(p) for p in pids))
    log.until(log.all_exited(2))
    assert all(e.stopped_by_us and e.signal == signal.SIGKILL for e in log.exits())
    with pytest.raises(RuntimeError):
        sup.start_all(1)


# -- signal handlers --------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_stop_from_a_signal_handler_during_a_stop_kills_at_once(make):
    # The worker ignores SIGTERM and answers it with SIGUSR1 to us; our handler calls stop_all
    # again while the first stop_all waits out its 600 s grace: the second stop cuts it short.
    sup, log = make(py("""
        import os, signal, time
        signal.signal(signal.SIGTERM, lambda *a: os.kill(os.getppid(), signal.SIGUSR1))
        print("ready", flush=True)
        while True: time.sleep(60)
    """))
    nested = []
    old = signal.signal(signal.SIGUSR1, lambda *a: nested.append(sup.stop_all()))
    try:
        sup.start_all(0)
        log.until(lambda lg: lg.has(0, b"ready"))
        [exit_] = sup.stop_all(grace=600)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert nested == [[]] and exit_.signal == signal.SIGKILL and exit_.stopped_by_us


@pytest.mark.timeout(60)
def test_a_stop_asked_for_as_the_first_stop_signals_cuts_its_grace_short(make, monkeypatch):
    """The window the test above meets only by chance (it then waited out its grace): the
    worker's answer to SIGTERM is handled as soon as the signal is sent, before the first stop
    has begun to wait. Here sending SIGTERM itself asks for the nested stop, every time: the
    first stop is already hurried when it begins to wait, and ends in SIGKILL at once."""
    from ftwatch.pipeline.sources import supervisor as module
    sup, log = make(py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        while True: time.sleep(60)
    """))
    real, nested, hurried = module.killpg, [], []

    def killpg(worker, sig):
        real(worker, sig)
        if sig == signal.SIGTERM and not nested:
            nested.append(sup.stop_all())               # as the SIGUSR1 handler above does

    waits = sup._stop_unbounded

    def wait(*args, **kwargs):
        hurried.append(sup._hurry.is_set())
        return waits(*args, **kwargs)

    monkeypatch.setattr(module, "killpg", killpg)
    monkeypatch.setattr(sup, "_stop_unbounded", wait)
    sup.start_all(0)
    log.until(lambda lg: lg.has(0, b"ready"))
    [exit_] = sup.stop_all(grace=30)
    assert nested == [[]] and hurried[0] is True
    assert exit_.signal == signal.SIGKILL and exit_.stopped_by_us


def test_stop_from_a_signal_handler_while_polling(make, tmp_path):
    # The worker signals us once start_all has returned (it waits for the file we create then),
    # so the handler interrupts poll() and its stop_all does the whole stop there and then.
    go = tmp_path / "go"
    sup, log = make(py(f"""
        import os, signal, time
        while not os.path.exists({str(go)!r}): time.sleep(0.01)
        os.kill(os.getppid(), signal.SIGUSR1)
        while True: time.sleep(60)
    """))
    stopped = []
    old = signal.signal(signal.SIGUSR1, lambda *a: stopped.extend(sup.stop_all(grace=5)))
    try:
        sup.start_all(0)
        go.touch()
        log.until(log.all_exited(1))
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert stopped == log.exits() and stopped[0].stopped_by_us


# -- restart_instance (Async mode) ------------------------------------------------------------

def test_restart_instance_restarts_only_that_rank(make):
    sup, log = make(py("""
        import os, sys, time
        print("start", os.environ["MA_PROC_START_CNT"], os.environ["FTWATCH_ATTEMPT"], flush=True)
        if os.environ["RANK"] == "1":
            sys.exit(1)
        while True: time.sleep(60)
    """), 2)
    sup.start_all(0)
    log.until(lambda lg: lg.exits(1) and lg.has(0, b"start"))
    with pytest.raises(RuntimeError):
        sup.restart_instance(0)                        # still running
    sup.restart_instance(1)
    log.until(lambda lg: len(lg.exits(1)) == 2)
    assert [s.start_count for s in log.starts(1)] == [1, 2]
    assert log.text(1) == b"start 1 1\nstart 2 2\n"
    assert len(log.starts(0)) == 1 and sup.running() == {0} and log.text(0) == b"start 1 1\n"
    with pytest.raises(ValueError):
        sup.restart_instance(5)


def test_async_example_crashes_once_then_succeeds_after_an_instance_restart(make):
    sup, log = make([sys.executable, str(ASYNC), "--steps", "5", "--step-time", "0"], 3,
                    env={"FTWATCH_INJECT_FAULT": "crash", "FTWATCH_INJECT_RANK": "1"})
    sup.start_all(0)
    log.until(log.all_exited(3))
    assert {e.origin.rank: e.returncode for e in log.exits()} == {0: 0, 1: 1, 2: 0}
    err = log.text(1, "stderr")
    assert err.startswith(b"Traceback (most recent call last):\n")
    assert b"RuntimeError: NCCL error in: " in err and b"unhandled system error" in err
    sup.restart_instance(1)
    log.until(log.all_exited(4))
    assert log.exits(1)[-1].ok
    assert b"MA_PROC_START_CNT=2" in log.text(1) and b"rank 1 done" in log.text(1)


# -- the example trainer (real PyTorch DDP on gloo) -----------------------------------------

def trainer(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, str(TRAIN), "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--step-time", "0", *args]


@pytest.mark.slow
def test_trainer_runs_to_the_end(make, tmp_path):
    sup, log = make(trainer(tmp_path, "--steps", "6"), 2)
    sup.start_all(0)
    log.until(log.all_exited(2), deadline=120)
    assert all(e.ok for e in log.exits())
    for r in range(2):
        assert log.has(r, b"training finished at step 6\n")
    assert log.has(0, b"step 6/6 loss ")


@pytest.mark.slow
def test_trainer_resumes_from_its_checkpoint_after_a_sigkill(make, tmp_path):
    fault = {"FTWATCH_INJECT_FAULT": "sigkill", "FTWATCH_INJECT_RANK": "1", "FTWATCH_INJECT_STEP": "8"}
    sup, log = make(trainer(tmp_path, "--steps", "10", "--checkpoint-every", "3"), 2, env=fault,
                    grace_period=5)
    sup.start_all(0)
    log.until(lambda lg: lg.exits(1), deadline=120)
    assert log.exits(1)[0].signal == signal.SIGKILL
    sup.stop_all()                                     # rank 0 fails or is stopped: either way
    log.until(log.all_exited(2))
    assert not log.has(0, b"training finished")
    mark = len(log.events)
    sup.start_all(1)                                   # attempt 1: the fault is not injected again
    log.until(log.all_exited(4), deadline=120)
    again = Log(sup)
    again.events = log.events[mark:]
    assert all(e.ok for e in again.exits())
    for r in range(2):
        assert again.has(r, b"resumed from checkpoint at step 6\n")
        assert again.has(r, b"training finished at step 10\n")
    assert b"step 7/10" in again.text(0) and b"step 6/10" not in again.text(0)


@pytest.mark.slow
def test_trainer_keyerror_fails_on_every_attempt(make, tmp_path):
    sup, log = make(trainer(tmp_path, "--steps", "4"), 2, grace_period=5,
                    env={"FTWATCH_INJECT_FAULT": "keyerror", "FTWATCH_INJECT_STEP": "2"})
    sup.start_all(3)
    log.until(lambda lg: lg.exits(1), deadline=120)
    assert log.exits(1)[0].returncode == 1
    assert b"KeyError: 'warmup_steps'" in log.text(1, "stderr")


@pytest.mark.slow
def test_trainer_exit0_leaves_the_others_blocked_silently(make, tmp_path):
    sup, log = make(trainer(tmp_path, "--steps", "10"), 2, grace_period=5,
                    env={"FTWATCH_INJECT_FAULT": "exit0", "FTWATCH_INJECT_STEP": "3"})
    sup.start_all(0)
    log.until(lambda lg: lg.exits(1), deadline=120)
    assert log.exits(1)[0].ok
    # Rank 0 is now blocked in the gradient all-reduce. On gloo a closed peer fails it within
    # milliseconds; give that a second to show (a bounded poll for events, not a sleep).
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        log.events.extend(sup.poll(end - time.monotonic()))
    assert sup.running() == {0} and log.text(0, "stderr") == b""
    [exit0] = sup.stop_all()
    assert exit0.origin.rank == 0 and exit0.stopped_by_us
    wait_for(lambda: all(group_gone(s.pid) for s in log.starts()))
