"""Fixtures shared by the replay tests (tests/pipeline/test_replay*.py) and the TLS listeners' tests."""

from __future__ import annotations

import shutil
import subprocess
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


@pytest.fixture(scope="session")
def cert(tmp_path_factory):
    """A self-signed cert for localhost/127.0.0.1 (cert.pem, key.pem), made by the openssl binary.

    (The ``cryptography`` package is not a dependency of ftwatch and not installed here.)
    """
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a self-signed cert (and cryptography is not a dependency)")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"
