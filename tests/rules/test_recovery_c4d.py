"""R8 C4D records: parsing, levels, C4D_HANG_TIMEOUT / C4D_HANG_TIMES, decisions (seeds/000)."""

from __future__ import annotations

import pytest

from ftwatch.clock import FakeClock
from ftwatch.events import Action, FailureClass
from ftwatch.policy.c4d import C4DSettings, grade, parse_line

from recovery_helpers import incident, line, policy

ON = {"enable_job_hang_detection": True, "enable_c4d_hang_detection": True}


def test_parse_a_full_record():
    rec = parse_line("2026-11-21 09:36:03,735 aimaster INFO [C4D] Error RankCommHang rank=3 node=gpu-node-7 "
                     "duration=182.4s times=18 op=AllReduce")
    assert (rec.level, rec.type, rec.rank, rec.node, rec.duration, rec.times) == (
        "Error", "RankCommHang", 3, "gpu-node-7", 182.4, 18)
    assert rec.extra == {"op": "AllReduce"} and rec.hang


@pytest.mark.parametrize("text, level, kind, duration", [
    ("[C4D] WARN RankNonCommHang rank=0 host=10.0.0.5 duration=12000ms", "Warning", "RankNonCommHang", 12.0),
    ("[C4D] warning RankCommSlow node=n1 duration=350us", "Warning", "RankCommSlow", 0.00035),
    ("[C4D] Info RankNonCommSlow rank=2 ip=10.1.1.1", "Info", "RankNonCommSlow", None),
])
def test_parse_levels_units_and_node_aliases(text, level, kind, duration):
    rec = parse_line(text)
    assert (rec.level, rec.type) == (level, kind)
    assert rec.duration == pytest.approx(duration) if duration is not None else rec.duration is None
    assert rec.node is not None


@pytest.mark.parametrize("text", ["RankCommHang happened", "[C4D] Debug RankCommHang rank=1", "[C4D] Error Foo"])
def test_not_a_record(text):
    assert parse_line(text) is None


def test_hang_times_arithmetic():
    s = C4DSettings(True, 10.0, 18)
    warn = parse_line("[C4D] Warn RankCommHang rank=1 node=n duration=20s times=2")
    assert grade(warn, s) == ("Warning", "C4D level Warning")
    assert grade(parse_line("[C4D] Warn RankCommHang rank=1 node=n times=18"), s)[0] == "Error"
    assert grade(parse_line("[C4D] Warn RankCommHang rank=1 node=n duration=180s"), s)[0] == "Error"
    assert grade(warn, s, warns_in_a_row=18)[0] == "Error"
    assert grade(parse_line("[C4D] Warn RankCommSlow rank=1 node=n duration=999s"), s)[0] == "Warning"


def c4d(state, clock, text, **flags):
    p = policy(state, **{**ON, **flags})
    f = line(text, clock, rank=0, node="aimaster-node")
    return p.decide(incident(f, attempt=p.budgets.attempt, failed=set()), clock.time())


def test_error_isolates_the_node_the_record_names(tmp_path):
    d = c4d(tmp_path, FakeClock(), "[C4D] Error RankCommHang rank=3 node=gpu-node-7 duration=182s times=18")
    assert d.action is Action.ISOLATE_NODE
    assert (d.target.node, d.target.rank) == ("gpu-node-7", 3)
    assert d.policy_clause.startswith("R8 C4D Error RankCommHang on node gpu-node-7 rank 3 (C4D level Error) "
                                      "→ isolate the node and restart")
    assert d.root_cause.failure_class is FailureClass.HANG


def test_error_without_c4d_detection_only_notifies(tmp_path):
    d = c4d(tmp_path, FakeClock(), "[C4D] Error RankCommHang rank=3 node=gpu-node-7",
            enable_c4d_hang_detection=True, enable_job_hang_detection=False)
    assert d.action is Action.NOTIFY and "C4D detection is off" in d.policy_clause


@pytest.mark.parametrize("text, kind", [
    ("[C4D] Warn RankCommHang rank=3 node=gpu-node-7 duration=11s times=1", "RankCommHang"),
    ("[C4D] Warn RankNonCommHang rank=1 node=gpu-node-1 duration=15s", "RankNonCommHang"),
])
def test_warn_asks_a_person(tmp_path, text, kind):
    d = c4d(tmp_path, FakeClock(), text)
    assert d.action is Action.NOTIFY
    assert f"R8 C4D Warning {kind} on node" in d.policy_clause and "a person confirms" in d.policy_clause


def test_info_is_below_the_default_log_level_and_notifies_at_info(tmp_path):
    text = "[C4D] Info RankCommSlow rank=2 node=gpu-node-2 duration=35ms"
    assert c4d(tmp_path / "a", FakeClock(), text).action is Action.NONE
    d = c4d(tmp_path / "b", FakeClock(), text, c4d_log_level="Info")
    assert d.action is Action.NOTIFY and "R8 C4D Info RankCommSlow on node gpu-node-2 rank 2" in d.policy_clause


def test_common_envs_change_when_a_warn_becomes_an_error(tmp_path):
    text = "[C4D] Warn RankCommHang rank=3 node=gpu-node-7 duration=2.5s"
    assert c4d(tmp_path / "a", FakeClock(), text).action is Action.NOTIFY
    d = c4d(tmp_path / "b", FakeClock(), text, c4d_common_envs="C4D_HANG_TIMEOUT=1000000,C4D_HANG_TIMES=2")
    assert d.action is Action.ISOLATE_NODE and d.target.node == "gpu-node-7"
    assert "hung 2.5 s >= C4D_HANG_TIMEOUT x C4D_HANG_TIMES = 2 s" in d.policy_clause


def test_warns_in_a_row_reach_hang_times(tmp_path):
    clock = FakeClock()
    p = policy(tmp_path, c4d_common_envs="C4D_HANG_TIMES=3", **ON)
    warns = []
    for _ in range(3):
        warns.append(line("[C4D] Warn RankCommHang rank=5 node=gpu-node-5", clock, rank=0, node="aimaster"))
        clock.advance(10)
    d = p.decide(incident(warns[-1], *warns[:-1], attempt=0, failed=set()), clock.time())
    assert d.action is Action.ISOLATE_NODE and "3 Warn hangs in a row >= C4D_HANG_TIMES=3" in d.policy_clause


def test_warns_far_apart_are_not_in_a_row(tmp_path):
    """Three Warns of one rank an hour apart are three short hangs, not one of 3 x C4D_HANG_TIMEOUT."""
    clock = FakeClock()
    p = policy(tmp_path, c4d_common_envs="C4D_HANG_TIMES=3", **ON)
    warns = []
    for _ in range(3):
        warns.append(line("[C4D] Warn RankCommHang rank=5 node=gpu-node-5", clock, rank=0, node="aimaster"))
        clock.advance(3600)
    d = p.decide(incident(warns[-1], *warns[:-1], attempt=0, failed=set()), clock.time())
    assert d.action is Action.NOTIFY, d.policy_clause


def test_c4d_error_is_the_root_cause_of_a_later_failure(tmp_path):
    clock = FakeClock()
    p = policy(tmp_path, **ON)
    err = line("[C4D] Error RankCommHang rank=3 node=gpu-node-7 times=18", clock, rank=0, node="aimaster")
    clock.advance(5)
    timeout = line("[rank0]:[E1121 00:00:05.000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective "
                   "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                   "Timeout(ms)=600000) ran for 600003 milliseconds before timing out.", clock, rank=0)
    d = p.decide(incident(timeout, err, attempt=0), clock.time())
    assert d.action is Action.ISOLATE_NODE and d.target.node == "gpu-node-7"
