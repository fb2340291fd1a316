"""The incident core (``ftwatch.pipeline.incidents.IncidentDesk``) and its rules
(``ftwatch.policy.triggers``), driven by hand with a FakeClock: no process, no thread."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Origin, ProcessExit
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.policy.triggers import failed_instances, pick_trigger
from ftwatch.rules.timers import HangTracker
from ftwatch.testing import T0, CaptureSink, FakeClock, finding

JOB = "desk-test"
KEYERROR = b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nKeyError: 'lr'\n"
NCCL = b"RuntimeError: NCCL error: unhandled system error\n"
GLOO = b"RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:29500\n"


def worker(rank: int) -> Origin:
    return Origin(f"worker-{rank}", rank, JOB, "node-a", "stderr", "process")


def desk(tmp_path: Path, exits: bool, settle: float = 0.0, cooldown: float = 0.0, **flags):
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}}).with_policy(
        enable_job_restart=True, **flags)
    sink = CaptureSink()
    recorder = Recorder(sink, out=io.StringIO(), resolve_after=None)
    d = IncidentDesk(JOB, build_engine(config), build_policy(config, JOB), recorder, exits=exits,
                     settle=settle, cooldown=cooldown, summaries=None if exits else "live")
    d.new_attempt(T0, world_size=2 if exits else None)
    return d, sink


def test_with_process_exits_an_error_line_opens_nothing_and_a_failing_exit_does(tmp_path):
    """``run``: the exit is the event; the KeyError it printed is the evidence and the root cause."""
    clock = FakeClock()
    d, sink = desk(tmp_path, exits=True, settle=1.0)
    for rank in (0, 1):
        d.started(worker(rank), clock.time())
    assert d.output(worker(1), KEYERROR, clock.time(), clock.mono()) is None
    exit = ProcessExit(worker(1), 4121, 1, None, clock.time() + 0.1)
    trigger = d.exited(exit, clock.mono())
    assert trigger is not None and trigger.kind == "exit_code"
    assert d.settle_left(clock.mono()) == pytest.approx(1.0)
    clock.advance(1.0)
    assert d.settle_left(clock.mono()) == 0
    decision = d.decide(trigger, clock.time(), clock.mono())
    assert (decision.action, decision.root_cause.rule_id, decision.root_cause.rank) == (
        Action.FAIL_JOB, "python.key_error", 1)
    assert d.failed == {"worker-1"}
    assert [f.rule_id for f in sink.findings] == ["python.key_error", "exit.1"]


def test_an_exit_ftwatch_caused_is_no_trigger(tmp_path):
    d, _ = desk(tmp_path, exits=True)
    d.started(worker(0), T0)
    assert d.exited(ProcessExit(worker(0), 1, None, 15, T0, stopped_by_us=True)) is None
    assert d.exited(ProcessExit(worker(1), 2, 1, None, T0), expected=True) is None     # writing last words
    assert d.failed == set() and d.findings == []


def test_without_exits_an_error_opens_an_incident_that_is_due_after_settle(tmp_path):
    """``watch``: the first error opens; the peers' evidence joins within ``settle``; then tick
    hands the incident over and the decision is about the earliest real error."""
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False, settle=5.0)
    opener = d.output(worker(0), GLOO, clock.time(), clock.mono())
    assert opener is not None and opener.failure_class is FailureClass.FALLOUT
    clock.advance(1)
    assert d.output(worker(1), NCCL, clock.time() - 0.5, clock.mono()) is None   # joins, opens nothing new
    clock.advance(3.9)
    assert d.tick(clock.time(), clock.mono()) is None
    clock.advance(0.2)
    assert d.tick(clock.time(), clock.mono()) is opener
    decision = d.decide(None, clock.time(), clock.mono())
    assert (decision.action, decision.root_cause.rule_id, decision.root_cause.rank) == (
        Action.RESTART_JOB, "nccl.unhandled_system_error", 1)
    assert d.open is None


def test_after_acting_new_errors_open_nothing_for_the_cooldown(tmp_path):
    clock = FakeClock()
    d, sink = desk(tmp_path, exits=False, cooldown=60.0)
    d.output(worker(1), NCCL, clock.time(), clock.mono())
    assert d.decide(None, clock.time(), clock.mono()).action is Action.RESTART_JOB
    d.new_attempt(clock.time())
    clock.advance(10)
    assert d.output(worker(0), GLOO, clock.time(), clock.mono()) is None       # the fallout of acting
    assert d.open is None and d.findings == []
    assert sink.findings[-1].rule_id.startswith("gloo.")                         # still stored
    clock.advance(51)
    assert d.output(worker(0), NCCL, clock.time(), clock.mono()) is not None


def test_a_torchelastic_summary_in_shipped_output_is_an_exit_that_triggers(tmp_path):
    d, _ = desk(tmp_path, exits=False)
    launcher = Origin("launcher", None, JOB, "node-a", "stderr", "forward")
    summary = b"".join(line + b"\n" for line in [
        b"Root Cause (first observed failure):", b"[0]:", b"  time      : 2026-11-21_11:02:19",
        b"  host      : node-a", b"  rank      : 1 (local_rank: 1)", b"  exitcode  : -9 (pid: 18989)",
        b"  error_file: <N/A>", b"  traceback : Signal 9 (SIGKILL) received by PID 18989",
        b"=" * 55])
    assert d.output(launcher, summary, T0) is not None
    [exit] = [f for f in d.findings if f.kind == "exit_code"]
    assert (exit.rule_id, exit.rank, exit.origin.instance) == ("exit.sigkill", 1, "launcher/rank1")
    decision = d.decide(None, T0)                  # the exit is the trigger, not the summary's own lines
    assert decision.root_cause is exit and d.failed == {"launcher/rank1"}


def test_a_hang_that_only_notified_fires_again_once_output_resumed(tmp_path):
    """An Async job's hang only notifies (hang restarts are Sync-only); the desk re-arms the
    hang timer on the next output, so one silence makes one finding and a new one another."""
    clock = FakeClock()
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}}).with_policy(
        job_execution_mode="Async", enable_job_restart=True)
    d = IncidentDesk(JOB, build_engine(config), build_policy(config, JOB),
                     Recorder(CaptureSink(), out=io.StringIO(), resolve_after=None), exits=True,
                     tracker=HangTracker(60, None))
    d.new_attempt(clock.time(), world_size=1)
    d.started(worker(0), clock.time())
    clock.advance(60)
    hang = d.tick(clock.time(), clock.mono())
    assert hang is not None and hang.kind == "hang"
    assert d.decide(hang, clock.time(), clock.mono()).action is Action.NOTIFY
    clock.advance(60)
    assert d.tick(clock.time(), clock.mono()) is None              # one finding per hang episode
    d.output(worker(0), b"step 9\n", clock.time(), clock.mono())    # output resumes: re-armed
    clock.advance(60)
    assert d.tick(clock.time(), clock.mono()).kind == "hang"


# --- the rules ----------------------------------------------------------------------------------

def test_the_trigger_is_the_earliest_by_time_not_by_arrival():
    late = finding("python.key_error", time=T0 + 5, seq=1)
    early = finding("nccl.unhandled_system_error", time=T0 + 1, seq=9)
    assert pick_trigger([late, early]) is early


def test_a_failing_exit_outranks_errors_and_a_hang_outranks_what_came_after_it():
    err = finding("python.key_error", time=T0 + 1)
    ex = finding("exit.1", kind="exit_code", time=T0 + 9)
    hang = finding("hang.job", kind="hang", failure_class=FailureClass.HANG, time=T0 + 5)
    fallout = finding("gloo.pair_io_error", failure_class=FailureClass.FALLOUT, time=T0 + 2)
    assert pick_trigger([err, ex]) is ex
    assert pick_trigger([fallout, hang, ex]) is hang        # nothing real before the hang
    assert pick_trigger([err, hang, ex]) is ex              # a real error came first


def test_failed_instances_are_the_exits_else_the_real_errors_where_no_exits_are_seen():
    real = finding("python.key_error", at=worker(1))
    fallout = finding("gloo.pair_io_error", failure_class=FailureClass.FALLOUT, at=worker(0))
    assert failed_instances([real, fallout], real, set(), exits_only=False) == {"worker-1"}
    assert failed_instances([real, fallout], real, set(), exits_only=True) == set()
    assert failed_instances([real], real, {"worker-3"}, exits_only=False) == {"worker-3"}
    hang = finding("hang.job", kind="hang", failure_class=FailureClass.HANG)
    assert failed_instances([real, hang], hang, set(), exits_only=False) == set()


def test_desks_share_the_fatal_rule_sets_and_follow_the_engines_rules_when_they_change(tmp_path):
    """Every desk on one engine reads the scheduler's and the sticky rules of the engine's rules as
    they are when it is made (made once per rules list, issue 16): a rule added at run time counts
    for the desks made after it."""
    from ftwatch.pipeline.incidents import _rule_sets
    from ftwatch.policy.triggers import fatal_rules, outside_rules
    from ftwatch.rules.model import Pattern, Rule
    d, _ = desk(tmp_path, exits=False)
    engine = d.engine
    assert (d._sticky, d._outside) == (fatal_rules(engine.rules), outside_rules(engine.rules))
    assert _rule_sets(engine.rules)[0] is d._sticky         # the next desk's: the same sets
    cancelled = Rule("site.cancelled", (Pattern("SITE JOB CANCELLED"),), FailureClass.USER_CODE, Action.FAIL_JOB,
                     tags=("scheduler",))
    engine.add_rules([cancelled])
    later = IncidentDesk("other", engine, d.policy, d.recorder, exits=False)
    assert "site.cancelled" in later._outside and "site.cancelled" in later._sticky
    assert "site.cancelled" not in d._outside                 # a desk keeps the sets it was made with


def test_trimmed_openers_name_the_same_trigger_and_keep_the_rules_looked_up_by_rule():
    """``trim_openers`` bounds an incident's openers and leaves ``pick_trigger``'s answer as it was,
    whatever their order and mix (errors of several classes, hangs, exits, instances)."""
    import random

    from ftwatch.policy.triggers import trim_openers
    rng = random.Random(16)
    kinds = [("python.key_error", "keyword", FailureClass.USER_CODE),
             ("nccl.unhandled_system_error", "keyword", FailureClass.RETRYABLE_INFRA),
             ("gloo.pair_io_error", "keyword", FailureClass.FALLOUT),
             ("hang.job", "hang", FailureClass.HANG), ("exit.1", "exit_code", FailureClass.USER_CODE),
             ("os.kernel_boot", "keyword", FailureClass.HARDWARE_NODE)]
    for _ in range(100):
        openers = []
        for seq in range(rng.randint(50, 400)):
            rule, kind, cls = rng.choices(kinds, weights=[30, 30, 20, 1, 1, 2])[0]
            openers.append(finding(rule, kind=kind, failure_class=cls, time=T0 + rng.uniform(0, 100), seq=seq,
                                   at=worker(rng.randint(0, 3))))
        before, boots = pick_trigger(openers), [f for f in openers if f.rule_id == "os.kernel_boot"]
        trimmed = list(openers)
        dropped = trim_openers(trimmed, 40, by_rule={"os.kernel_boot"})
        assert dropped == len(openers) - len(trimmed) and (dropped > 0) == (len(openers) > 40)
        assert pick_trigger(trimmed) is before
        assert [f for f in trimmed if f.rule_id == "os.kernel_boot"] == boots
        assert all(f in openers for f in trimmed)
        assert trimmed[-7:] == openers[-7:]                    # the newest stay (a quarter of 30): they may still wait


def test_an_error_printed_again_and_again_keeps_the_incidents_openers_bounded(tmp_path):
    """Without exits (``watch``, ``replay``) the same NCCL error on every retry joins the open incident
    each time; its openers stay within ``limits.max_findings_per_job`` and the incident is still
    decided on the first one."""
    from ftwatch.config.limits import LimitsConfig
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}}).with_policy(enable_job_restart=True)
    d = IncidentDesk(JOB, build_engine(config), build_policy(config, JOB),
                     Recorder(CaptureSink(), out=io.StringIO(), resolve_after=None), exits=False,
                     settle=0.0, cooldown=0.0, summaries="live", limits=LimitsConfig(max_findings_per_job=40))
    d.new_attempt(T0)
    first = d.output(worker(1), NCCL, T0)
    assert first is not None
    for k in range(1, 200):
        d.output(worker(k % 2), NCCL * 3, T0 + k)
        assert len(d._openers) <= 40
    decision = d.decide(None, T0 + 300)
    assert decision.root_cause.line == first.line and decision.root_cause.time == first.time
