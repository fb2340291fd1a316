"""N3/N4: the event center routes alerts through a route tree, groups them over time, mutes,
inhibits, rate-limits and digests them, and never loses one. Time is a FakeClock; nothing sleeps."""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from ftwatch.alerting.alerts import (
    alert_from_custom_message,
    alert_from_decision,
    event_type_of,
)
from ftwatch.alerting.dispatch import EventCenter
from ftwatch.alerting.notify import DELIVERED, SPOOLED, Sender
from ftwatch.alerting.ratelimit import RateLimiter
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.routing import EventView, Router
from ftwatch.alerting.spool import Spool
from ftwatch.bounded import EVICTIONS
from ftwatch.config.limits import LimitsConfig
from ftwatch.config.model import AlertingConfig, load_config
from ftwatch.errors import ConfigError
from ftwatch.events import Action, FailureClass, Target
from ftwatch.testing import CaptureNotifier, FakeClock, decision, finding

SHANGHAI = ZoneInfo("Asia/Shanghai")


def receiver(name: str, kind: str = "webhook", clock: FakeClock | None = None) -> CaptureNotifier:
    """A receiver that keeps what it got, with no retries of its own (a test switches it ``down``);
    with a ``clock`` it notes the (fake) time of each send."""
    return CaptureNotifier(name, kind, max_retries=0, clock=clock)


_N = iter(range(10**6))


def alert(action: Action, job: str = "job-a", rank: int | None = 3, node: str | None = "node-7",
          klass: FailureClass = FailureClass.RETRYABLE_INFRA, rule: str = "nccl.error", t: float = 0.0):
    """A real alert from a real decision; each call is a new decision (its time differs)."""
    t = 1_795_219_200.0 + t + next(_N) * 1e-3
    rc = finding(rule, time=t, action=action, failure_class=klass, rank=rank, job=job, node=node)
    inst = None if action is Action.RESTART_JOB else rc.origin.instance
    a = alert_from_decision(decision(action, rc, time=t, target=Target(job, inst, rank, node)), "ftwatch explain")
    assert a is not None
    return a


def center(tmp_path: Path, clock: FakeClock, sinks: list[CaptureNotifier], state: bool = True,
           limits: dict | None = None, **alerting):
    config = AlertingConfig.model_validate(
        {"receivers": [{"type": "console", "name": s.name} for s in sinks], **alerting})
    limiter = RateLimiter.from_config(config.rate_limits, {s.name: s.kind for s in sinks}, clock.time(),
                                      tmp_path / "ratelimit.json" if state else None)
    sender = Sender(sinks, TemplateRenderer("en"), Spool(tmp_path / "spool", now=clock.time),
                    sleep=lambda s: None, now=clock.time, limiter=limiter)
    return EventCenter(config, sender, clock.time, tmp_path if state else None,
                       LimitsConfig.model_validate(limits or {}))


# -- event types and labels ---------------------------------------------------------------------

def test_event_types_come_from_action_and_trigger():
    assert event_type_of(alert(Action.RESTART_JOB).decision) == "job_restart"
    assert event_type_of(alert(Action.RESTART_JOB, klass=FailureClass.HANG, rule="hang.job").decision) == "job_hang"
    assert event_type_of(alert(Action.RESTART_INSTANCE).decision) == "instance_restart"
    assert event_type_of(alert(Action.RESTART_IN_PLACE).decision) == "instance_restart"
    assert event_type_of(alert(Action.ISOLATE_NODE).decision) == "node_isolated"
    assert event_type_of(alert(Action.FAIL_JOB).decision) == "job_failed"
    assert event_type_of(alert(Action.NOTIFY, klass=FailureClass.STRAGGLER).decision) == "straggler"
    assert event_type_of(alert(Action.NOTIFY, rule="c4d.slow_node").decision) == "c4d_diagnosis"
    # a C4D isolation is an isolation (on-call routes, the default inhibit rule, resolution);
    # the c4d label tells it apart
    c4d = alert(Action.ISOLATE_NODE, rule="c4d.rank_comm_hang")
    assert (c4d.event_type, c4d.severity, c4d.labels["c4d"]) == ("node_isolated", "critical", "true")
    assert event_type_of(alert(Action.RESTART_JOB, rule="c4d.rank_comm_hang").decision) == "job_restart"
    assert "c4d" not in alert(Action.ISOLATE_NODE, rule="xid.79").labels
    a = alert(Action.ISOLATE_NODE, job="j9", rank=5, node="n5", rule="xid.79")
    assert (a.event_type, a.severity) == ("node_isolated", "critical")
    assert {k: a.labels[k] for k in ("job", "rank", "node", "rule", "action", "failure_class")} == {
        "job": "j9", "rank": "5", "node": "n5", "rule": "xid.79", "action": "isolate_node",
        "failure_class": "retryable_infra"}
    msg = alert_from_custom_message("j9", "loss is NaN", 1_795_219_200.0, rank=0)
    assert msg.event_type == "custom_message" and msg.labels["rank"] == "0"


# -- the route tree -----------------------------------------------------------------------------

def routes(**route) -> Router:
    config = AlertingConfig.model_validate({"receivers": [{"type": "console", "name": n} for n in
                                                          ("root", "crit", "chat", "night", "all")],
                                            "route": route})
    return Router(config.route, ["root", "crit", "chat", "night", "all"])


def test_first_matching_child_wins_and_continue_goes_on():
    r = routes(receivers=["root"], group_by=["job"], routes=[
        {"match": {"severity": ["critical"]}, "receivers": ["crit"], "continue": True},
        {"match": {"event_type": ["job_failed", "node_isolated"]}, "receivers": ["chat"], "group_by": ["job", "node"]},
        {"match": {"event_type": ["job_failed"]}, "receivers": ["night"]},
        {"match": {"labels": {"job": "~llm-.*"}}, "receivers": ["all"]}])
    failed = EventView.of(alert(Action.FAIL_JOB, job="j1", node="n1"))
    got = r.route(failed)
    assert [(m.path, m.receivers) for m in got] == [("route.routes.0", ("crit",)), ("route.routes.1", ("chat",))]
    assert got[0].group_key == "route.routes.0{job=j1}"          # group_by inherited from the root
    assert got[1].group_key == "route.routes.1{job=j1,node=n1}"
    assert got[1].trail[0] == "route (any)" and "continue" in got[0].trail[1]
    # no child matches: the root takes it
    [m] = r.route(EventView.of(alert(Action.RESTART_JOB, job="j1")))
    assert (m.path, m.receivers) == ("route", ("root",))
    # a regex must match the whole label value
    [m] = r.route(EventView.of(alert(Action.RESTART_JOB, job="llm-7b")))
    assert m.receivers == ("all",)
    [m] = r.route(EventView.of(alert(Action.RESTART_JOB, job="my-llm-7b")))
    assert m.receivers == ("root",)


def test_nested_routes_inherit_receivers_and_timing():
    r = routes(receivers=["root"], group_wait="30s", group_interval="5m", routes=[
        {"match": {"labels": {"job": "j1"}}, "receivers": ["chat"], "group_wait": 0, "routes": [
            {"match": {"event_type": ["custom_message"]}, "repeat_interval": "1h"}]}])
    [m] = r.route(EventView.of(alert_from_custom_message("j1", "loss is NaN", 1_795_219_200.0)))
    assert m.path == "route.routes.0.routes.0" and m.receivers == ("chat",)
    assert (m.timing.group_wait, m.timing.group_interval, m.timing.repeat_interval) == (0, 300, 3600)


def test_root_receivers_default_to_every_receiver():
    [m] = routes().route(EventView.of(alert(Action.RESTART_JOB)))
    assert m.receivers == ("root", "crit", "chat", "night", "all")


# -- config errors, with file:line ----------------------------------------------------------------

def issue_lines(path, info) -> dict[int, str]:
    return {i.line: i.message for i in info.value.issues if i.file == str(path)}


def test_repeat_interval_shorter_than_group_interval_is_rejected_with_file_and_line(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("alerting:\n"
                    "  receivers: [{type: console, name: c}]\n"
                    "  route:\n"
                    "    group_interval: 10m\n"
                    "    routes:\n"
                    "      - match: {event_type: [job_failed]}\n"
                    "        repeat_interval: 5m\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    # at the child's repeat_interval, the value that clashes with the inherited group_interval
    assert issue_lines(path, info) == {7: "alerting.route.routes[0].repeat_interval: repeat_interval (300s) "
                                          "is shorter than group_interval (600s)"}
    # both set in one child route: at its repeat_interval; and every error at once
    path.write_text("alerting:\n  receivers: [{type: console, name: c}]\n  route:\n    routes:\n"
                    "      - match: {event_type: [job_hang]}\n        group_interval: 1h\n"
                    "        repeat_interval: 30m\n"
                    "      - match: {event_type: [nonsense]}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = issue_lines(path, info)
    assert lines[7] == "alerting.route.routes[0].repeat_interval: repeat_interval (1800s) is shorter than group_interval (3600s)"
    assert "nonsense" in lines[8]
    # a child that raises group_interval above the inherited repeat_interval: at its group_interval
    path.write_text("alerting:\n  route:\n    repeat_interval: 10m\n    routes:\n"
                    "      - group_interval: 1h\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert list(issue_lines(path, info)) == [5]


def test_unknown_receivers_and_windows_are_named_at_their_own_lines(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("alerting:\n"
                    "  receivers: [{type: console, name: c}]\n"
                    "  route:\n"
                    "    routes:\n"
                    "      - receivers:\n"
                    "          - c\n"
                    "          - nobody\n"
                    "        mute_time_intervals: [never]\n"
                    "  rate_limits:\n"
                    "    ghost: {messages: 1, per_seconds: 1}\n"
                    "  mute_time_intervals: [{name: n, weekdays: [funday]}]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = issue_lines(path, info)
    # the field error (line 11) and every cross-reference error, all at once
    assert "funday" in lines[11]
    assert lines[7] == "alerting.route.routes[0].receivers[1]: unknown receiver 'nobody'; known: c"
    assert lines[8] == "alerting.route.routes[0].mute_time_intervals[0]: unknown interval 'never'; known: n"
    assert lines[10] == "alerting.rate_limits.ghost: unknown receiver 'ghost'; known: c"
    assert 1 not in lines
    # the same checks hold for a config built in code (no file, no lines)
    with pytest.raises(ValueError, match=r"route.routes\[0\].receivers\[0\]: unknown receiver 'nobody'"):
        AlertingConfig.model_validate({"receivers": [{"type": "console", "name": "c"}],
                                       "route": {"routes": [{"receivers": ["nobody"]}]}})


# -- grouping over time -------------------------------------------------------------------------

def test_group_by_batches_alerts_over_group_wait_and_group_interval(tmp_path):
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], route={"group_by": ["job"], "group_wait": "30s",
                                              "group_interval": "5m", "repeat_interval": "1h"})
    a1, a2 = alert(Action.RESTART_INSTANCE, rank=1), alert(Action.RESTART_INSTANCE, rank=2)
    other = alert(Action.RESTART_INSTANCE, job="job-b")
    assert c.dispatch(a1) == [] and c.dispatch(other) == []
    clock.advance(10)
    c.dispatch(a2)
    assert ops.sent == [] and len(list((tmp_path / "held").glob("*.json"))) == 3   # held on disk
    clock.advance(19.9)
    assert c.tick() == [] and ops.sent == []
    clock.advance(0.2)                                   # 30 s after the group's first alert
    results = c.tick()
    assert [r.status for r in results] == [DELIVERED, DELIVERED]
    first, second = ops.sent
    assert first.id.startswith("grp") and "2 alerts {job=job-a}" in first.title
    assert first.alert.annotations["grouped_alerts"] == ",".join(sorted([a1.decision_id, a2.decision_id]))
    assert "rank 1" in first.body and "rank 2" in first.body
    assert second.id == f"{other.decision_id}-ops"                 # alone: the usual id
    assert list((tmp_path / "held").glob("*.json")) == []
    # a new alert of job-a waits for group_interval after the last notification
    a3 = alert(Action.RESTART_INSTANCE, rank=3)
    clock.advance(60)
    c.dispatch(a3)
    clock.advance(200)
    c.tick()
    assert len(ops.sent) == 2
    clock.advance(41)                                    # 5 min after the first notification
    c.tick()
    assert ops.ids[-1] == f"{a3.decision_id}-ops"
    # nothing new: the same content again only after repeat_interval (job-b's came first)
    clock.advance(3599)
    c.tick()
    assert ops.ids[3:] == [f"{other.decision_id}-ops~repeat1"]
    clock.advance(2)
    c.tick()
    assert ops.ids[4:] == [f"{a3.decision_id}-ops~repeat1"] and ops.sent[-1].body == ops.sent[2].body
    # repeats go on for a day after the group's last new alert, then stop
    for _ in range(30):
        clock.advance(3600)
        c.tick()
    repeats = [i for i in ops.ids if i.startswith(a3.decision_id)]
    assert repeats[-1] == f"{a3.decision_id}-ops~repeat23" and c.grouper.groups == {}


def test_shutdown_flushes_waiting_groups_and_a_killed_run_sends_them_at_start(tmp_path):
    clock = FakeClock()
    ops = receiver("ops")
    route = {"group_by": ["job"], "group_wait": "10m"}
    c = center(tmp_path, clock, [ops], route=route)
    a1 = alert(Action.RESTART_JOB)
    c.dispatch(a1)
    [r] = c.close()                                       # a short run ends before group_wait
    assert r.status == DELIVERED and ops.ids == [f"{a1.decision_id}-ops"]
    # a run that dies (no close): the held alert is sent by the next one, once
    c = center(tmp_path, clock, [ops], route=route)
    a2 = alert(Action.RESTART_JOB)
    c.dispatch(a2)
    del c
    again = center(tmp_path, clock, [ops], route=route)
    [r] = again.recover()
    assert r.status == DELIVERED and ops.ids[-1] == f"{a2.decision_id}-ops"
    assert again.recover() == [] and again.close() == [] and len(ops.sent) == 2


# -- mute windows -------------------------------------------------------------------------------

def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=SHANGHAI).timestamp()


def test_mute_window_across_midnight_mutes_and_the_digest_tells_later(tmp_path):
    clock = FakeClock(at("2026-11-23T21:59:00"))          # a Monday
    night, day = receiver("night"), receiver("day")
    c = center(tmp_path, clock, [night, day],
               route={"routes": [{"match": {"severity": ["warning"]}, "receivers": ["night"],
                                  "mute_time_intervals": ["nights"]}], "receivers": ["day"]},
               mute_time_intervals=[{"name": "nights", "weekdays": ["mon:fri"],
                                     "times": [{"start": "22:00", "end": "08:00"}],
                                     "timezone": "Asia/Shanghai"}],
               digest={"at": "09:00", "timezone": "Asia/Shanghai"})
    c.dispatch(alert(Action.RESTART_JOB, rank=1))         # 21:59: not muted
    assert len(night.sent) == 1
    clock.advance(120)                                    # 22:01
    muted = alert(Action.RESTART_JOB, rank=2)
    [r] = c.dispatch(muted)
    assert r.status == "muted" and "nights" in r.error and len(night.sent) == 1
    clock.advance(8 * 3600)                               # Tuesday 06:01, still muted
    [r] = c.dispatch(alert(Action.RESTART_JOB, rank=3))
    assert r.status == "muted"
    c.dispatch(alert(Action.FAIL_JOB))                    # critical: the root route, not muted
    assert len(day.sent) == 1
    clock.advance(2 * 3600)                               # 08:01: not muted any more
    c.dispatch(alert(Action.RESTART_JOB, rank=4))
    assert len(night.sent) == 2
    clock.advance(3600)                                   # 09:01: the digest is due
    [r] = c.tick()
    assert r.status == DELIVERED and night.sent[-1].id.startswith("digest")
    assert "daily digest: 2 alerts" in night.sent[-1].title
    assert "2 x job_restart (muted)" in night.sent[-1].body and "rank 2" in night.sent[-1].body
    assert c.tick() == [] and len(night.sent) == 3         # once


def test_weekday_only_window(tmp_path):
    clock = FakeClock(at("2026-11-28T12:00:00"))          # a Saturday
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], route={"mute_time_intervals": ["weekends"]},
               mute_time_intervals=[{"name": "weekends", "weekdays": ["saturday:sunday"],
                                     "timezone": "Asia/Shanghai"}])
    assert c.dispatch(alert(Action.RESTART_JOB))[0].status == "muted"
    clock.advance(2 * 86400)                              # Monday
    assert c.dispatch(alert(Action.RESTART_JOB))[0].status == DELIVERED


# -- inhibition ---------------------------------------------------------------------------------

def test_node_isolation_inhibits_per_rank_restarts_of_the_same_job_only(tmp_path):
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], route={"group_by": ["job"], "group_wait": "30s"})
    r1 = alert(Action.RESTART_INSTANCE, rank=1)           # before the isolation, in the same group
    c.dispatch(r1)
    clock.advance(5)
    iso = alert(Action.ISOLATE_NODE, rank=2)
    c.dispatch(iso)
    r3 = alert(Action.RESTART_INSTANCE, rank=3)
    other = alert(Action.RESTART_INSTANCE, job="job-b", rank=3)
    c.dispatch(r3)
    c.dispatch(other)
    clock.advance(30)
    results = c.tick()
    by_status = sorted((r.status, r.decision_id) for r in results)
    assert ("inhibited", r1.decision_id) in by_status and ("inhibited", r3.decision_id) in by_status
    assert [n.alert.decision_id for n in ops.sent] == [iso.decision_id, other.decision_id]
    assert all("node_isolated" in r.error for r in results if r.status == "inhibited")
    # after the rule's duration (1 h) the isolation inhibits no more
    clock.advance(3600)
    late = alert(Action.RESTART_INSTANCE, rank=1)
    c.dispatch(late)
    clock.advance(30)
    c.tick()
    assert ops.sent[-1].alert.decision_id == late.decision_id


def test_groups_past_the_cap_forget_the_one_idle_longest_and_never_drop_waiting_alerts(tmp_path):
    """Issue 17: groups were pruned by time only (a day of repeats), so a flood of jobs kept one
    group each for a day."""
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], limits={"max_alert_groups": 2},
               route={"group_by": ["job"], "group_wait": "30s", "repeat_interval": "1h"})
    before = EVICTIONS.get("alert_group")
    a, b = alert(Action.RESTART_JOB, job="job-a"), alert(Action.RESTART_JOB, job="job-b")
    c.dispatch(a)
    c.dispatch(b)
    clock.advance(30)
    c.tick()
    assert sorted(n.alert.decision_id for n in ops.sent) == sorted([a.decision_id, b.decision_id])
    waiting = alert(Action.RESTART_JOB, job="job-c")
    c.dispatch(waiting)                                  # job-a's group (sent first) is forgotten
    assert list(c.grouper.groups) == ["route{job=job-b}", "route{job=job-c}"]
    assert EVICTIONS.get("alert_group") - before == 1
    late = alert(Action.RESTART_JOB, job="job-d")        # job-b is idle: forgotten, job-c still waits
    c.dispatch(late)
    assert EVICTIONS.get("alert_group") - before == 2 and waiting.decision_id not in ops.ids[-1]
    early = alert(Action.RESTART_JOB, job="job-e")       # every group waits: the oldest is sent early
    c.dispatch(early)
    assert ops.ids[-1] == f"{waiting.decision_id}-ops" and EVICTIONS.get("alert_group") - before == 2
    clock.advance(3600)
    c.tick()                                              # the rest in time; no repeat of a or b
    sent = [i.split("-ops")[0] for i in ops.ids]
    assert {waiting.decision_id, late.decision_id, early.decision_id} <= set(sent)
    assert sent.count(a.decision_id) == 1 and sent.count(b.decision_id) == 1


def test_inhibit_sources_and_unsent_alerts_past_the_cap_are_forgotten_oldest_first(tmp_path):
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], limits={"max_remembered_alerts": 1})
    before = EVICTIONS.snapshot()
    c.dispatch(alert(Action.ISOLATE_NODE, job="job-a"))
    hidden = alert(Action.RESTART_JOB, job="job-a")
    assert [r.status for r in c.dispatch(hidden)] == ["inhibited"]
    c.dispatch(alert(Action.ISOLATE_NODE, job="job-b"))  # job-a's isolation is forgotten ...
    other = alert(Action.RESTART_JOB, job="job-b")
    assert [r.status for r in c.dispatch(other)] == ["inhibited"]    # (and hidden's unsent mark)
    free = alert(Action.RESTART_JOB, job="job-a")
    c.dispatch(free)                                      # ... so it inhibits nothing more
    assert ops.ids[-1] == f"{free.decision_id}-ops"
    counts = {k: n - before.get(k, 0) for k, n in EVICTIONS.snapshot().items()}
    assert counts["inhibit_source"] == 1 and counts["unsent_alert"] == 1
    assert list(c._unsent) == [("ops", other.decision_id)]


def test_inhibit_rules_can_be_turned_off(tmp_path):
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], inhibit_rules=[])
    c.dispatch(alert(Action.ISOLATE_NODE))
    c.dispatch(alert(Action.RESTART_INSTANCE))
    assert len(ops.sent) == 2


# -- rate limits --------------------------------------------------------------------------------

def assert_window(times: list[float], messages: int, per_seconds: float) -> None:
    """Never more than ``messages`` sends in any window ``[t, t + per_seconds)``."""
    times = sorted(times)
    for i, t in enumerate(times):
        inside = [u for u in times[i:] if u < t + per_seconds]
        assert len(inside) <= messages, f"{len(inside)} sends in the {per_seconds:g} s from {t}"


def test_dingtalk_default_rate_limit_holds_then_releases_and_digests(tmp_path):
    clock = FakeClock(at("2026-11-23T10:00:00"))
    bot = receiver("bot", "dingtalk", clock)
    c = center(tmp_path, clock, [bot], digest={"at": "09:00", "timezone": "Asia/Shanghai"})
    alerts = [alert(Action.RESTART_INSTANCE, rank=i) for i in range(25)]
    statuses = [c.dispatch(a)[0].status for a in alerts]
    assert statuses == [DELIVERED] * 20 + [SPOOLED] * 5    # DingTalk: 20 messages a minute
    assert len(bot.sent) == 20 and len(list((tmp_path / "spool").glob("*.json"))) == 5
    for _ in range(59):                                   # nothing more within the minute
        clock.advance(1.0)
        c.tick()
    assert len(bot.sent) == 20
    clock.advance(1.0)
    c.tick()
    assert sorted(bot.ids) == sorted(f"{a.decision_id}-bot" for a in alerts)   # each once
    assert list((tmp_path / "spool").glob("*.json")) == []
    assert_window(bot.times, 20, 60)
    # the next day at 09:00 the digest says five were delayed
    clock.advance(23 * 3600)
    c.tick()
    assert bot.sent[-1].id.startswith("digest") and "5 x instance_restart (rate limited)" in bot.sent[-1].body


def test_rate_limit_holds_in_every_window_for_a_burst_then_a_steady_stream_across_restarts(tmp_path):
    """A burst of 30, then one alert every 2 s for 5 minutes, with the process killed and started
    again twice on the way: never more than 20 sends to the DingTalk bot in any 60 s."""
    clock = FakeClock(at("2026-11-23T10:00:00"))
    bot = receiver("bot", "dingtalk", clock)
    c = center(tmp_path, clock, [bot], digest={"enabled": False})
    sent = [alert(Action.RESTART_INSTANCE, rank=i) for i in range(30)]
    for a in sent:
        c.dispatch(a)
    for step in range(150):
        clock.advance(2.0)
        if step in (40, 90):                              # killed; a new process starts
            c = center(tmp_path, clock, [bot], digest={"enabled": False})
            c.resend_pending()
        a = alert(Action.RESTART_INSTANCE, rank=100 + step)
        sent.append(a)
        c.dispatch(a)
        c.tick()
    for _ in range(600):                                  # then quiet until all are out
        clock.advance(1.0)
        c.tick()
    assert sorted(bot.ids) == sorted(f"{a.decision_id}-bot" for a in sent)
    assert_window(bot.times, 20, 60)
    assert len([t for t in bot.times if t < bot.times[0] + 60]) == 20   # the limit is used, not halved


def test_configured_rate_limit_and_kill_between_runs_keeps_held_alerts(tmp_path):
    clock = FakeClock()
    ops = receiver("ops", clock=clock)
    c = center(tmp_path, clock, [ops], rate_limits={"ops": {"messages": 2, "per_seconds": "1m"}})
    alerts = [alert(Action.RESTART_JOB, rank=i) for i in range(4)]
    for a in alerts:
        c.dispatch(a)
    assert len(ops.sent) == 2
    # killed here; a new process keeps the window (ratelimit.json): nothing more within the minute
    c2 = center(tmp_path, clock, [ops], rate_limits={"ops": {"messages": 2, "per_seconds": "1m"}})
    assert c2.resend_pending() == 0 and len(ops.sent) == 2
    clock.advance(60)
    c2.tick()
    assert sorted(ops.ids) == sorted(f"{a.decision_id}-ops" for a in alerts)
    assert_window(ops.times, 2, 60)


# -- retries: backoff with jitter (seeded) --------------------------------------------------------

def test_retry_backoff_has_seeded_jitter(tmp_path):
    sleeps: list[float] = []
    down = receiver("down")
    down.down, down.max_retries = True, 3
    d = Sender([down], TemplateRenderer("en"), Spool(tmp_path / "s"), backoff=(1.0, 2.0, 4.0),
                   jitter=0.2, sleep=sleeps.append, rng=random.Random(7))
    [r] = d.dispatch(alert(Action.RESTART_JOB))
    assert r.status == SPOOLED and r.attempts == 4 and len(sleeps) == 3
    for wait, base in zip(sleeps, (1.0, 2.0, 4.0)):
        assert base * 0.8 <= wait <= base * 1.2
    assert sleeps != [1.0, 2.0, 4.0]                      # jitter is applied
    again: list[float] = []
    d2 = Sender([down], TemplateRenderer("en"), Spool(tmp_path / "s2"), backoff=(1.0, 2.0, 4.0),
                    jitter=0.2, sleep=again.append, rng=random.Random(7))
    d2.dispatch(alert(Action.RESTART_JOB))
    assert again == sleeps                                # the same seed, the same waits


def test_custom_messages_are_routed_as_custom_message(tmp_path):
    clock = FakeClock()
    chat, ops = receiver("chat"), receiver("ops")
    c = center(tmp_path, clock, [chat, ops], route={
        "receivers": ["ops"], "routes": [{"match": {"event_type": ["custom_message"]}, "receivers": ["chat"]}]})
    c.dispatch(alert_from_custom_message("job-a", "loss is NaN", clock.time(), rank=0))
    c.dispatch(alert(Action.RESTART_JOB))
    assert [n.alert.event_type for n in chat.sent] == ["custom_message"]
    assert "loss is NaN" in chat.sent[0].body
    assert [n.alert.event_type for n in ops.sent] == ["job_restart"]


def test_digests_and_custom_messages_are_alerts_without_a_decision(tmp_path):
    """No stand-in Decision: a custom message and a digest carry their own id, which names
    their notifications, and both survive the spool (a receiver that is down keeps them)."""
    from ftwatch.alerting.spool import alert_from_dict, alert_to_dict
    clock = FakeClock(at("2026-11-23T10:00:00"))
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], inhibit_rules=[], mute_time_intervals=[
        {"name": "always", "weekdays": ["mon:sun"]}], route={"routes": [
            {"match": {"event_type": ["job_restart"]}, "mute_time_intervals": ["always"]}]},
        digest={"at": "09:00", "timezone": "Asia/Shanghai"})
    msg = alert_from_custom_message("job-a", "loss is NaN", clock.time(), rank=0)
    assert msg.decision is None and len(msg.id) == 16 and msg.decision_id == msg.id
    assert alert_from_dict(alert_to_dict(msg)) == msg
    c.dispatch(msg)
    assert ops.ids == [f"{msg.id}-ops"]
    c.dispatch(alert(Action.RESTART_JOB))                 # muted: a digest line
    clock.advance(24 * 3600)
    ops.down = True
    [r] = c.tick()
    assert r.status == SPOOLED and r.notification_id.startswith("digest")
    [entry] = c.sender.spool.pending()
    assert entry.notification.alert.decision is None and entry.notification.alert.id.startswith("digest")
    ops.down = False
    assert c.resend_pending() == 1 and ops.ids[-1] == r.notification_id


def test_the_example_config_loads():
    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "examples" / "alerting.yaml")
    kinds = {r.type for r in config.alerting.receivers}
    assert kinds == {"console", "webhook", "dingtalk", "feishu", "wecom", "slack", "email", "alertmanager"}
    [am] = [r for r in config.alerting.receivers if r.type == "alertmanager"]
    assert am.resolve_after == 3600                      # `1h`
    assert config.alerting.route.routes and config.alerting.mute_time_intervals
    assert config.alerting.inhibit_rules and config.alerting.rate_limits and config.alerting.digest.enabled
    assert config.alerting.templates["webhook"].is_file()


def test_the_readme_example_validates_and_is_the_example_file():
    """The README's full example validates, every receiver kind included, and is what
    examples/alerting.yaml holds (the file only adds comments)."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Alerts and the event center"):]
    block = section[section.index("```yaml\n") + 8:]
    readme = yaml.safe_load(block[:block.index("```")])
    data = readme["alerting"]
    kinds = {r["type"] for r in data["receivers"]}
    assert kinds == {"console", "webhook", "dingtalk", "feishu", "wecom", "slack", "email", "alertmanager"}
    config = AlertingConfig.model_validate(data)
    assert len(config.route.routes) == 4 and config.digest.timezone == "Asia/Shanghai"
    example = yaml.safe_load((root / "examples" / "alerting.yaml").read_text(encoding="utf-8"))
    assert readme == example


def test_durations_and_weekdays():
    from ftwatch.config.routes import parse_duration, weekday_range
    assert [parse_duration(v) for v in (90, "90", "30s", "5m", "4h", "1d", "1h30m", "500ms")] == [
        90, 90, 30, 300, 14400, 86400, 5400, 0.5]
    for bad in ("soon", "5 minutes", "-1", True, "1x"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert weekday_range("mon:fri") == {0, 1, 2, 3, 4}
    assert weekday_range("friday:monday") == {4, 5, 6, 0}
    assert weekday_range("sun") == {6}
    with pytest.raises(ValueError):
        weekday_range("funday")


def test_a_firing_and_a_resolved_alert_of_one_decision_are_two_alerts(tmp_path):
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], route={"group_by": ["job", "rank"], "group_wait": "1m"})
    firing = alert(Action.RESTART_INSTANCE)
    c.dispatch(firing)
    clock.advance(30)
    c.dispatch(firing.resolve(clock.time()))
    assert len(list((tmp_path / "held").glob("*.json"))) == 2
    clock.advance(30)
    c.tick()
    [n] = ops.sent
    assert n.alert.annotations["grouped_alerts"] == f"{firing.decision_id},{firing.decision_id}~resolved"
    assert list((tmp_path / "held").glob("*.json")) == []


def test_resolved_alerts_are_never_repeated_and_end_the_groups_repeats(tmp_path):
    """A restart alert repeats every repeat_interval while it fires; once its resolution went
    out, neither the resolution nor the firing alert is sent again (as in Alertmanager)."""
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], route={"group_by": ["job"], "group_interval": "5m",
                                              "repeat_interval": "1h"})
    a = alert(Action.RESTART_JOB)
    c.dispatch(a)
    clock.advance(3600)
    c.tick()
    assert ops.ids == [f"{a.decision_id}-ops", f"{a.decision_id}-ops~repeat1"]
    clock.advance(600)
    c.dispatch(a.resolve(clock.time()))
    c.tick()
    assert ops.ids[2:] == [f"{a.decision_id}-ops~resolved"]
    for _ in range(5):
        clock.advance(3600)
        c.tick()
    assert len(ops.ids) == 3 and c.grouper.groups == {}


def test_an_alertmanager_receiver_gets_each_alert_of_a_group_on_its_own(tmp_path):
    """A group of three alerts (one a resolution) is one text for a chat receiver but three
    alerts for Alertmanager, each with its own labels and endsAt (AM groups them itself)."""
    from ftwatch.alerting.notifiers import AlertmanagerNotifier
    clock = FakeClock()
    chat, am = receiver("chat"), receiver("am", kind="alertmanager")
    c = center(tmp_path, clock, [chat, am], route={"group_by": ["job"], "group_wait": "30s"})
    a1, a2 = alert(Action.RESTART_INSTANCE, rank=1), alert(Action.RESTART_INSTANCE, rank=2)
    c.dispatch(a1)
    c.dispatch(a2)
    c.dispatch(a1.resolve(clock.time()))
    clock.advance(30)
    c.tick()
    assert len(chat.sent) == 1 and "3 alerts" in chat.sent[0].title
    assert sorted(n.id for n in am.sent) == sorted([f"{a1.decision_id}-am", f"{a2.decision_id}-am",
                                                   f"{a1.decision_id}-am~resolved"])
    posted = [AlertmanagerNotifier("am", "http://am:9093").payload(n)[0] for n in am.sent]
    assert sorted(p["labels"]["rank"] for p in posted) == ["1", "1", "2"]
    ends = {n.alert.status: n.alert.ends_at for n in am.sent if n.alert.labels["rank"] == "1"}
    assert ends["resolved"] == clock.time() - 30


def test_a_resolution_follows_its_firing_alert_and_ends_the_inhibition(tmp_path):
    """An isolation inhibits its job's restarts only while it fires; a restart alert whose
    firing was inhibited (or muted) sends no resolution to that receiver; one that was
    delivered does, even while its job's isolation fires."""
    clock = FakeClock()
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops])
    restart = alert(Action.RESTART_JOB)
    c.dispatch(restart)                                  # delivered
    iso = alert(Action.ISOLATE_NODE)
    c.dispatch(iso)                                      # delivered; a live source now
    hidden = alert(Action.RESTART_JOB)
    results = c.dispatch(hidden)
    assert [r.status for r in results] == ["inhibited"]
    clock.advance(60)
    c.dispatch(restart.resolve(clock.time()))            # its firing went out: so does this
    assert ops.ids[-1] == f"{restart.decision_id}-ops~resolved"
    results = c.dispatch(hidden.resolve(clock.time()))   # its firing was inhibited: not this
    assert [r.status for r in results] == ["inhibited"] and "not sent" in results[0].error
    assert ops.ids[-1] == f"{restart.decision_id}-ops~resolved"
    c.dispatch(iso.resolve(clock.time()))                # the source resolved ...
    clock.advance(1)
    later = alert(Action.RESTART_JOB)
    c.dispatch(later)                                    # ... and inhibits nothing more
    assert ops.ids[-1] == f"{later.decision_id}-ops"


def test_no_resolution_for_an_alert_muted_when_it_fired(tmp_path):
    """Muted on Saturday, resolved on Monday: the receiver never saw the firing alert, so it
    gets no resolution; an alert delivered on Monday gets its resolution."""
    clock = FakeClock(at("2026-11-28T12:00:00"))          # a Saturday
    ops = receiver("ops")
    c = center(tmp_path, clock, [ops], route={"mute_time_intervals": ["weekends"]},
               mute_time_intervals=[{"name": "weekends", "weekdays": ["saturday:sunday"],
                                     "timezone": "Asia/Shanghai"}])
    quiet = alert(Action.RESTART_JOB)
    assert c.dispatch(quiet)[0].status == "muted"
    clock.advance(2 * 86400)                              # Monday
    loud = alert(Action.RESTART_JOB, rank=5)
    c.dispatch(loud)
    [r] = c.dispatch(quiet.resolve(clock.time()))
    assert r.status == "muted" and "its firing alert was not sent" in r.error
    c.dispatch(loud.resolve(clock.time()))
    sent = [i for i in ops.ids if not i.startswith("digest")]   # Saturday's digest is due too
    assert sent == [f"{loud.decision_id}-ops", f"{loud.decision_id}-ops~resolved"]
    assert c.digest.entries == []                          # the resolution adds no digest line
