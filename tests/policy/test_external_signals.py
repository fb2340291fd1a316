"""Decisions not fooled by the run's own mechanics (issue 17 item 5): a signal from outside is the
root cause, not the traceback it provokes; a rank that leaves first (even with exit 0) while the
others then lose their peers is named as the root cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.lifecycle import exited_ok
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import LEFT_FIRST, analyse, left_first
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules

JOB = "sig"
T0 = 1_795_219_200.0
TABLE = ExitCodeTable.load()
ENGINE = Engine(load_rules())


def origin(rank: int) -> Origin:
    return Origin(f"worker-{rank}", rank, JOB, f"node-{rank}", "stderr", "process")


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    """What the built-in rules find in ``lines`` printed by ``rank`` at ``t``."""
    return ENGINE.feed(origin(rank), "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def died(rank: int, t: float, returncode: int | None = None, signal: int | None = None) -> Finding:
    f = exit_finding(ProcessExit(origin(rank), 100 + rank, returncode, signal, T0 + t), TABLE, seq=int(t * 100))
    assert f is not None
    return f


def decide(tmp_path: Path, trigger: Finding, findings: list[Finding], world: int = 3):
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", JOB), JOB)
    failed = frozenset(f.origin.instance for f in findings if f.kind == "exit_code")
    return pol.decide(Incident(trigger, tuple(findings), world, failed, 0), T0 + 60)


GLOO_CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:5033. This is typically caused by a remote worker crashing.")
NCCL_REMOTE = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
               "ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, NCCL version 2.21.5")
KEYBOARD = ["Traceback (most recent call last):", '  File "/srv/train.py", line 13, in <module>',
            "    time.sleep(0.02)", "KeyboardInterrupt"]


# ------------------------------------------------------------------------------- external signals

@pytest.mark.parametrize("signal, name", [(15, "sigterm"), (2, "sigint"), (1, "sighup")])
def test_a_worker_killed_by_an_outside_signal_is_a_retryable_root_cause(tmp_path, signal, name):
    """SIGTERM (143), SIGINT (130) and SIGHUP (129, exit_codes.tsv from the overlay) are sent from
    outside; the survivors' lost-peer errors and their exits are fallout of it."""
    kill = died(1, 10.5, signal=signal)
    found = [*logged(0, 10.1, GLOO_CLOSED), *logged(2, 10.2, NCCL_REMOTE), kill,
             died(0, 11.0, returncode=1), died(2, 11.0, returncode=1)]
    assert analyse(found).root_cause == kill
    d = decide(tmp_path, found[-1], found)
    assert (d.action, d.root_cause.rule_id, d.root_cause.rank) == (Action.RESTART_JOB, f"exit.{name}", 1)
    assert d.root_cause.failure_class is FailureClass.RETRYABLE_INFRA


def test_the_keyboard_interrupt_a_sigint_provokes_is_not_user_code(tmp_path):
    """The worker's own KeyboardInterrupt traceback comes before its exit (and before the peers'
    errors): it is the signal's doing, so the SIGINT death is the root cause."""
    tb = logged(1, 10.0, *KEYBOARD)
    assert [f.failure_class for f in tb] == [FailureClass.FALLOUT]
    kill = died(1, 10.5, signal=2)
    found = [*tb, *logged(0, 10.1, GLOO_CLOSED), kill, died(0, 11.0, returncode=1)]
    d = decide(tmp_path, found[-1], found, world=2)
    assert d.action is Action.RESTART_JOB and d.root_cause == kill


def test_a_keyboard_interrupt_with_a_generic_exit_still_restarts(tmp_path):
    """A launcher that catches the interrupt and exits 1: the exit is explained by the fallout
    KeyboardInterrupt, nothing real is left, and the decision is not a user-code failure."""
    found = [*logged(1, 10.0, *KEYBOARD), died(1, 10.5, returncode=1)]
    d = decide(tmp_path, found[-1], found, world=1)
    assert d.action is Action.RESTART_JOB, d.policy_clause


AGENT = ["WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers",
         "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 72411 closing signal SIGHUP",
         "Traceback (most recent call last):",
         '  File "/opt/venv/lib/python3.8/site-packages/torch/distributed/elastic/multiprocessing/api.py", '
         "line 62, in _terminate_process_handler",
         '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
         "torch.distributed.elastic.multiprocessing.api.SignalException: Process 72390 got signal: 1"]


@pytest.mark.parametrize("sig", ["1", "Signals.SIGHUP", "15", "Signals.SIGTERM", "2"])
def test_the_agents_death_signal_is_the_root_cause_not_its_traceback(tmp_path, sig):
    lines = [AGENT[0].replace("Received 1 ", f"Received {sig} "), *AGENT[1:-1],
             AGENT[-1].replace("got signal: 1", f"got signal: {sig}")]
    found = logged(0, 10.0, *lines)
    an = analyse(found)
    assert an.root_cause is not None and an.root_cause.rule_id == "torch_elastic.agent_death_signal"
    assert an.root_cause.failure_class is FailureClass.RETRYABLE_INFRA
    assert [f.failure_class for f in found if "SignalException" in f.line] == [FailureClass.FALLOUT]


def test_a_death_signal_printed_after_another_ranks_error_is_its_fallout():
    """A scheduler stopping the other pods after one failed: the first failure stays the cause."""
    key = logged(1, 5.0, "Traceback (most recent call last):", '  File "/srv/train.py", line 9, in <module>',
                 "KeyError: 'warmup_steps'")
    found = [*key, *logged(0, 9.0, AGENT[0])]
    an = analyse(found)
    assert an.root_cause is not None and an.root_cause.rule_id == "python.key_error"


# ------------------------------------------------------------------------------- a rank that left first

def test_a_rank_that_exits_0_first_is_named_when_the_others_lose_it(tmp_path):
    ok = exited_ok(origin(1), T0 + 10.0, 1000)
    found = [ok, *logged(0, 10.1, GLOO_CLOSED), *logged(2, 10.2, GLOO_CLOSED),
             died(0, 10.6, returncode=1), died(2, 10.7, returncode=1)]
    an = analyse(found)
    rc = an.root_cause
    assert rc is not None and rc.rule_id == LEFT_FIRST and not an.fallout_only
    assert (rc.origin.instance, rc.rank, rc.failure_class) == ("worker-1", 1, FailureClass.HANG)
    d = decide(tmp_path, found[-2], found)
    assert d.action is Action.RESTART_JOB and d.root_cause.rank == 1 and "hang root cause" in d.policy_clause


def test_the_exit_0_is_named_even_when_the_peers_errors_were_seen_first():
    """An exit is timestamped when ftwatch saw it: the survivors may print before that."""
    found = [*logged(0, 10.0, GLOO_CLOSED), exited_ok(origin(1), T0 + 10.2, 1000), died(0, 10.6, returncode=1)]
    rc = analyse(found).root_cause
    assert rc is not None and rc.rule_id == LEFT_FIRST and rc.rank == 1


def test_an_exit_0_after_another_rank_failed_is_not_the_cause():
    found = [died(0, 9.0, signal=9), exited_ok(origin(1), T0 + 10.0, 1000), *logged(2, 10.2, GLOO_CLOSED)]
    assert left_first(sorted(found, key=lambda f: (f.time, f.seq))) is None
    assert analyse(found).root_cause.rule_id == "exit.sigkill"


def test_an_exit_0_does_not_outrank_a_real_error():
    key = logged(0, 12.0, "Traceback (most recent call last):", '  File "/srv/train.py", line 9, in <module>',
                 "KeyError: 'warmup_steps'")
    found = [exited_ok(origin(1), T0 + 10.0, 1000), *key, died(0, 12.5, returncode=1)]
    assert analyse(found).root_cause.rule_id == "python.key_error"


def test_exits_0_with_nothing_failing_name_nothing():
    assert analyse([exited_ok(origin(0), T0 + 1, 1), exited_ok(origin(1), T0 + 2, 2)]).root_cause is None


def test_an_exit_0_after_training_finished_is_not_leaving_early():
    done = logged(0, 9.0, "[INFO|trainer.py:2383] Training completed. Do not forget to share your model on "
                          "huggingface.co/models =)")
    assert done and done[0].rule_id.startswith("lifecycle.finished")
    found = [*done, exited_ok(origin(1), T0 + 10.0, 1000), *logged(0, 10.2, GLOO_CLOSED)]
    an = analyse(found)
    assert an.root_cause is None or an.root_cause.rule_id != LEFT_FIRST
