"""No orphans (issue 17, item 1): the parent-death signal and the worker record that the next start reaps.

Real processes throughout: a monitor is a ``python -c`` that runs a Supervisor and is SIGKILLed,
leftover groups are ``python -c`` / ``sleep`` sessions this test starts. Waits are bounded polls of
/proc (a process ending is no event this test could wait on).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ftwatch.pipeline.sources.orphans import MONITOR_ENV, RECORD_DIR, WorkerRecord, process_start, reap
from ftwatch.pipeline.sources.supervisor import Supervisor

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

DEADLINE = 15.0
# Ignores SIGTERM (as a worker that does not die with its peers), prints its pid, waits forever.
STUBBORN = "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(os.getpid(), flush=True)\n" \
           "while True: time.sleep(60)"


def alive(pid: int) -> bool:
    """A live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(cond, deadline: float = DEADLINE) -> bool:
    end = time.monotonic() + deadline
    while not cond():
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)     # polling /proc: a process ending elsewhere sends us nothing
    return True


def dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def write_record(state: Path, monitor: dict, groups: dict[int, int | None], boot: str | None = None) -> Path:
    path = state / RECORD_DIR / f"{monitor['pid']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"boot_id": boot or boot_id(), "monitor": monitor,
                                "groups": [{"pgid": g, "start": s} for g, s in groups.items()]}))
    return path


@pytest.fixture
def spawned():
    """Start processes in sessions of their own; every group is SIGKILLed and reaped at the end."""
    procs: list[subprocess.Popen] = []

    def _spawn(code: str, env: dict | None = None) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             start_new_session=True, env={**os.environ, **(env or {})})
        procs.append(p)
        return p

    yield _spawn
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait(10)


# -- the parent-death signal ---------------------------------------------------------------------

MONITOR = """
import sys, time
from ftwatch.pipeline.sources.supervisor import Supervisor
sup = Supervisor([sys.executable, "-c", sys.argv[1]], 2, grace_period=30)
sup.start_all(0)
pids = []
while len(pids) < 2:
    for item in sup.poll(1.0):
        if type(item).__name__ == "Output":
            pids += item.data.split()
print(" ".join(p.decode() for p in pids), flush=True)
time.sleep(600)
"""


def test_workers_of_a_sigkilled_monitor_die_even_when_they_ignore_sigterm():
    """SIGKILL of the supervising process -> every worker's main process dies (PR_SET_PDEATHSIG)."""
    monitor = subprocess.Popen([sys.executable, "-c", MONITOR, STUBBORN], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        workers = [int(p) for p in monitor.stdout.readline().split()]
        assert len(workers) == 2 and all(alive(p) for p in workers)
        monitor.kill()
        monitor.wait(10)
        assert wait_until(lambda: not any(alive(p) for p in workers)), \
            f"workers outlived their monitor: {[p for p in workers if alive(p)]}"
    finally:
        monitor.kill()
        monitor.wait(10)
        for pid in workers:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# -- the record ------------------------------------------------------------------------------------

def test_record_lists_the_live_groups_with_start_times_and_goes_at_a_clean_end(tmp_path):
    record = WorkerRecord(tmp_path)
    sup = Supervisor([sys.executable, "-c", STUBBORN], 2, grace_period=0.2, record=record)
    try:
        sup.start_all(0)
        data = json.loads(record.path.read_text())
        assert record.path == tmp_path / "workers" / f"{os.getpid()}.json"
        assert data["monitor"] == {"pid": os.getpid(), "start": process_start(os.getpid())}
        pids = sorted(w.popen.pid for w in sup._workers.values())
        assert [g["pgid"] for g in data["groups"]] == pids
        assert [g["start"] for g in data["groups"]] == [process_start(p) for p in pids]
        assert not list(record.path.parent.glob("*.tmp"))       # written by rename, no leftovers
        sup.stop_all()
        assert json.loads(record.path.read_text())["groups"] == []
    finally:
        sup.close()
    assert not record.path.exists()


def test_workers_carry_the_monitor_id_for_their_children(tmp_path):
    record = WorkerRecord(tmp_path)
    code = f"import os; print(os.environ['{MONITOR_ENV}'], flush=True)"
    with Supervisor([sys.executable, "-c", code], 1, record=record) as sup:
        sup.start_all(0)
        out = b""
        end = time.monotonic() + DEADLINE
        while b"\n" not in out and time.monotonic() < end:
            out += b"".join(i.data for i in sup.poll(0.5) if type(i).__name__ == "Output")
    assert out.decode().strip() == f"{os.getpid()}.{process_start(os.getpid())}"


def test_a_record_that_cannot_be_written_is_said_once_and_supervision_goes_on(tmp_path):
    (tmp_path / "workers").write_text("a file where the directory should be")
    said: list[str] = []
    record = WorkerRecord(tmp_path, warn=said.append)
    with Supervisor([sys.executable, "-c", "print('hi')"], 2, record=record) as sup:
        sup.start_all(0)
        sup.stop_all()
    assert len(said) == 1 and "cannot record the worker process groups" in said[0]


# -- reaping at the next start ---------------------------------------------------------------------

def test_reap_stops_a_dead_monitors_group_with_term_then_kill_and_says_so(tmp_path, spawned):
    stubborn = spawned(STUBBORN)
    assert stubborn.stdout.readline().strip() == str(stubborn.pid)
    path = write_record(tmp_path, {"pid": dead_pid(), "start": 1}, {stubborn.pid: process_start(stubborn.pid)})
    said: list[str] = []
    assert reap(tmp_path, 0.3, said.append) == [stubborn.pid]
    assert stubborn.wait(DEADLINE) == -signal.SIGKILL         # SIGTERM ignored, so SIGKILL after the grace
    assert len(said) == 1 and f"stopping 1 worker process group(s)" in said[0] and str(stubborn.pid) in said[0]
    assert not path.exists()


def test_reap_gives_the_grace_period_to_a_group_that_takes_sigterm(tmp_path, spawned):
    polite = spawned("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(600)")
    polite.stdout.readline()
    write_record(tmp_path, {"pid": dead_pid(), "start": 1}, {polite.pid: process_start(polite.pid)})
    reap(tmp_path, 30, lambda text: None)
    assert polite.wait(DEADLINE) == -signal.SIGTERM


def test_reap_never_signals_a_recycled_pid(tmp_path, spawned):
    """The recorded start time differs: the pid (and group id) now belong to another process."""
    other = spawned(STUBBORN)
    other.stdout.readline()
    path = write_record(tmp_path, {"pid": dead_pid(), "start": 1}, {other.pid: process_start(other.pid) - 1})
    said: list[str] = []
    assert reap(tmp_path, 0.1, said.append) == []
    assert other.poll() is None and alive(other.pid) and said == []
    assert not path.exists()                  # nothing of that monitor is left: the record goes


def test_reap_ignores_a_record_from_another_boot(tmp_path, spawned):
    proc = spawned(STUBBORN)
    proc.stdout.readline()
    path = write_record(tmp_path, {"pid": dead_pid(), "start": 1}, {proc.pid: process_start(proc.pid)},
                        boot="another-boot")
    assert reap(tmp_path, 0.1, lambda text: None) == []
    assert alive(proc.pid) and not path.exists()


def test_reap_leaves_a_live_monitors_workers_alone(tmp_path, spawned):
    """Another ftwatch run on the same state directory is still supervising them."""
    proc = spawned(STUBBORN)
    proc.stdout.readline()
    me = {"pid": os.getpid(), "start": process_start(os.getpid())}
    path = write_record(tmp_path, me, {proc.pid: process_start(proc.pid)})
    assert reap(tmp_path, 0.1, lambda text: None) == []
    assert alive(proc.pid) and path.exists()


LEADER = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen(["sleep", "600"])      # stays in the leader's process group
    print(child.pid, flush=True)
""")


@pytest.mark.parametrize("carries", [True, False])
def test_reap_stops_a_leaderless_group_only_when_its_members_carry_the_monitor_id(tmp_path, spawned, carries):
    """The worker (group leader) died with its monitor; its child holds the group. The group is the
    monitor's only if the child carries ``FTWATCH_MONITOR_ID`` of that monitor."""
    monitor = {"pid": dead_pid(), "start": 12345}
    token = f"{monitor['pid']}.{monitor['start']}" if carries else "1.2"
    leader = spawned(LEADER, env={MONITOR_ENV: token})
    child = int(leader.stdout.readline())
    # the child's environ is read from /proc: wait until `sleep` has been exec'd (mid-exec, a
    # loaded machine can show it empty for a moment, and the group would look like no monitor's)
    assert wait_until(lambda: Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep"))
    started = process_start(leader.pid)
    leader.wait(DEADLINE)                       # reaped: the group id is now held by the child alone
    try:
        write_record(tmp_path, monitor, {leader.pid: started})
        said: list[str] = []
        assert reap(tmp_path, 5, said.append) == ([leader.pid] if carries else [])
        if carries:
            assert wait_until(lambda: not alive(child)) and len(said) == 1
        else:
            assert alive(child) and said == []
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_reap_without_records_says_nothing(tmp_path):
    said: list[str] = []
    assert reap(tmp_path / "never-made", 1, said.append) == [] and said == []
