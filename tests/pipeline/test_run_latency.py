"""``ftwatch run`` decides in milliseconds (issue 16 item 3), on a FakeClock with scripted workers:
the settle after a failure ends as soon as every live worker has reported an error of its own (or
exited), else at ``supervisor.settle_max`` from the first error line; the decision is said and
acted on before it is stored and its alert sent. No process, no sleep.
"""

from __future__ import annotations

import io

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Action
from ftwatch.pipeline.build import build_run
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.run import SETTLE_SECONDS
from ftwatch.testing import CaptureAlerts, Exit, FakeClock, FakeControl, FakeSupervisor, Say, script_of

JOB = "job"
SIGKILL = 9
FATAL = "RuntimeError: CUDA error: an illegal memory access was encountered"
PEER = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
        "remote process exited or there was a network error, NCCL version 2.19.3")


def config(tmp_path, nproc=2, **supervisor):
    return Config.model_validate({
        "policy": {"fault_tolerant_policy": "OnFailure", "enable_job_restart": False},
        "supervisor": {"nproc_per_node": nproc, "restart_delay": 0, **supervisor},
        "health": {"bootcheck": False, "troubleshooting": False},
        "storage": {"state_dir": str(tmp_path)},
    })


class Calls:
    """The order things happened in, written by the doubles below."""

    def __init__(self):
        self.names: list[str] = []


class OrderedSink:
    """A store that notes when a decision reaches it."""

    def __init__(self, calls: Calls):
        self.calls = calls

    def write(self, batch):
        self.calls.names += ["store" for r in batch if type(r).__name__ == "Decision"]

    def close(self):
        pass


def run(tmp_path, cfg, script, nproc=2, calls: Calls | None = None, echo=True):
    """Run the job; returns (status, recorder, supervisor, clock start, terminal text, runner)."""
    clock = FakeClock()
    start = clock.time()
    sup = FakeSupervisor(clock, script, nproc, job=JOB)
    out = io.StringIO()
    calls = calls or Calls()
    recorder = Recorder(OrderedSink(calls), tmp_path / "decisions.jsonl", CaptureAlerts(calls.names), out=out)
    runner = build_run(cfg, ["train"], JOB, recorder, out=out, clock=clock, supervisor=sup, control=FakeControl(),
                       echo=echo)
    status = runner.run()
    return status, recorder, sup, start, out.getvalue(), runner


def test_the_settle_ends_when_the_live_worker_reports_its_own_error(tmp_path):
    """Rank 1 prints a CUDA error and dies at 2 s; rank 0 prints its NCCL error 0.1 s later and
    hangs (a peer in the collective): every live worker has reported, the decision comes then,
    not SETTLE_SECONDS after the exit."""
    script = script_of({(0, 1): [Say(1, "step 1"), Say(2.1, PEER)],
                        (1, 1): [Say(1, "step 1"), Say(2, FATAL), Exit(2, 1)]})
    status, recorder, sup, start, out, _ = run(tmp_path, config(tmp_path), script)
    assert status == 1
    d = recorder.decisions[0]
    assert d.action is Action.FAIL_JOB and d.root_cause.line == FATAL
    assert d.time - start == pytest.approx(2.1)
    assert PEER in {f.line for f in d.findings} | {d.root_cause.line}


def test_the_settle_ends_when_every_worker_has_exited(tmp_path):
    """Both ranks die 0.2 s apart: nobody is left to report, the decision comes with the last exit."""
    script = script_of({(0, 1): [Say(2, FATAL), Exit(2, 1)], (1, 1): [Exit(2.2, None, SIGKILL)]})
    status, recorder, *_ = run(tmp_path, config(tmp_path), script)
    start = FakeClock().time()
    assert status == 1 and recorder.decisions[0].time - start == pytest.approx(2.2)


def test_a_quiet_survivor_makes_the_settle_run_to_its_bound(tmp_path):
    """Rank 0 trains on without an error: the settle runs to ``supervisor.settle_max`` (0.4 s
    here), counted from rank 1's fatal line, not from its exit 0.3 s later."""
    script = script_of({(0, 1): [Say(1, "step 1"), Say(2.5, "step 2")],
                        (1, 1): [Say(2, FATAL), Exit(2.3, 1)]})
    status, recorder, _, start, *_ = run(tmp_path, config(tmp_path, settle_max=0.4), script)
    assert status == 1 and recorder.decisions[0].time - start == pytest.approx(2.4)


def test_the_default_bound_is_the_old_fixed_settle(tmp_path):
    """Without ``settle_max`` a SIGKILLed rank's peer that stays quiet gets SETTLE_SECONDS (1 s)."""
    assert Config.model_validate({}).supervisor.settle_max == SETTLE_SECONDS == 1.0
    script = script_of({(0, 1): [Say(1, "step 1")], (1, 1): [Exit(2, None, SIGKILL)]})
    status, recorder, _, start, *_ = run(tmp_path, config(tmp_path), script)
    assert recorder.decisions[0].time - start == pytest.approx(2 + SETTLE_SECONDS)


def test_an_old_error_does_not_count_as_a_report_for_a_new_failure(tmp_path):
    """Rank 0's NCCL error 10 s before rank 1 dies is not its report on this failure: the settle
    runs to its bound (from the exit: no fatal line of rank 1 came first)."""
    script = script_of({(0, 1): [Say(1, PEER), Say(5, "step 5")], (1, 1): [Exit(11, None, SIGKILL)]})
    status, recorder, _, start, *_ = run(tmp_path, config(tmp_path, settle_max=0.5), script)
    assert recorder.decisions[0].time - start == pytest.approx(11.5)


def test_the_decision_is_acted_on_before_it_is_stored_and_alerted(tmp_path):
    """The order of the doubles: said and in the decisions file, the actuator's plan carried out,
    then the store, then the alert."""
    calls = Calls()
    script = script_of({(0, 1): [Say(1, "step 1")], (1, 1): [Say(2, FATAL), Exit(2, 1)]})
    clock = FakeClock()
    sup = FakeSupervisor(clock, script, 2, job=JOB)
    out = io.StringIO()
    recorder = Recorder(OrderedSink(calls), tmp_path / "decisions.jsonl", CaptureAlerts(calls.names), out=out)
    runner = build_run(config(tmp_path), ["train"], JOB, recorder, out=out, clock=clock, supervisor=sup,
                       control=FakeControl())
    carry_out = runner.act.carry_out
    decisions_file = tmp_path / "decisions.jsonl"

    def acting(plan, decision):
        calls.names.append("act")
        assert '"action": "fail_job"' in decisions_file.read_text()          # its line is written first
        assert "ftwatch: decision fail_job" in out.getvalue()
        carry_out(plan, decision)

    runner.act.carry_out = acting
    assert runner.run() == 1
    assert calls.names == ["act", "store", "alert"]
    assert len(decisions_file.read_text().splitlines()) == 1


def test_a_restart_of_every_worker_is_also_stored_after_acting(tmp_path):
    """With restarts on: act, store, alert for the restart, then the next attempt's success."""
    calls = Calls()
    cfg = config(tmp_path).with_policy(enable_job_restart=True, max_num_of_job_restart=1)
    script = script_of({(1, 1): [Say(1, FATAL), Exit(1, 1)]}, default=[Say(1, "step 1"), Exit(2)])
    clock = FakeClock()
    sup = FakeSupervisor(clock, script, 2, job=JOB)
    recorder = Recorder(OrderedSink(calls), None, CaptureAlerts(calls.names), out=io.StringIO())
    runner = build_run(cfg, ["train"], JOB, recorder, out=io.StringIO(), clock=clock, supervisor=sup,
                       control=FakeControl())
    carry_out = runner.act.carry_out
    runner.act.carry_out = lambda plan, d: (calls.names.append("act"), carry_out(plan, d))
    assert runner.run() == 0
    assert [d.action for d in recorder.decisions] == [Action.RESTART_JOB, Action.NONE]
    assert calls.names[:3] == ["act", "store", "alert"]
    assert calls.names[3:] == ["store", "alert"]         # the success (action none: no alert), its resolution


def test_quiet_echoes_nothing_but_still_reads_the_output(tmp_path):
    script = script_of({(0, 1): [Say(1, "step 1")], (1, 1): [Say(1, "step 1"), Say(2, FATAL), Exit(2, 1)]})
    status, recorder, _, _, out, runner = run(tmp_path, config(tmp_path, settle_max=0.2), script, echo=False)
    assert status == 1 and recorder.decisions[0].root_cause.line == FATAL
    assert "[rank" not in out and runner.engine.stats.lines >= 3


def test_settle_max_flag_and_field(tmp_path):
    """``--settle-max`` sets ``supervisor.settle_max``; a negative one is a usage error naming the flag."""
    import argparse

    from ftwatch.cli.run import add_run_flags, apply_run_flags
    from ftwatch.errors import ConfigError
    p = argparse.ArgumentParser()
    add_run_flags(p)
    cfg = apply_run_flags(Config.model_validate({}), p.parse_args(["--settle-max", "0.25"]))
    assert cfg.supervisor.settle_max == 0.25
    with pytest.raises(ConfigError, match="--settle-max"):
        apply_run_flags(Config.model_validate({}), p.parse_args(["--settle-max", "-1"]))
