"""Phases in ``ftwatch replay`` (issue 13 item 4, issue 17 item 5): the replayed lines' times
drive the job's phase and the job-hang interval a silence is judged by, with the patterns and
defaults of ``run`` and ``watch``."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from ftwatch.config.model import Config
from ftwatch.config.phases import PhasesConfig
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Policy
from ftwatch.rules.engine import Engine
from tests.pipeline.test_replay_hang import T0, ftwatch, iso_line, training, watchdog, write

JOB = "replay-phases-test"
HANG_ON = {"enable_job_hang_detection": True, "job_hang_interval": 600, "enable_job_restart": True}
RANKS = (0, 1, 2)


def go(rules, tmp_path, paths, phases: PhasesConfig | None):
    policy = Policy(Config().with_policy(**HANG_ON).policy, BudgetStore(tmp_path / "budgets.json", JOB), JOB)
    return replay(paths, Engine(rules), policy, JOB, phases=phases)


def steps(start, minutes: float, first: int = 1) -> list[str]:
    """Step lines of every rank every 10 s from ``start`` for ``minutes``."""
    out, at, step = [], start, first
    while at <= start + timedelta(minutes=minutes):
        out += [iso_line(r, at + timedelta(milliseconds=37 * r), f"step {step} loss {4.6 / step:.4f}") for r in RANKS]
        at += timedelta(seconds=10)
        step += 1
    return out


def checkpoint_save_of(minutes: float) -> list[str]:
    """5 min of training, a checkpoint save by every rank (HF Trainer's line) that is silent for
    ``minutes``, then 5 min of training again."""
    save = T0 + timedelta(minutes=5, seconds=15)
    return (steps(T0, 5) + [iso_line(r, save, "Saving model checkpoint to /ckpt/checkpoint-500") for r in RANKS]
            + steps(save + timedelta(minutes=minutes), 5, first=100))


ON = PhasesConfig(enabled=True)


def test_a_long_checkpoint_save_is_no_hang_under_its_phases_interval(rules, tmp_path):
    path = write(tmp_path / "combined.log", checkpoint_save_of(25))
    assert go(rules, tmp_path, [path], None).decision.root_cause.kind == "hang"     # 25 min > 10: the false hang
    result = go(rules, tmp_path, [path], ON)
    assert result.decision.action.label == "none", result.decision.root_cause


def test_a_checkpoint_save_longer_than_its_interval_is_a_hang_naming_the_phase(rules, tmp_path):
    path = write(tmp_path / "combined.log", checkpoint_save_of(25))
    hang = go(rules, tmp_path, [path], PhasesConfig(enabled=True, intervals={"checkpoint_save": 900})).decision
    assert hang.root_cause.kind == "hang" and hang.root_cause.fields["phase"] == "checkpoint_save"
    assert hang.root_cause.time == pytest.approx((T0 + timedelta(minutes=5, seconds=15)).timestamp() + 900, abs=0.1)
    assert "in phase checkpoint_save (its interval 900 s)" in hang.root_cause.line


def test_a_silence_in_training_after_an_evaluation_is_a_hang_at_the_training_interval(rules, tmp_path):
    """Lightning's validation bar (20 min silent: no hang), training again, then every rank silent
    until the NCCL watchdog 40 min later: a hang 10 min after the last step line."""
    evaluation = T0 + timedelta(minutes=5, seconds=15)
    back = evaluation + timedelta(minutes=20)
    lines = (steps(T0, 5) + [iso_line(r, evaluation, "Validation DataLoader 0:  40%|####      | 2/5") for r in RANKS]
             + steps(back, 2, first=100))
    last = back + timedelta(minutes=2, milliseconds=74)
    lines += [watchdog(0, last + timedelta(minutes=40)), watchdog(1, last + timedelta(minutes=40))]
    path = write(tmp_path / "combined.log", lines)
    hang = go(rules, tmp_path, [path], ON).decision.root_cause
    assert hang.kind == "hang" and hang.fields["phase"] == "training"
    assert hang.time == pytest.approx(last.timestamp() + 600, abs=0.1)


def test_per_rank_files_a_megatron_checkpoint_save_is_no_hang(rules, tmp_path):
    save = T0 + timedelta(minutes=5, seconds=15)
    paths = []
    for r in RANKS:
        body = [line.split(":", 1)[1] for line in steps(T0, 5) if line.startswith(f"[default{r}]")]
        body.append(iso_line(r, save, " saving checkpoint at iteration    1000 to /ckpt").split(":", 1)[1])
        body += [line.split(":", 1)[1] for line in steps(save + timedelta(minutes=30), 5, first=100)
                 if line.startswith(f"[default{r}]")]
        paths.append(write(tmp_path / f"rank{r}.log", body))
    assert go(rules, tmp_path, paths, None).decision.root_cause.kind == "hang"
    assert go(rules, tmp_path, paths, ON).decision.action.label == "none"


# -- startup: the first output is initialization until the first step line ----------------------

def startup_of(minutes: float) -> list[str]:
    """Lightning's start-up banner with every process registered (a launch that did not stall in
    the process group: that is a named wait, ``policy/namedwait.py``), then silence (imports,
    dataset set-up) for ``minutes``, then training."""
    banner = [iso_line(r, T0, "Initializing distributed: GLOBAL_RANK: %d, MEMBER: %d/3" % (r, r + 1)) for r in RANKS]
    banner.append(iso_line(0, T0, "All distributed processes registered. Starting with 3 processes"))
    return banner + steps(T0 + timedelta(minutes=minutes), 5)


def test_a_silent_startup_longer_than_training_but_shorter_than_initialization_is_no_hang(rules, tmp_path):
    path = write(tmp_path / "combined.log", startup_of(15))
    assert go(rules, tmp_path, [path], None).decision.root_cause.kind == "hang"
    assert go(rules, tmp_path, [path], ON).decision.action.label == "none"


def test_a_silent_startup_longer_than_initialization_is_a_hang_naming_it(rules, tmp_path):
    path = write(tmp_path / "combined.log", startup_of(15))
    hang = go(rules, tmp_path, [path], PhasesConfig(enabled=True, intervals={"initialization": 720})).decision
    assert hang.root_cause.fields["phase"] == "initialization"
    assert hang.root_cause.time == pytest.approx(T0.timestamp() + 720, abs=0.01)


def test_replay_command_reads_phases_from_the_config(tmp_path):
    path = write(tmp_path / "combined.log", checkpoint_save_of(25))
    config = tmp_path / "ftwatch.yaml"
    config.write_text("phases:\n  enabled: true\n")
    flags = ("--enable-job-hang-detection=True", "--job-hang-interval=600", "--enable-job-restart=True")
    plain = ftwatch("replay", "--json", *flags, str(path), cwd=tmp_path)
    assert json.loads(plain.stdout)["action"] == "restart_job", plain.stderr
    phased = ftwatch("replay", "--json", "--config", str(config), *flags, str(path), cwd=tmp_path)
    assert phased.returncode == 0, phased.stderr
    assert json.loads(phased.stdout)["action"] == "none"
