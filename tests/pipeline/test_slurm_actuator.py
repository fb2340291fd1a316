"""The slurm actuator against fake scontrol / scancel / sinfo on PATH (tests/slurmfake.py) that
record their argv: each decision's commands in order, the breaker, dry run, retries with backoff,
refusals, missing commands and job ids."""

from __future__ import annotations

import time

import pytest

from ftwatch.clock import FakeClock
from ftwatch.config.model import Config
from ftwatch.config.slurm import SlurmConfig
from ftwatch.errors import ConfigError
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.actuators.exec import build_actuator
from ftwatch.pipeline.actuators.slurm import SlurmActuator
from tests.pipeline.test_watcher import line, make
from tests.slurmfake import FakeSlurm

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
NOW = 1_795_219_200.0


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.dir}:/usr/bin:/bin")
    return fake


def actuator(sleeps=None, clock=None, job_id=None, node=None, **config) -> SlurmActuator:
    return SlurmActuator(SlurmConfig(**config), job_id=job_id, node=node, clock=clock or FakeClock(NOW),
                         sleep=(sleeps if sleeps is not None else []).append)


def decision(action: Action, job: str = "4471023", node: str | None = "gpu-2", instance: str | None = None) -> Decision:
    root = Finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, action, Severity.CRITICAL,
                   Origin(instance or "worker-2", 2, job, node or "gpu-2"), XID, NOW)
    return Decision(NOW, action, Target(job, instance, 2, node), root, "test clause", 0, 3)


def test_restart_job_requeues_the_decisions_job(slurm):
    result = actuator().act(decision(Action.RESTART_JOB))
    assert result.status == "done", result.output
    assert slurm.calls() == [["scontrol", "requeue", "4471023"]]
    assert result.calls == ("scontrol requeue 4471023 (requeue the job): ok",)


def test_restart_instance_under_watch_requeues_the_job_too(slurm):
    assert actuator().act(decision(Action.RESTART_INSTANCE, instance="worker-2")).status == "done"
    assert slurm.writes() == [["scontrol", "requeue", "4471023"]]


def test_isolate_node_drains_it_with_the_decision_as_reason_then_requeues(slurm):
    d = decision(Action.ISOLATE_NODE)
    result = actuator().act(d)
    assert result.status == "done", result.output
    assert slurm.calls() == [
        ["sinfo", "-h", "-N", "-o", "%N|%T|%H|%E"],
        ["scontrol", "update", "NodeName=gpu-2", "State=DRAIN", f"Reason=ftwatch {d.decision_id}: xid.79: {XID}"],
        ["scontrol", "requeue", "4471023"]]


def test_under_run_the_job_and_node_come_from_slurms_environment(slurm, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-1")
    act = SlurmActuator.for_run(SlurmConfig(), clock=FakeClock(NOW), sleep=lambda s: None)
    assert act.act(decision(Action.ISOLATE_NODE, job="local-1234abcd", node="vm")).status == "done"
    assert [c[:3] for c in slurm.writes()] == [["scontrol", "update", "NodeName=gpu-1"], ["scontrol", "requeue", "77"]]


def test_fail_job_cancels_or_requeues_held(slurm):
    assert actuator().act(decision(Action.FAIL_JOB)).status == "done"
    assert actuator(fail="hold").act(decision(Action.FAIL_JOB)).status == "done"
    assert slurm.writes() == [["scancel", "4471023"], ["scontrol", "requeuehold", "4471023"]]


def test_notify_and_none_run_nothing(slurm):
    assert actuator().act(decision(Action.NOTIFY)).status == "skipped"
    assert actuator().act(decision(Action.NONE)).status == "skipped"
    assert slurm.calls() == []


def test_dry_run_logs_every_command_and_runs_no_write(slurm):
    logged: list[str] = []
    act = SlurmActuator(SlurmConfig(dry_run=True), clock=FakeClock(NOW), log=logged.append)
    result = act.act(decision(Action.ISOLATE_NODE))
    assert result.status == "dry_run"
    assert slurm.writes() == []
    assert [c[0] for c in slurm.calls()] == ["sinfo"]            # the breaker's read is made
    reason = act.reason(decision(Action.ISOLATE_NODE))
    assert result.calls[1:] == (
        f"scontrol update NodeName=gpu-2 State=DRAIN 'Reason={reason}' (drain the node): dry run (not run)",
        "scontrol requeue 4471023 (requeue the job): dry run (not run)")
    assert all(line.endswith("dry run (not run)") for line in result.calls[1:])
    assert logged == list(result.calls)


def test_the_breaker_holds_an_isolation_beyond_half_the_nodes(slurm):
    recent = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(NOW - 60))
    slurm.nodes([("gpu-1", "drained", recent, "ftwatch 0123456789abcdef: xid.79: ..."),
                 ("gpu-2", "mixed", "Unknown", "none"),
                 ("gpu-3", "drained", recent, "admin: bad fan"),          # not ftwatch's: not counted
                 ("gpu-3", "drained", recent, "admin: bad fan"),          # one row per partition
                 ("gpu-4", "idle", "Unknown", "none")])
    act = actuator(breaker={"max_share": 0.25})
    result = act.act(decision(Action.ISOLATE_NODE))
    assert result.status == "held"
    assert result.output.startswith("circuit breaker open: 1 node(s) isolated in the last 300 s (gpu-1)")
    assert slurm.writes() == []
    slurm.nodes([("gpu-1", "idle", "Unknown", "none"), ("gpu-2", "mixed", "Unknown", "none"),
                 ("gpu-3", "idle", "Unknown", "none"), ("gpu-4", "idle", "Unknown", "none")])
    assert act.act(decision(Action.ISOLATE_NODE)).status == "done"
    assert act.act(decision(Action.ISOLATE_NODE, node="gpu-3")).status == "held"  # gpu-2 counted by this process


def test_a_failing_command_is_retried_with_a_doubling_backoff(slurm):
    slurm.respond("scontrol requeue", 1, "slurm_requeue error: Unable to contact slurm controller (connect failure)")
    slurm.respond("scontrol requeue", 1, "slurm_requeue error: Socket timed out on send/recv operation")
    sleeps: list[float] = []
    result = actuator(sleeps, backoff=0.5).act(decision(Action.RESTART_JOB))
    assert result.status == "done"
    assert sleeps == [0.5, 1.0]
    assert len(slurm.calls()) == 3
    assert result.calls == ("scontrol requeue 4471023 (requeue the job): ok after 3 tries",)


def test_a_command_that_keeps_failing_fails_with_slurms_last_line(slurm):
    for _ in range(3):
        slurm.respond("scancel", 1, "scancel: error: If munged is up, restart with --num-threads=10\n"
                                    "scancel: error: Kill job error on job id 4471023: Protocol authentication error")
    sleeps: list[float] = []
    result = actuator(sleeps, retries=2).act(decision(Action.FAIL_JOB))
    assert result.status == "failed"
    assert sleeps == [1.0, 2.0]
    assert result.output.splitlines()[0] == ("scancel 4471023: scancel: error: Kill job error on job id 4471023: "
                                             "Protocol authentication error")


def test_a_refusal_is_not_retried(slurm):
    slurm.respond("scontrol requeue", 1, "scontrol: error: Invalid job id specified for job 4471023")
    sleeps: list[float] = []
    result = actuator(sleeps).act(decision(Action.RESTART_JOB))
    assert (result.status, sleeps, len(slurm.calls())) == ("failed", [], 1)
    assert result.calls == ("scontrol requeue 4471023 (requeue the job): failed: scontrol: error: Invalid job id "
                            "specified for job 4471023",)


def test_a_goal_that_already_holds_is_done(slurm):
    """Slurm put the job back to pending already (its own requeue, or ours whose line ``watch``
    read again), or the job already ended: nothing left to do, no alert."""
    slurm.respond("scontrol requeue", 1, "Job is pending execution for job 4471023")
    slurm.respond("scancel", 1, "scancel: error: Kill job error on job id 4471023: Job/step already completing "
                                "or completed")
    sleeps: list[float] = []
    requeue = actuator(sleeps).act(decision(Action.RESTART_JOB))
    assert requeue.status == "done" and sleeps == []
    assert requeue.calls == ("scontrol requeue 4471023 (requeue the job): ok: already so (Job is pending execution "
                             "for job 4471023)",)
    assert actuator(sleeps).act(decision(Action.FAIL_JOB)).status == "done" and sleeps == []


def test_a_drain_that_fails_requeues_nothing(slurm):
    slurm.respond("scontrol update", 1, "slurm_update error: Invalid node name specified")
    result = actuator().act(decision(Action.ISOLATE_NODE))
    assert result.status == "failed"
    assert [c[1] for c in slurm.writes()] == ["update"]


def test_a_job_that_is_no_slurm_job_id_fails_in_one_line(slurm):
    result = actuator().act(decision(Action.RESTART_JOB, job="train/llm-a"))
    assert result.status == "failed"
    assert result.output == ("job 'train/llm-a' is not a Slurm job id: name watched jobs by their Slurm job id "
                             "(watch.identity) or set slurm.job_id")
    assert actuator(job_id="4471023_7").act(decision(Action.RESTART_JOB, job="train/llm-a")).status == "done"
    assert slurm.writes() == [["scontrol", "requeue", "4471023_7"]]


def test_missing_commands_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    with pytest.raises(ConfigError) as err:
        SlurmActuator.for_run(SlurmConfig())
    assert str(err.value).count("\n") == 0
    assert "scontrol not found" in str(err.value) and "slurm-client" in str(err.value)
    config = Config.model_validate({"watch": {"actuator": {"type": "slurm"}}})
    with pytest.raises(ConfigError, match="watch.actuator.type slurm: scontrol not found"):
        build_actuator(config.watch.actuator, slurm=config.slurm)
    gone = actuator(scontrol=str(tmp_path / "nowhere" / "scontrol")).act(decision(Action.RESTART_JOB))
    assert gone.status == "failed"
    assert gone.output.count("\n") == 1 and "scontrol not found" in gone.output


def test_run_outside_a_slurm_job_is_one_line(slurm, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set: run ftwatch inside a Slurm job"):
        SlurmActuator.for_run(SlurmConfig())
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert SlurmActuator.for_run(SlurmConfig(job_id="12")).job_id == "12"


def test_which_decisions_slurm_takes_under_run(slurm):
    requeue, local = actuator(), actuator(restart="local")
    assert [requeue.handles(a) for a in (Action.RESTART_JOB, Action.ISOLATE_NODE, Action.FAIL_JOB)] == [True] * 3
    assert not local.handles(Action.RESTART_JOB) and local.handles(Action.ISOLATE_NODE)
    assert not requeue.handles(Action.RESTART_INSTANCE) and not requeue.handles(Action.NOTIFY)


def test_build_actuator_makes_the_slurm_actuator_from_the_top_level_section(slurm):
    config = Config.model_validate({"watch": {"actuator": {"type": "slurm"}}, "slurm": {"fail": "hold"}})
    act = build_actuator(config.watch.actuator, slurm=config.slurm)
    assert isinstance(act, SlurmActuator) and act.config.fail == "hold"


def test_watch_requeues_a_watched_slurm_job_on_slurms_own_node_failure_line(slurm, tmp_path):
    """``watch`` with ``watch.actuator.type: slurm``: srun's node-failure line in job 4471023's
    output is a finding (slurm.srun_node_failure), its restart_job requeues that job, and the
    command is stored with the decision."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, actuator=actuator())
    w.ingest([line(clock, "4471023", "gpu-2", "4471023-task-0", 0, "srun: error: Node failure on gpu-3")])
    clock.advance(5.01)
    w.tick()
    rec.collect()
    (decision,) = rec.decisions
    assert decision.action is Action.RESTART_JOB and decision.root_cause.rule_id == "slurm.srun_node_failure"
    assert slurm.writes() == [["scontrol", "requeue", "4471023"]]
    (event,) = [e for e in rec.store.events("4471023") if e["kind"] == "actuator"]
    assert event["detail"]["decision_id"] == decision.decision_id
    assert event["detail"]["calls"] == ["scontrol requeue 4471023 (requeue the job): ok"]
