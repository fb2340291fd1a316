"""Phases from log lines (R6, issue 13 item 4): each phase its own hang interval, the first output
is initialization until the first step line; `watch` applies them per job."""

from __future__ import annotations

import pytest

from ftwatch.config.model import Config
from ftwatch.config.phases import PhasesConfig
from ftwatch.pipeline.sources.phases import PhaseTracker
from ftwatch.testing import FakeClock
from tests.pipeline.test_watcher import line, make


@pytest.mark.parametrize("text, phase", [
    ("Loading checkpoint shards: 100%|##########| 2/2", "checkpoint_load"),      # transformers
    ("> initializing model parallel with size 8", "initialization"),               # Megatron-LM
    ("> building train, validation, and test datasets ...", "data_loading"),       # Megatron-LM
    ("***** Running Evaluation *****", "evaluation"),                              # HF Trainer
    ("Saving model checkpoint to out/checkpoint-500", "checkpoint_save"),          # HF Trainer
    (" saving checkpoint at iteration    1000 to /ckpt", "checkpoint_save"),       # Megatron-LM
    ("[Torch] Checkpoint global_step100 is about to be saved!", "checkpoint_save"),  # DeepSpeed
    ("Validation DataLoader 0:  40%|####      | 2/5", "evaluation"),                # Lightning
    ("{'loss': 2.3139, 'grad_norm': 1.7, 'learning_rate': 5e-05, 'epoch': 0.1}", "training"),
    (" iteration      100/  500000 | consumed samples: 3200 | lm loss: 7.1E+00 |", "training"),
    ("Epoch 1:  50%|#####     | 50/100 [00:10<00:10, 5.00it/s, loss=0.5]", "training"),
    ("[Rank 0] step=200, skipped=0, lr=[0.0001], loss=1.25", "training"),
])
def test_default_patterns_name_the_phase_of_each_frameworks_lines(text, phase):
    tracker = PhaseTracker(PhasesConfig(enabled=True), 60.0)
    if phase == "initialization":
        tracker.phase = "training"
    assert tracker.feed(b"noise\n" + text.encode() + b"\n") == phase


def test_intervals_per_phase_and_training_uses_the_policys():
    tracker = PhaseTracker(PhasesConfig(enabled=True, intervals={"initialization": 900, "evaluation": -1}), 60.0)
    assert tracker.phase == "initialization" and tracker.interval() == 900
    tracker.phase = "data_loading"
    assert tracker.interval() == 3600                  # the defaults stay for phases not named
    tracker.phase = "initialization"
    assert tracker.feed(b"step 3 loss 0.5\n") == "training" and tracker.interval() == 60
    assert tracker.feed(b"step 4 loss 0.5\n") is None
    assert tracker.feed(b"***** Running Evaluation *****\n") == "evaluation" and tracker.interval() is None
    tracker.restart()
    assert tracker.phase == "initialization"


def test_watch_waits_out_a_long_initialization_and_an_evaluation_but_not_a_training_hang(tmp_path):
    clock = FakeClock()
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, job_hang_interval=60)
    w.config = w.config.model_copy(update={"phases": PhasesConfig(enabled=True, intervals={"evaluation": 600})})
    job = "train/llm"

    def say(text):
        w.ingest([line(clock, job, "node-0", "llm-worker-0", 0, text)])

    def silent(seconds):
        for _ in range(seconds):
            clock.advance(1)
            w.tick()

    say("Loading checkpoint shards: 100%")      # checkpoint_load: the default 3600 s
    silent(1200)
    assert rec.decisions == []
    say("step 1 loss 2.0")                      # training: the policy's 60 s
    say("***** Running Evaluation *****")
    silent(120)
    assert rec.decisions == []                  # evaluation: 600 s
    say("step 2 loss 1.9")
    silent(61)
    (decision,) = rec.decisions
    assert decision.root_cause.rule_id.startswith("hang")
    phases = [e["detail"]["phase"] for e in rec.store.events(job) if e["kind"] == "phase"]
    assert phases == ["checkpoint_load", "training", "evaluation", "training"]


def test_phases_are_off_by_default():
    assert Config().phases.enabled is False


def test_run_gives_an_evaluation_its_own_interval_and_hangs_in_training(tmp_path):
    """`ftwatch run` with phases: the ranks start an evaluation and go quiet for 100 s (no hang:
    evaluation's 600 s), then train and go quiet: a hang after the policy's 60 s."""
    from tests.pipeline.test_run_loop import JOB, config, run
    from ftwatch.testing import Exit, Say, script_of
    cfg = config(tmp_path, {"enable_job_hang_detection": True, "job_hang_interval": 60},
                 phases={"enabled": True, "intervals": {"evaluation": 600}})
    quiet_eval = [Say(1, "step 1 loss 2.0"), Say(2, "***** Running Evaluation *****"),
                  Say(102, "step 2 loss 1.9")]
    script = script_of({(0, 1): quiet_eval, (1, 1): quiet_eval}, default=[Exit(1)])
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    assert status == 0, out
    hang, done = recorder.decisions
    assert hang.root_cause.kind == "hang"
    assert hang.time - FakeClock().time() >= 102 + 60            # not inside the evaluation
    phases = [e["detail"]["phase"] for e in store.events(JOB) if e["kind"] == "phase"]
    assert phases[:4] == ["initialization", "training", "evaluation", "training"]   # from the workers' start


# -- startup (issue 17 item 5): the silence before the first output is initialization ------------

def test_run_waits_out_a_silent_startup_longer_than_the_training_interval(tmp_path):
    """Phase detection off (the default): the workers import and rendezvous for 200 s without a
    line; the training interval is 60 s but the startup is judged with initialization's (3600 s):
    no hang, the job trains and ends well."""
    from tests.pipeline.test_run_loop import JOB, config, run
    from ftwatch.testing import Exit, Say, script_of
    cfg = config(tmp_path, {"enable_job_hang_detection": True, "job_hang_interval": 60})
    script = script_of({}, default=[Say(200, "step 1 loss 2.0"), Say(230, "step 2 loss 1.9"), Exit(240)])
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    assert status == 0, out
    assert [d.action.label for d in recorder.decisions] == ["none"]
    phases = [e["detail"] for e in store.events(JOB) if e["kind"] == "phase"]
    assert phases == [{"phase": "initialization", "job_hang_interval": 3600.0},
                      {"phase": "training", "job_hang_interval": 60.0}]


def test_run_without_startup_judges_the_startup_with_the_training_interval(tmp_path):
    """``phases.startup: false``: the old behaviour, a silent startup of 200 s is a hang at 60 s."""
    from tests.pipeline.test_run_loop import config, run
    from ftwatch.testing import Exit, Say, script_of
    cfg = config(tmp_path, {"enable_job_hang_detection": True, "job_hang_interval": 60,
                            "max_num_of_job_restart": 0}, phases={"startup": False})
    script = script_of({}, default=[Say(200, "step 1 loss 2.0"), Exit(240)])
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    assert recorder.decisions[0].root_cause.kind == "hang"
    assert "phase" not in recorder.decisions[0].root_cause.fields


def test_run_startup_silent_past_the_initialization_interval_is_a_hang_that_names_the_phase(tmp_path):
    """Silent longer than initialization's interval (300 s here): a hang at 300 s, not at the
    training interval's 60 s, and the finding and ``explain`` name the phase."""
    from tests.pipeline.test_run_loop import JOB, config, run
    from ftwatch.alerting.explain import explain
    from ftwatch.testing import Exit, Say, script_of
    cfg = config(tmp_path, {"enable_job_hang_detection": True, "job_hang_interval": 60,
                            "max_num_of_job_restart": 0}, phases={"intervals": {"initialization": 300}})
    script = script_of({}, default=[Say(1000, "step 1 loss 2.0"), Exit(1010)])
    start = FakeClock().time()
    status, recorder, sup, store, clock, out = run(tmp_path, cfg, script)
    hang = recorder.decisions[0]
    assert hang.root_cause.kind == "hang" and 300 <= hang.root_cause.time - start < 302
    assert hang.root_cause.fields["phase"] == "initialization"
    assert "in phase initialization (its interval 300 s)" in hang.root_cause.line
    assert "in phase initialization" in explain(store, hang.decision_id)


def test_phases_follow_the_policy_when_hang_detection_is_off():
    """No phase turns job-hang detection on when the policy has it off; a phase's default is
    the training interval when that is longer than 3600 s."""
    assert PhaseTracker(PhasesConfig(enabled=True), None).interval() is None
    assert PhaseTracker(PhasesConfig(enabled=True), 7200.0).interval() == 7200


def test_watch_judges_the_silence_after_a_jobs_first_line_as_initialization(tmp_path):
    """``watch`` meets a job by its first line (a launcher banner): the silence after it, until
    the first step line, is judged with initialization's interval (300 s here), not training's
    60 s; past it, a hang that names the phase."""
    clock = FakeClock()
    w, rec = make(tmp_path, clock, enable_job_hang_detection=True, job_hang_interval=60)
    w.config = w.config.model_copy(update={"phases": PhasesConfig(enabled=True,
                                                                  intervals={"initialization": 300})})
    job = "train/llm"
    w.ingest([line(clock, job, "node-0", "llm-worker-0", 0, "Starting elastic_operator with launch configs")])
    for _ in range(299):
        clock.advance(1)
        w.tick()
    assert rec.decisions == []                  # 299 s silent: longer than training's 60 s
    clock.advance(1)
    w.tick()
    (decision,) = rec.decisions
    assert decision.root_cause.fields["phase"] == "initialization"


def test_startup_alone_records_no_phase_when_hang_detection_is_off():
    from ftwatch.rules.timers import HangTracker
    hang = HangTracker(None, None)
    assert PhaseTracker(PhasesConfig(), None).start(0.0, hang) is None and hang.job_hang_interval is None
    assert PhaseTracker(PhasesConfig(), 60.0).start(0.0, hang) == "initialization"
    assert hang.job_hang_interval == 3600 and hang.phase == "initialization"
