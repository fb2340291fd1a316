"""The runner's health hook: a hardware fault found by the Bootcheck blocks the start (seed 001).

The checks themselves are replaced by one failing result (a GPU lost is not something a test
machine can produce); the runner, policy, store and log are the real ones, the workers real
processes that must never start.
"""

from __future__ import annotations

import io
import sys

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass
from ftwatch.health import runhook
from ftwatch.health.ftlog import CheckResult
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.build import build_run
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.rules.engine import Engine


def lost_gpu(*_args, **_kwargs):
    return [CheckResult("gpu", "fail", ("GPU Number: 1", "GPU Check: Failed: GPU 0: GPU is lost"),
                        failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE)]


def test_a_hardware_fault_blocks_every_start_until_the_budget_is_spent(tmp_path, monkeypatch):
    monkeypatch.setattr(runhook, "run_checks", lost_gpu)
    config = Config.model_validate({
        "policy": {"enable_job_restart": True, "max_num_of_job_restart": 1},
        "supervisor": {"nproc_per_node": 2, "restart_delay": 0},
        "storage": {"state_dir": str(tmp_path)},
    })
    store = SqliteStore(tmp_path / "ftwatch.db")
    out = io.StringIO()
    recorder = Recorder(store, out=out)
    marker = tmp_path / "started"
    runner = build_run(config, [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"], "job1", recorder,
                       engine=Engine([]), out=out)
    assert runner.run() == 1
    assert [d.action for d in recorder.decisions] == [Action.ISOLATE_NODE, Action.FAIL_JOB]
    assert recorder.decisions[0].root_cause.rule_id == "health.gpu"
    assert not marker.exists(), "a worker started despite the hardware fault"
    log = (tmp_path / "fault-tolerance.log").read_text().splitlines()
    heads = [line[20:] for line in log if "Start to run" in line or "Check Finished" in line]
    assert heads == ["Start to run Bootchecking...", "Check Finished: blocked, a hardware fault blocks the start.",
                     "Start to run Troubleshooting...", "Check Finished, task will be restarted.",
                     "Start to run Bootchecking...", "Check Finished: blocked, a hardware fault blocks the start.",
                     "Start to run Troubleshooting...", "Check Finished, task will not be restarted."]
    kinds = [e["kind"] for e in store.events("job1")]
    assert "instance_start" not in kinds and kinds.count("bootcheck") == 2
    assert "ftwatch: Bootchecking: critical: GPU Check: Failed: GPU 0: GPU is lost" in out.getvalue()


def test_health_off_runs_no_check(tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("no check may run")
    monkeypatch.setattr(runhook, "run_checks", boom)
    config = Config.model_validate({"health": {"bootcheck": False, "troubleshooting": False},
                                    "storage": {"state_dir": str(tmp_path)}})
    out = io.StringIO()
    recorder = Recorder(SqliteStore(tmp_path / "ftwatch.db"), out=out)
    runner = build_run(config, [sys.executable, "-c", "raise SystemExit(3)"], "j", recorder, engine=Engine([]), out=out)
    assert runner.run() == 1
    assert not (tmp_path / "fault-tolerance.log").exists()


def failed_allreduce(*_args, **_kwargs):
    return [CheckResult("allreduce", "fail", ("AllReduce Check: Failed (rank 1: timed out)",),
                        failure_class=FailureClass.RETRYABLE_INFRA, action=Action.RESTART_JOB)]


def test_a_failed_all_reduce_says_failed_and_the_job_still_starts(tmp_path, monkeypatch):
    """Only hardware faults block (seed 001); the block's ending says the check failed, as
    ``ftwatch bootcheck`` does, and what happens next."""
    monkeypatch.setattr(runhook, "run_checks", failed_allreduce)
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}})
    out = io.StringIO()
    recorder = Recorder(SqliteStore(tmp_path / "ftwatch.db"), out=out)
    marker = tmp_path / "started"
    runner = build_run(config, [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"], "j", recorder,
                       engine=Engine([]), out=out)
    assert runner.run() == 0
    assert marker.exists()
    log = (tmp_path / "fault-tolerance.log").read_text().splitlines()
    assert log[-1][20:] == ("Check Finished: failed, task will be started anyway: only hardware faults "
                            "block (seed 001).")
