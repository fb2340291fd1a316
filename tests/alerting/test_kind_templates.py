"""N1: a template per receiver kind and language; user overrides per kind and language, checked
by `ftwatch check` with StrictUndefined (file:line)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ftwatch.alerting.alerts import sample_alert
from ftwatch.alerting.notifiers import REGISTRY
from ftwatch.alerting.rendering import BUILTIN_KINDS, LANGUAGES, TemplateRenderer, sample_alerts
from ftwatch.config.model import load_config
from ftwatch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BUDGET = {"en": r"Restarts left\W*7\b", "zh": r"剩余重启次数\W*7\b"}


def odd_budget_alert():
    """The sample alert with budgets no other number in the text is likely to match."""
    return replace(sample_alert(), budgets={"restarts_used": 5, "restarts_left": 7})


def test_every_receiver_kind_has_a_template_of_its_own():
    assert set(BUILTIN_KINDS) == set(REGISTRY)
    for kind in BUILTIN_KINDS:
        for language in LANGUAGES:
            assert (ROOT / "ftwatch" / "alerting" / "templates" / f"{kind}.{language}.j2").is_file()


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("kind", BUILTIN_KINDS)
def test_every_rendering_carries_job_action_root_cause_budget_and_link(kind: str, language: str):
    alert = odd_budget_alert()
    r = TemplateRenderer(language)
    text = r.render(kind, alert)
    rc = alert.decision.root_cause
    assert "demo-job" in text
    assert "restart_job" in text                                   # the action's wire name
    assert rc.line in text                                         # the root-cause line
    assert rc.origin.instance in text and "2026-11-21T08:36:03.735+00:00" in text
    assert re.search(BUDGET[language], text), text
    assert alert.annotations["explain"] in text                    # the link back
    if language == "zh":
        assert "重启整个任务" in text
    others = {r.render(k, alert) for k in BUILTIN_KINDS if k != kind}
    assert text not in others                                      # its own text
    title = text.splitlines()[0]
    assert "demo-job" in title and len(title) < 200


@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("kind", BUILTIN_KINDS)
def test_resolved_and_custom_messages_render(kind: str, language: str):
    r = TemplateRenderer(language)
    firing, resolved, custom, no_root_cause, _signature = sample_alerts()
    if kind != "alertmanager":                                     # AM carries it in endsAt
        assert ("RESOLVED" if language == "en" else "已恢复") in r.render(kind, resolved)
        assert "RESOLVED" not in r.render(kind, firing) and "已恢复" not in r.render(kind, firing)
    assert "loss is NaN at step 1200" in r.render(kind, custom)
    assert no_root_cause.decision.root_cause is None and "demo-job" in r.render(kind, no_root_cause)


def test_slack_text_is_escaped_for_mrkdwn():
    alert = sample_alert()
    rc = replace(alert.decision.root_cause, line="AssertionError: x < 0 & y > 1")
    alert = replace(alert, decision=replace(alert.decision, root_cause=rc))
    text = TemplateRenderer("en").render("slack", alert)
    assert "x &lt; 0 &amp; y &gt; 1" in text and "x < 0" not in text


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_an_override_per_kind_and_language_from_the_config(tmp_path: Path):
    write(tmp_path / "mail-zh.j2", "告警 {{ job }} {{ action_text }}\n正文 {{ root_cause.line }}\n")
    write(tmp_path / "slack.j2", "SLACK {{ job }}\n")
    cfg = write(tmp_path / "ftwatch.yaml", "alerting:\n  language: zh\n  templates:\n"
                "    email.zh: mail-zh.j2\n    slack: slack.j2\n")
    config = load_config(cfg)
    r = TemplateRenderer("zh", config.alerting.templates)
    assert r.render("email", sample_alert()).startswith("告警 demo-job 重启整个任务\n正文 torch.")
    assert r.render("slack", sample_alert()) == "SLACK demo-job"       # bare key: the config's language
    r_en = TemplateRenderer("en", config.alerting.templates)
    assert r_en.render("email", sample_alert()).startswith("[ftwatch] warning")   # zh only


def test_bad_template_keys_are_config_errors_with_line(tmp_path: Path):
    cfg = write(tmp_path / "ftwatch.yaml", "alerting:\n  templates:\n    email.fr: x.j2\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert "email.fr" in str(info.value) and f"{cfg}:" in str(info.value)
    cfg = write(tmp_path / "ftwatch.yaml", "alerting:\n  templates:\n    pagerduty.en: x.j2\n")
    with pytest.raises(ConfigError):
        load_config(cfg)


def test_ftwatch_check_catches_a_typo_in_an_override_with_file_and_line(tmp_path: Path):
    good = write(tmp_path / "am-en.j2", "{{ summary }}\n{{ job }} {{ budgets.restarts_left }}\n")
    typo = write(tmp_path / "mail-zh.j2", "任务 {{ job }}\n动作 {{ action_text }}\n"
                 "根因 {{ root_cause.lien }}\n")
    cfg = write(tmp_path / "ftwatch.yaml", "alerting:\n  receivers:\n"
                "    - {type: email, name: mail, host: 127.0.0.1, from_addr: f@x, to: [t@x]}\n"
                f"  templates:\n    email.zh: {typo.name}\n    alertmanager.en: {good.name}\n")
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "check", str(cfg)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{typo}:3:" in proc.stdout and "lien" in proc.stdout
    assert str(good) not in proc.stdout
    # fixed, and guarded: a fail_job after the job ended by itself has no root cause
    typo.write_text("任务 {{ job }}\n动作 {{ action_text }}\n{% if root_cause %}根因 {{ root_cause.line }}{% endif %}\n",
                    encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "check", str(cfg)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), proc.stdout + proc.stderr


def test_a_typo_only_hit_by_a_resolved_alert_is_caught_at_check_time(tmp_path: Path):
    """check renders resolved and custom-message samples too, so a branch typo shows up."""
    bad = write(tmp_path / "w.j2", "{{ job }}\n{% if status == 'resolved' %}\nok {{ ends_att }}\n{% endif %}\n")
    issues = TemplateRenderer("en", {"webhook": bad}).check()
    assert [(i.file, i.line) for i in issues] == [(str(bad), 3)] and "ends_att" in issues[0].message


def test_console_prints_a_resolved_alert_as_one_line():
    import io

    from ftwatch.alerting.alerts import Notification
    from ftwatch.alerting.notifiers import ConsoleNotifier
    resolved = sample_alerts()[1]
    text = TemplateRenderer("en").render("console", resolved)
    out = io.StringIO()
    ConsoleNotifier(out).send(Notification("console", resolved, text.splitlines()[0], text, "id"))
    [line] = out.getvalue().splitlines()
    assert line.startswith("==== [RESOLVED] ftwatch warning: restart_job for job demo-job")
