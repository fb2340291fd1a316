"""Shared helpers of the recovery-policy tests (tests/rules/test_recovery_*.py).

Findings come from the real engine with the built-in packs (one engine per test session), so a
test line goes through the same fault-code extraction and C4D rules as a real log line.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ftwatch.clock import FakeClock
from ftwatch.config.model import PolicyConfig
from ftwatch.config.recovery import ModelArtsAnnotations, ModelArtsConfig, RecoveryConfig
from ftwatch.events import Finding, Origin, ProcessExit
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules
from ftwatch.policy.policy import Incident, Policy

JOB = "train-7"
DAY = 86_400.0


@functools.lru_cache(maxsize=1)
def _engine() -> Engine:
    return Engine(load_rules())


@functools.lru_cache(maxsize=1)
def _exits() -> ExitCodeTable:
    return ExitCodeTable.load()


def origin(rank: int, node: str | None = None) -> Origin:
    """Worker ``worker-<rank>`` on ``node`` (default ``node-<rank>``)."""
    return Origin(f"worker-{rank}", rank=rank, job=JOB, node=node or f"node-{rank}", stream="stderr")


def line(text: str, clock: FakeClock, rank: int = 1, node: str | None = None) -> Finding:
    """The one finding the engine makes of ``text`` on ``rank``, at the clock's time."""
    eng = _engine()
    o = origin(rank, node)
    found = eng.feed(o, text.encode() + b"\n", clock.time()) + eng.flush(o, clock.time())
    assert len(found) == 1, (text, found)
    return found[0]


def died(clock: FakeClock, rank: int = 1, code: int = 1, node: str | None = None) -> Finding:
    """The exit finding of ``worker-<rank>`` exiting with ``code`` now."""
    f = exit_finding(ProcessExit(origin(rank, node), pid=100 + rank, returncode=code, signal=None,
                                 time=clock.time()), _exits(), seq=0)
    assert f is not None
    return f


def incident(trigger: Finding, *others: Finding, attempt: int, failed: set[str] | None = None,
             world: int = 4) -> Incident:
    return Incident(trigger, tuple(others) + (trigger,), world,
                    frozenset(failed if failed is not None else {trigger.origin.instance}), attempt)


def policy(state: Path, *, annotations: dict | None = None, recovery: RecoveryConfig | None = None,
           job: str = JOB, **flags) -> Policy:
    """A Policy whose budgets, fault history and blame live under ``state`` (a fresh instance each
    call, like a restarted ftwatch)."""
    flags = {"enable_job_restart": True, "max_num_of_job_restart": 10, **flags}
    ma = ModelArtsConfig(annotations=ModelArtsAnnotations.model_validate(annotations or {}))
    return Policy(PolicyConfig(**flags), BudgetStore.for_job(state, job), job, modelarts=ma,
                  recovery=recovery, state_dir=state)
