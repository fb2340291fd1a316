"""Health checks around instance-level restarts (H1, seed 001: a check at every restart and after
every failure): Async ``restart_instance`` and MindCluster recover-in-place run Troubleshooting
and a Bootcheck (without the all-reduce) before restarting the failed rank, and a hardware fault
found there is decided on instead (its device is isolated).

The checks are a spy standing in for ``run_checks`` (the checks themselves: test_bootcheck*.py);
the runner, policy, slots, store and log are real, the workers real processes.
"""

from __future__ import annotations

import io
import sys

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass
from ftwatch.health import runhook
from ftwatch.health.ftlog import CheckResult
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.build import build_run
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.rules.engine import Engine

pytestmark = pytest.mark.slow

# rank 1 fails on its first start while rank 0 still runs; every later start succeeds
WORKER = """
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
mark = pathlib.Path(sys.argv[1]) / f"started-{rank}"
first = not mark.exists()
mark.write_text("x")
if rank == 1 and first:
    sys.exit(3)
time.sleep(2.5 if rank == 0 and first else 0.2)
"""

MODES = {
    "async": {"policy": {"job_execution_mode": "Async", "fault_tolerant_policy": "OnFailure",
                         "enable_job_restart": True, "max_num_of_job_restart": 3}},
    "recover-in-place": {"policy": {"fault_tolerant_policy": "OnFailure"},
                         "mindcluster": {"recover_strategy": "recover-in-place", "max_restarts": 3}},
}


class Spy:
    """Stands in for ``run_checks``: records each call; the n-th call without all-reduce may
    answer a lost GPU naming its device."""

    def __init__(self, lost_on: int | None = None, device: str = "1"):
        self.calls: list[dict] = []
        self.lost_on, self.device = lost_on, device

    def __call__(self, paths, disk_bytes, disk_min, world, allreduce, ar_bytes, timeout, python, min_bw,
                 devices=None, gpu_in_use="fail"):
        self.calls.append({"world": world, "allreduce": allreduce, "devices": list(devices or [])})
        without = sum(1 for c in self.calls if not c["allreduce"])
        if not allreduce and without == self.lost_on:
            return [CheckResult("gpu", "fail", ("GPU Number: 1", f"GPU Check: Failed: GPU {self.device}: GPU is lost"),
                                failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                                fields={"device": self.device})]
        return [CheckResult("cpu", "ok", ("CPU Number: 1",))]


def run(tmp_path, monkeypatch, mode, spy, nproc="2"):
    monkeypatch.setattr(runhook, "run_checks", spy)
    config = Config.model_validate({
        **MODES[mode],
        "supervisor": {"nproc_per_node": nproc, "restart_delay": 0, "devices": ["0", "1"]},
        "storage": {"state_dir": str(tmp_path)},
    })
    store = SqliteStore(tmp_path / "ftwatch.db")
    out = io.StringIO()
    recorder = Recorder(store, out=out)
    runner = build_run(config, [sys.executable, "-c", WORKER, str(tmp_path)], "job1", recorder,
                       engine=Engine([]), out=out)
    status = runner.run()
    log = (tmp_path / "fault-tolerance.log").read_text().splitlines()
    heads = [line[20:] for line in log if "Start to run" in line or "Check Finished" in line]
    return status, recorder, store, heads, out.getvalue()


@pytest.mark.parametrize("mode", list(MODES))
def test_an_instance_restart_runs_troubleshooting_and_a_bootcheck_first(tmp_path, monkeypatch, mode):
    spy = Spy()
    status, recorder, store, heads, out = run(tmp_path, monkeypatch, mode, spy)
    assert status == 0, out
    assert [d.action for d in recorder.decisions] == [
        Action.RESTART_INSTANCE if mode == "async" else Action.RESTART_IN_PLACE, Action.NONE], out
    assert heads == ["Start to run Bootchecking...", "Check Finished.",
                     "Start to run Troubleshooting...", "Check Finished, rank 1 will be restarted.",
                     "Start to run Bootchecking...", "Check Finished."]
    # the job's Bootcheck all-reduces over both slots; the instance checks do not (rank 0 runs on),
    # and their versions agent runs on the failed rank's device
    assert spy.calls == [{"world": 2, "allreduce": True, "devices": ["0", "1"]},
                         {"world": 2, "allreduce": False, "devices": ["1", "0"]},
                         {"world": 2, "allreduce": False, "devices": ["1", "0"]}]
    kinds = [e["kind"] for e in store.events("job1")]
    assert kinds.count("bootcheck") == 2 and kinds.count("troubleshooting") == 1


def test_a_hardware_fault_before_the_instance_restart_isolates_its_device(tmp_path, monkeypatch):
    """The Bootcheck before restarting rank 1 finds GPU 1 lost: no restart of rank 1 on it; the
    device named by the check is isolated and the job goes on with device 0 (1:2)."""
    spy = Spy(lost_on=2)
    status, recorder, store, heads, out = run(tmp_path, monkeypatch, "async", spy, nproc="1:2")
    assert status == 0, out
    actions = [d.action for d in recorder.decisions]
    assert actions == [Action.RESTART_INSTANCE, Action.ISOLATE_NODE, Action.NONE], out
    assert recorder.decisions[1].root_cause.rule_id == "health.gpu"
    isolated = [e["detail"]["device"] for e in store.events("job1") if e["kind"] == "device_isolated"]
    assert isolated == ["1"]
    assert "Check Finished: blocked, a hardware fault blocks the restart of rank 1." in heads
    # Troubleshooting of the failed attempt, then the next attempt's Bootcheck on device 0 alone
    assert spy.calls[3:] == [{"world": 2, "allreduce": True, "devices": ["0", "1"]},
                             {"world": 1, "allreduce": True, "devices": ["0"]}]
    restarts = [e for e in store.events("job1") if e["kind"] == "instance_restart"]
    assert restarts == [], "rank 1 was restarted on its lost GPU"
