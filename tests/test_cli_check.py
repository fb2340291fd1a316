"""`ftwatch check` and `ftwatch test-rules` from the command line (T1, T2)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ftwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_check_accepts_the_example_configs():
    """The shipped example configs, their custom rules, the tables and the templates are valid."""
    for config in ("examples/ftwatch.yaml", "examples/watch.yaml", "examples/watch-stdin.yaml",
                   "examples/alerting.yaml"):
        proc = ftwatch("check", config)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("ok:")


def test_check_reports_every_error_with_file_and_line(tmp_path):
    """Config errors and rule errors all come out at once, each with file:line."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: my.rule\n    keywords: [oops]\n    class: nope\n    action: restart_job\n"
                     "  - id: my.other\n    regex: ['(a']\n    class: user_code\n    action: fail_job\n")
    config = tmp_path / "ftwatch.yaml"
    config.write_text(f"policy:\n  job_hang_interval: -5\n  bogus: 1\nrules:\n  files: [{rules}]\n")
    proc = ftwatch("check", str(config))
    assert proc.returncode == 1
    out = proc.stdout
    assert f"{config}:2:" in out and "job_hang_interval" in out
    assert f"{config}:3:" in out and "bogus" in out
    assert f"{rules}:4:" in out and "nope" in out
    assert f"{rules}:7:" in out and "(a" in out


def test_test_rules_fails_on_a_missed_example(tmp_path):
    """A rule whose example does not hit makes test-rules exit non-zero and name it."""
    rules = tmp_path / "r.yaml"
    rules.write_text("rules:\n  - id: my.rule\n    keywords: [disk quota exceeded]\n    class: retryable_infra\n"
                     "    action: restart_job\n    examples: ['OSError: [Errno 122] Disk quota exceeded']\n"
                     "    counterexamples: ['quota ok']\n")
    proc = ftwatch("test-rules", "--no-builtin", str(rules))
    assert proc.returncode == 1
    assert "my.rule" in proc.stdout


def test_check_route_shows_path_receivers_group_mute_and_inhibition(tmp_path):
    """`ftwatch check --route` (N3): where a sample event goes and why, muted at --at, inhibited by an
    earlier node isolation of the same job but not of another job."""
    import json
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"event_type": "instance_restart", "severity": "warning",
                                 "labels": {"job": "llm-7b", "rank": "3", "node": "n7"}}))
    # Monday 2026-11-23 23:30 in Shanghai: inside the `nights` window of the example
    proc = ftwatch("check", "--route", str(event), "--config", "examples/alerting.yaml",
                   "--at", "2026-11-23T23:30+08:00")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "route: route (any) > route.routes.2 (event_type in instance_restart,job_hang,job_restart and job=~llm-.*)" in out
    assert "receivers: wecom-team, slack-ml, ops-hook" in out
    assert "group key: route.routes.2{job=llm-7b}" in out
    assert "muted: yes (nights)" in out and "inhibited: no" in out
    assert "rate limit: wecom-team: 20 messages per 60s" in out
    assert "verdict: not sent now (muted; in the digest)" in out
    # Monday noon: not muted; an isolation of the same job first inhibits it, of another job not
    noon = "2026-11-23T12:00+08:00"
    proc = ftwatch("check", "--route", str(event), "--config", "examples/alerting.yaml", "--at", noon)
    assert "muted: no (windows nights not active)" in proc.stdout and "verdict: sent" in proc.stdout
    pair = tmp_path / "pair.json"
    iso = {"event_type": "node_isolated", "severity": "critical", "labels": {"job": "llm-7b", "node": "n7"}}
    pair.write_text(json.dumps([iso, json.loads(event.read_text())]))
    proc = ftwatch("check", "--route", str(pair), "--config", "examples/alerting.yaml", "--at", noon)
    assert "inhibited: yes, inhibited by inhibit_rules[0]: node_isolated" in proc.stdout
    assert "verdict: not sent (inhibited)" in proc.stdout
    iso["labels"]["job"] = "llm-13b"
    pair.write_text(json.dumps([iso, json.loads(event.read_text())]))
    proc = ftwatch("check", "--route", str(pair), "--config", "examples/alerting.yaml", "--at", noon)
    assert "inhibited: no" in proc.stdout
    # a critical job failure: the first child, which says continue (the later ones do not match)
    event.write_text(json.dumps({"event_type": "job_failed", "severity": "critical", "labels": {"job": "j"}}))
    proc = ftwatch("check", "--route", str(event), "--config", "examples/alerting.yaml")
    assert "receivers: dingtalk-oncall, mail-oncall, am" in proc.stdout and "continue" in proc.stdout
    # a bad event is a usage error naming the file
    event.write_text(json.dumps({"event_type": "explosion"}))
    proc = ftwatch("check", "--route", str(event))
    assert proc.returncode == 2 and str(event) in proc.stderr and "event_type" in proc.stderr


def test_test_rules_exit_status_counterexample_hit_and_all_passing(tmp_path, capsys):
    """T2: a counterexample that hits fails the run too (exit 1); a file whose examples and
    counterexamples all behave exits 0 (in-process, through the CLI's main)."""
    from ftwatch.cli import main
    head = "rules:\n  - id: my.rule\n    keywords: [Disk quota exceeded]\n    class: retryable_infra\n    action: restart_job\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text(head + "    examples: ['OSError: [Errno 122] Disk quota exceeded']\n"
                          "    counterexamples: ['warning: Disk quota exceeded soon']\n")
    assert main(["test-rules", "--no-builtin", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "counterexample hits the rule (expected no hit)" in out and "1 rules tested: 1 failure" in out
    good = tmp_path / "good.yaml"
    good.write_text(head + "    examples: ['OSError: [Errno 122] Disk quota exceeded']\n"
                           "    counterexamples: ['OSError: [Errno 28] No space left on device']\n")
    assert main(["test-rules", "--no-builtin", str(good)]) == 0
    assert "1 rules tested: ok" in capsys.readouterr().out


def test_route_check_takes_the_severity_a_real_alert_of_that_event_type_gets(tmp_path):
    """An event without a severity is routed with its event type's severity (critical for an
    isolation), so a `severity: critical` on-call route is shown as matching."""
    import json

    from ftwatch.alerting.alerts import alert_from_decision
    from ftwatch.cli.check import explain_route
    from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target
    config = tmp_path / "a.yaml"
    config.write_text("alerting:\n  receivers:\n    - {type: console, name: all}\n    - {type: console, name: oncall}\n"
                      "  route:\n    receivers: [all]\n    routes:\n      - match: {severity: [critical]}\n"
                      "        receivers: [oncall]\n")
    for event_type, action, severity in (("node_isolated", Action.ISOLATE_NODE, "critical"),
                                         ("job_failed", Action.FAIL_JOB, "critical"),
                                         ("job_restart", Action.RESTART_JOB, "warning")):
        rc = Finding("x.y", "keyword", FailureClass.RETRYABLE_INFRA, action, Severity.ERROR,
                     Origin("worker-0", 0, "j", "n"), "boom", 1.0)
        real = alert_from_decision(Decision(2.0, action, Target("j", None, None, "n"), rc, "c", 0, 1), "x")
        assert (real.event_type, real.severity) == (event_type, severity)
        event = tmp_path / f"{event_type}.json"
        event.write_text(json.dumps({"event_type": event_type, "labels": {"job": "j"}}))
        out = explain_route(str(config), str(event), at=0.0)
        assert f"event: {event_type} severity={severity}" in out
        assert ("receivers: oncall" in out) == (severity == "critical"), out


def test_route_check_names_a_bad_event_type_or_severity(tmp_path):
    import json

    import pytest

    from ftwatch.cli.check import explain_route
    from ftwatch.errors import ConfigError
    event = tmp_path / "e.json"
    event.write_text(json.dumps({"event_type": "node_isolation"}))
    with pytest.raises(ConfigError, match="'node_isolation'"):
        explain_route(None, str(event), at=0.0)
    event.write_text(json.dumps({"event_type": "job_failed", "severity": "fatal"}))
    with pytest.raises(ConfigError, match="'fatal'"):
        explain_route(None, str(event), at=0.0)


BAD_STEP_PATTERN = "health:\n  straggler:\n    patterns:\n      - megatron\n      - 'step (?P<step>\\d+)(?= done)'\n"


def test_check_and_run_reject_a_step_pattern_the_matcher_cannot_compile(tmp_path):
    """A lookahead is a valid Python regex but not a hyperscan/RE2 one: a config error at file:line, no traceback."""
    config = tmp_path / "ftwatch.yaml"
    config.write_text(BAD_STEP_PATTERN)
    proc = ftwatch("check", str(config))
    assert proc.returncode == 1, proc.stdout
    assert f"{config}:5: health.straggler.patterns[1]" in proc.stdout and "(?=" in proc.stdout
    for cmd in (["run", "--config", str(config), "--state-dir", str(tmp_path / "st"), "--", sys.executable, "-c", "0"],
                ["replay", "--config", str(config), str(config)]):
        proc = ftwatch(*cmd)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and f"{config}:5: health.straggler.patterns[1]" in proc.stderr


def test_check_refuses_a_billion_laughs_config_and_rule_file_in_one_line_each(tmp_path):
    """Issue 17: `check` (and `test-rules`) answered only after growing to GBs; now one file:line each."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    rules = tmp_path / "rules.yaml"
    rules.write_text("\n".join(lines + ["rules: *a8"]) + "\n")
    config = tmp_path / "ftwatch.yaml"
    config.write_text("\n".join(lines + ["policy: *a8"]) + "\n")
    proc = ftwatch("check", str(config))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"{config}:6: YAML aliases expand this to more than")
    assert proc.stdout.count("billion laughs") == 1 and "Traceback" not in proc.stderr
    config.write_text(f"rules:\n  files: [{rules}]\n")
    proc = ftwatch("check", str(config))
    assert proc.returncode == 1 and proc.stdout.splitlines()[0].startswith(f"{rules}:6: YAML aliases")
    proc = ftwatch("test-rules", str(rules))
    assert proc.returncode == 2 and f"{rules}:6: YAML aliases" in proc.stderr   # a configuration error: 2 (README)


def test_check_reports_a_malformed_condition_at_its_file_and_line(tmp_path):
    """SPEC P4: a `when:` that does not parse, or that has no positive term, is named at file:line."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: my.rule\n    keywords: [oops]\n    when: 'level == INFO and (\"x\"'\n"
                     "    class: user_code\n    action: fail_job\n"
                     "  - id: my.other\n    when: 'not keyword \"x\"'\n    class: user_code\n    action: fail_job\n")
    config = tmp_path / "ftwatch.yaml"
    config.write_text(f"rules:\n  files: [{rules}]\n")
    proc = ftwatch("check", str(config))
    assert proc.returncode == 1
    assert f"{rules}:4:" in proc.stdout and "Expected ')'" in proc.stdout
    assert f"{rules}:8:" in proc.stdout and "no positive keyword or regex term" in proc.stdout
