"""N1: alerts from decisions and their Jinja2 templates (sandboxed, StrictUndefined, en + zh)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from ftwatch.alerting.alerts import (Alert, alert_from_decision, explain_command,
                                     notification_id, sample_alert)
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.notifiers import REGISTRY, ConsoleNotifier, Notification, Notifier
from ftwatch.errors import TemplateError
from ftwatch.events import (Action, Decision, FailureClass, Finding, Origin, Severity, Target,
                            iso)

T0 = 1_795_250_000.25


def make_decision(action: Action = Action.RESTART_INSTANCE, root: bool = True) -> Decision:
    rc = Finding("xid.79", "fault_code", FailureClass.HARDWARE_NODE, action, Severity.CRITICAL,
                 Origin("worker-3", 3, "job-42", "gpu-node-7", "stderr"),
                 "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", T0, 11,
                 source="https://docs.nvidia.com/deploy/xid-errors/")
    return Decision(T0 + 4.0, action, Target("job-42", "worker-3", 3, "gpu-node-7"),
                    rc if root else None, "D2 ExitCodeAndErrorMsg: hardware_node is retryable",
                    restarts_used=2, restarts_left=1, attempt=2)


def make_alert(**kw) -> Alert:
    d = make_decision(**kw)
    alert = alert_from_decision(d, explain_command("/var/lib/ftwatch state", d.decision_id))
    assert alert is not None
    return alert


def test_alert_is_alertmanager_shaped():
    alert = make_alert()
    d = alert.decision
    assert alert.labels == {
        "alertname": "ftwatch_restart_instance", "event_type": "instance_restart", "job": "job-42",
        "instance": "worker-3", "rank": "3", "node": "gpu-node-7", "action": "restart_instance",
        "severity": "warning", "failure_class": "hardware_node", "rule": "xid.79", "rule_id": "xid.79"}
    assert alert.annotations["root_cause_line"].startswith("NVRM: Xid")
    assert alert.annotations["explain"] == (
        f"ftwatch explain --state-dir '/var/lib/ftwatch state' {d.decision_id}")
    assert "xid.79 on worker-3 (rank 3)" in alert.annotations["summary"]
    assert alert.status == "firing" and alert.starts_at == d.time and alert.ends_at is None
    assert alert.budgets == {"restarts_used": 2, "restarts_left": 1}
    resolved = alert.resolve(T0 + 100)
    assert resolved.status == "resolved" and resolved.ends_at == T0 + 100


def test_action_none_makes_no_alert_unless_asked():
    d = make_decision(Action.NONE)
    assert alert_from_decision(d, "x") is None
    alert = alert_from_decision(d, "x", include_none=True)
    assert alert is not None and alert.labels["alertname"] == "ftwatch_none"


def test_fail_and_isolate_are_critical():
    for action in (Action.FAIL_JOB, Action.ISOLATE_NODE):
        assert make_alert(action=action).labels["severity"] == "critical"


@pytest.mark.parametrize("kind", ["console", "webhook"])
@pytest.mark.parametrize("language", ["en", "zh"])
def test_every_field_is_rendered(kind, language):
    alert = make_alert()
    text = TemplateRenderer(language).render(kind, alert)
    for value in ("job-42", "restart_instance", "worker-3", "gpu-node-7",
                  "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
                  iso(T0), "xid.79", "hardware_node",
                  "D2 ExitCodeAndErrorMsg: hardware_node is retryable",
                  alert.annotations["explain"], alert.decision.decision_id):
        assert value in text, (value, text)
    assert "rank 3" in text
    if language == "zh":
        for word in ("任务", "动作", "目标", "根因", "规则", "故障类别", "策略条款",
                     "剩余重启次数", "节点硬件故障", "重启单个实例"):
            assert word in text, word
        assert "剩余重启次数：1" in text
    else:
        assert "Root cause" in text
        assert re.search(r"Restarts left:\s+1 \(2 used\)", text)


@pytest.mark.parametrize("language,words", [("en", "the whole job"), ("zh", "整个任务")])
def test_whole_job_target_and_no_root_cause(language, words):
    d = make_decision(Action.RESTART_JOB, root=False)
    d = Decision(d.time, d.action, Target("job-42"), None, "hang", 0, 3)
    alert = alert_from_decision(d, "http://report/x")
    text = TemplateRenderer(language).render("console", alert)
    assert words in text
    assert ("none recorded" if language == "en" else "未记录") in text
    assert "http://report/x" in text


def test_resolved_is_marked():
    alert = make_alert().resolve(T0 + 50)
    assert TemplateRenderer("en").render("webhook", alert).startswith("[RESOLVED]")
    assert TemplateRenderer("zh").render("console", alert).startswith("【已恢复】")


def test_unknown_kind_uses_the_generic_webhook_text():
    r = TemplateRenderer("en")
    alert = make_alert()
    assert r.render("pagerduty", alert) == r.render("webhook", alert)
    assert r.render("dingtalk", alert) != r.render("webhook", alert)


def test_override_is_used_per_kind_and_language(tmp_path: Path):
    en = tmp_path / "c.j2"
    en.write_text("JOB={{ job }} ACTION={{ action }} LEFT={{ budgets.restarts_left }}\n")
    zh = tmp_path / "w.j2"
    zh.write_text("任务={{ job }}\n")
    r = TemplateRenderer("en", {"console": en, "webhook.zh": zh})
    assert r.render("console", make_alert()) == "JOB=job-42 ACTION=restart_instance LEFT=1"
    assert r.render("webhook", make_alert()).startswith("[ftwatch]")  # zh override not used
    assert TemplateRenderer("zh", {"webhook.zh": zh}).render("webhook", make_alert()) == \
        "任务=job-42"
    assert r.render("console", make_alert(), builtin_only=True).startswith("ftwatch warning")


def test_strict_undefined_reports_file_and_line(tmp_path: Path):
    bad = tmp_path / "bad.j2"
    bad.write_text("{{ job }}\n{{ action }}\nnode: {{ target.nod }}\n")
    r = TemplateRenderer("en", {"console": bad})
    with pytest.raises(TemplateError) as info:
        r.render("console", make_alert())
    [issue] = info.value.issues
    assert issue.file == str(bad) and issue.line == 3
    assert "nod" in issue.message
    assert [(i.file, i.line) for i in r.check()] == [(str(bad), 3)]
    assert f"{bad}:3:" in str(r.check()[0])


def test_check_catches_an_override_that_assumes_a_root_cause(tmp_path: Path):
    """A fail_job after the job ended by itself has no root cause (Policy.finished): `check`
    renders such an alert, so `{{ root_cause.line }}` unguarded is caught with file:line."""
    override = tmp_path / "dingtalk.j2"
    override.write_text("{{ job }}: {{ action }}\ncause: {{ root_cause.line }}\n")
    r = TemplateRenderer("en", {"dingtalk": override})
    assert [(i.file, i.line) for i in r.check()] == [(str(override), 2)]
    override.write_text("{{ job }}: {{ action }}\n{% if root_cause %}cause: {{ root_cause.line }}{% endif %}\n")
    assert r.check() == []


def test_missing_variable_and_syntax_error(tmp_path: Path):
    missing = tmp_path / "m.j2"
    missing.write_text("ok\n\n{{ no_such_variable }}\n")
    broken = tmp_path / "b.j2"
    broken.write_text("line one\n{% if job %}\nnever closed\n")
    r = TemplateRenderer("en", {"console": missing, "webhook": broken,
                                "slack.zh": tmp_path / "absent.j2"})
    issues = {i.file: i for i in r.check()}
    assert issues[str(missing)].line == 3 and "no_such_variable" in issues[str(missing)].message
    assert issues[str(broken)].line >= 2 and "syntax" in issues[str(broken)].message
    assert issues[str(tmp_path / "absent.j2")].line == 0
    assert len(issues) == 3
    with pytest.raises(TemplateError):
        r.render("webhook", make_alert())


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ labels.clear() }}",
    "{{ root_cause.evidence.append('x') }}",
])
def test_sandbox_blocks_unsafe_access(tmp_path: Path, source: str):
    evil = tmp_path / "evil.j2"
    evil.write_text("harmless\n" + source + "\n")
    r = TemplateRenderer("en", {"console": evil})
    with pytest.raises(TemplateError) as info:
        r.render("console", make_alert())
    assert "sandbox" in str(info.value)
    assert info.value.issues[0].line == 2


def test_builtin_templates_pass_check_and_bad_config_is_rejected(tmp_path: Path):
    assert TemplateRenderer("en").check() == []
    assert TemplateRenderer("zh").check() == []
    with pytest.raises(TemplateError):
        TemplateRenderer("fr")
    with pytest.raises(TemplateError):
        TemplateRenderer("en", {"Console.FR": tmp_path / "x.j2"})


def test_sample_alert_renders_in_both_languages():
    alert = sample_alert()
    for language in ("en", "zh"):
        assert "nccl.unhandled_system_error" in TemplateRenderer(language).render("console", alert)


def test_notification_ids_are_stable_unique_and_file_safe():
    assert notification_id("abc", "ops") == "abc-ops"
    assert notification_id("abc", "ops", "resolved") == "abc-ops~resolved"
    assert notification_id("abc", "ops-resolved") != notification_id("abc", "ops", "resolved")
    assert notification_id("abc", "team-a.hook") == "abc-team-a.hook"
    a, b = notification_id("abc", "a/b"), notification_id("abc", "a_b")
    assert a != b and "/" not in a
    assert notification_id("abc", "a/b") == a


def test_console_notifier_prints_a_framed_block():
    alert = make_alert(action=Action.FAIL_JOB)
    text = TemplateRenderer("en").render("console", alert)
    n = Notification("console", alert, text.splitlines()[0], text, "id1")
    out = io.StringIO()
    ConsoleNotifier(out).send(n)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("==== ftwatch critical: fail_job for job job-42")
    assert lines[-1] == "=" * 72
    assert any("NVRM: Xid" in line and line.startswith("| ") for line in lines)
    colored = io.StringIO()
    ConsoleNotifier(colored, color=True).send(n)
    assert colored.getvalue().startswith("\033[1;31m")
    assert isinstance(ConsoleNotifier(), Notifier)
    assert set(REGISTRY) == {"console", "webhook", "dingtalk", "feishu", "wecom", "slack", "email",
                             "alertmanager"}


def test_console_notifier_defaults_to_stdout(capsys):
    alert = make_alert()
    ConsoleNotifier().send(Notification("console", alert, "t", "title\nbody", "id"))
    assert "| body" in capsys.readouterr().out
