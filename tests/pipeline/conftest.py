"""Fixtures shared by the replay tests (tests/pipeline/test_replay*.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from ftwatch.config.model import Config
from ftwatch.pipeline.replay import ReplayResult, replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Policy
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules


@pytest.fixture(scope="session")
def rules():
    """The built-in rules, loaded once."""
    return load_rules()


@pytest.fixture
def run(rules, tmp_path, request) -> Callable[..., ReplayResult]:
    """``run(paths, **policy_flags)``: replay log files through a fresh engine with the built-in
    rules and a Policy of ``Config().with_policy(**policy_flags)``, as job ``JOB`` of the test's
    module, budgets in ``tmp_path/budgets.json``."""
    job = request.module.JOB

    def run(paths: list[Path], **flags) -> ReplayResult:
        policy = Policy(Config().with_policy(**flags).policy, BudgetStore(tmp_path / "budgets.json", job), job)
        return replay(paths, Engine(rules), policy, job)
    return run
