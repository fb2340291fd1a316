"""The config model, the YAML loader (M4) and the AIMaster flag dialect (M1)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ftwatch.config.model import (AIMASTER_FLAGS, Config, ConsoleReceiver, PolicyConfig, WebhookReceiver,
                            config_reference, load_config, parse_aimaster_flags)
from ftwatch.errors import ConfigError

# The AIMaster doc's flag table (seeds/000, 全量参数说明): flag -> default.
SEED_DEFAULTS = {
    "--job-execution-mode": "Sync",
    "--enable-job-restart": False,
    "--max-num-of-job-restart": 3,
    "--enable-job-hang-detection": False,
    "--job-hang-interval": 1800,
    "--enable-c4d-hang-detection": False,
    "--enable-job-exit-hang-detection": False,
    "--job-exit-hang-interval": 600,
    "--fault-tolerant-policy": "ExitCodeAndErrorMsg",
    "--max-num-of-same-error": 10,
    "--max-tolerated-failure-rate": -1,
    # C4D配置说明 (same seed): the C4D flags given in the "other config" text box.
    "--c4d-log-level": "Warning",
    "--c4d-common-envs": "",
}

ALL_FLAGS = ("--job-execution-mode=Async --enable-job-restart=True --max-num-of-job-restart=5 "
             "--enable-job-hang-detection=true --job-hang-interval=3600 --enable-c4d-hang-detection=1 "
             "--enable-job-exit-hang-detection=True --job-exit-hang-interval=120 "
             "--fault-tolerant-policy=OnFailure --max-num-of-same-error=4 --max-tolerated-failure-rate=0.3")
ALL_EXPECTED = {
    "job_execution_mode": "Async", "enable_job_restart": True, "max_num_of_job_restart": 5,
    "enable_job_hang_detection": True, "job_hang_interval": 3600, "enable_c4d_hang_detection": True,
    "enable_job_exit_hang_detection": True, "job_exit_hang_interval": 120,
    "fault_tolerant_policy": "OnFailure", "max_num_of_same_error": 4, "max_tolerated_failure_rate": 0.3,
}


def write(tmp_path: Path, text: str, name: str = "ftwatch.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def issues_of(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[tuple[int, str]]:
    return [(i.line, i.message) for i in excinfo.value.issues]


# ------------------------------------------------------------------ defaults


def test_policy_defaults_match_the_aimaster_doc():
    policy = PolicyConfig()
    assert set(AIMASTER_FLAGS) == set(SEED_DEFAULTS)
    for flag, default in SEED_DEFAULTS.items():
        assert getattr(policy, AIMASTER_FLAGS[flag]) == default, flag


def test_other_defaults():
    config = Config()
    assert config.job.id is None
    assert config.supervisor.nproc_per_node == 1 and config.supervisor.grace_period == 10.0
    assert config.supervisor.master_addr == "127.0.0.1" and config.supervisor.master_port == 0
    assert config.supervisor.restart_delay == 1.0
    assert config.rules.builtin is True and config.rules.files == [] and config.rules.retryable_errors == []
    assert config.alerting.language == "en"
    assert config.alerting.receivers == [ConsoleReceiver(type="console", name="console")]
    assert config.storage.state_dir == Path(".ftwatch-state")
    assert config.storage.sqlite_path == Path(".ftwatch-state/ftwatch.db")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_file_gives_defaults(tmp_path, text):
    assert load_config(write(tmp_path, text)) == Config()


# ------------------------------------------------------------------ AIMaster flags


def test_all_eleven_flags_as_one_string():
    fields, rest = parse_aimaster_flags(ALL_FLAGS)
    assert fields == ALL_EXPECTED
    assert rest == []


def test_all_eleven_flags_as_argv_with_separate_values():
    argv = []
    for arg in ALL_FLAGS.split():
        argv += arg.split("=", 1)
    assert argv[:2] == ["--job-execution-mode", "Async"]
    fields, rest = parse_aimaster_flags(argv)
    assert fields == ALL_EXPECTED
    assert rest == []


def test_only_given_flags_are_returned_and_unknown_args_are_kept_in_order():
    fields, rest = parse_aimaster_flags(
        ["--nproc-per-node", "3", "--enable-job-restart", "--state-dir=/tmp/x", "--job-hang-interval", "60",
         "--", "python", "train.py", "--job-hang-interval=5"])
    assert fields == {"enable_job_restart": True, "job_hang_interval": 60}
    assert rest == ["--nproc-per-node", "3", "--state-dir=/tmp/x", "--", "python", "train.py",
                    "--job-hang-interval=5"]


def test_dlc_error_monitoring_args_string():
    # the Go SDK example of the AIMaster doc (seeds/000, 步骤二)
    fields, rest = parse_aimaster_flags(
        "--job-execution-mode=Sync --enable-job-restart=True --enable-job-hang-detection=True --job-hang-interval=3600")
    assert fields == {"job_execution_mode": "Sync", "enable_job_restart": True,
                      "enable_job_hang_detection": True, "job_hang_interval": 3600}
    assert rest == []


@pytest.mark.parametrize("word,value", [("True", True), ("true", True), ("1", True),
                                        ("False", False), ("false", False), ("0", False)])
def test_boolean_words_in_both_syntaxes(word, value):
    assert parse_aimaster_flags([f"--enable-job-restart={word}"])[0] == {"enable_job_restart": value}
    assert parse_aimaster_flags(["--enable-job-restart", word])[0] == {"enable_job_restart": value}


def test_bare_boolean_flag_is_true_and_does_not_eat_the_next_flag():
    fields, rest = parse_aimaster_flags("--enable-job-restart --max-num-of-job-restart 2 extra")
    assert fields == {"enable_job_restart": True, "max_num_of_job_restart": 2}
    assert rest == ["extra"]


def test_last_flag_wins():
    assert parse_aimaster_flags("--job-hang-interval=10 --job-hang-interval=20")[0] == {"job_hang_interval": 20}


@pytest.mark.parametrize("args,flag", [
    ("--enable-job-restart=yes", "--enable-job-restart"),
    ("--job-execution-mode=Sometimes", "--job-execution-mode"),
    ("--job-hang-interval=0", "--job-hang-interval"),
    ("--job-hang-interval=ten", "--job-hang-interval"),
    ("--job-exit-hang-interval=-5", "--job-exit-hang-interval"),
    ("--fault-tolerant-policy=Always", "--fault-tolerant-policy"),
    ("--max-tolerated-failure-rate=1.5", "--max-tolerated-failure-rate"),
    ("--max-num-of-job-restart=-1", "--max-num-of-job-restart"),
    ("--max-num-of-same-error", "--max-num-of-same-error"),
])
def test_bad_flag_values_name_the_flag(args, flag):
    with pytest.raises(ConfigError) as excinfo:
        parse_aimaster_flags(args)
    [issue] = excinfo.value.issues
    assert issue.file == "<argv>"
    assert issue.message.startswith(flag)


def test_every_bad_flag_is_reported_at_once():
    with pytest.raises(ConfigError) as excinfo:
        parse_aimaster_flags("--job-hang-interval=0 --enable-job-restart=maybe --fault-tolerant-policy=x")
    assert len(excinfo.value.issues) == 3


def test_unbalanced_quotes_are_a_config_error():
    with pytest.raises(ConfigError) as excinfo:
        parse_aimaster_flags('--job-execution-mode="Sync')
    assert excinfo.value.issues[0].file == "<argv>"


def test_values_are_case_insensitive_but_canonical():
    fields, _ = parse_aimaster_flags("--job-execution-mode=async --fault-tolerant-policy=onfailure")
    assert fields == {"job_execution_mode": "Async", "fault_tolerant_policy": "OnFailure"}


def test_with_policy_is_a_validated_copy():
    base = Config()
    fields, _ = parse_aimaster_flags("--enable-job-restart=True --job-hang-interval=60")
    config = base.with_policy(**fields)
    assert config.policy.enable_job_restart is True and config.policy.job_hang_interval == 60
    assert base.policy.enable_job_restart is False
    assert config.supervisor == base.supervisor
    with pytest.raises(ConfigError):
        base.with_policy(job_hang_interval=-1)
    with pytest.raises(ConfigError):
        base.with_policy(no_such_flag=1)


# ------------------------------------------------------------------ YAML


def test_full_file_loads(tmp_path):
    (tmp_path / "extra.yaml").write_text("rules: []\n")
    (tmp_path / "hook.j2").write_text("{{ x }}\n")
    path = write(tmp_path, """
        job: {id: train-42}
        policy:
          job_execution_mode: Async
          enable_job_restart: true
          job_hang_interval: 60
          max_tolerated_failure_rate: 0.5
        supervisor: {nproc_per_node: 3, master_port: 29500}
        rules:
          files: [extra.yaml]
          retryable_errors: ["CUDA error: unspecified launch failure"]
        alerting:
          language: zh
          receivers:
            - {name: console, type: console}
            - {name: ops, type: webhook, url: "http://example.invalid/hook", headers: {X-Token: s3cret}}
          templates: {webhook: hook.j2}
        storage: {state_dir: /tmp/state}
        """)
    config = load_config(path)
    assert config.job.id == "train-42"
    assert config.policy.job_execution_mode == "Async" and config.policy.job_hang_interval == 60
    assert config.supervisor.nproc_per_node == 3
    assert config.rules.files == [tmp_path / "extra.yaml"]
    assert config.alerting.templates == {"webhook": tmp_path / "hook.j2"}
    hook = config.alerting.receivers[1]
    assert isinstance(hook, WebhookReceiver) and hook.timeout == 5.0 and hook.max_retries == 3
    assert "s3cret" not in repr(config)
    assert config.storage.sqlite_path == Path("/tmp/state/ftwatch.db")


def test_bad_values_are_reported_with_file_and_line_all_at_once(tmp_path):
    path = write(tmp_path, """
        policy:
          job_execution_mode: Sync
          job_hang_interval: -5
          fault_tolerant_policy: Sometimes
        supervisor:
          nproc_per_node: zero
        alerting:
          receivers:
            - {name: ops, type: webhook}
            - {name: chat, type: pager}
        """)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert all(i.file == str(path) for i in excinfo.value.issues)
    got = issues_of(excinfo)
    assert [line for line, _ in got] == [3, 4, 6, 9, 10]
    assert got[0][1].startswith("policy.job_hang_interval:")
    assert got[1][1].startswith("policy.fault_tolerant_policy:")
    assert got[2][1].startswith("supervisor.nproc_per_node:")
    assert got[3][1] == "alerting.receivers[0].url: required key is missing"
    assert "pager" in got[4][1]
    assert f"{path}:3: policy.job_hang_interval" in str(excinfo.value)


def test_unknown_keys_are_rejected_with_a_suggestion(tmp_path):
    path = write(tmp_path, """
        policy:
          job_hang_intervall: 60
        alerting:
          receivers:
            - {name: console, type: console, colour: red}
        sinks: {}
        """)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    got = issues_of(excinfo)
    assert got[0] == (2, "policy.job_hang_intervall: unknown key; did you mean 'job_hang_interval'?")
    assert got[1][0] == 5 and got[1][1].startswith("alerting.receivers[0].colour: unknown key")
    assert got[2][0] == 6 and got[2][1].startswith("sinks: unknown key")


def test_duplicate_keys_are_rejected(tmp_path):
    path = write(tmp_path, """
        policy:
          job_hang_interval: 60
          enable_job_restart: true
          job_hang_interval: 90
        policy: {}
        """)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert issues_of(excinfo) == [
        (4, "policy.job_hang_interval: duplicate key (first at line 2)"),
        (5, "policy: duplicate key (first at line 1)"),
    ]


def test_yaml_syntax_error_has_a_line(tmp_path):
    path = write(tmp_path, """
        policy:
          job_hang_interval: 60
         bad: [unclosed
        """)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    [issue] = excinfo.value.issues
    assert issue.file == str(path) and issue.line >= 3 and issue.message.startswith("YAML")


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        load_config(write(tmp_path, "- a\n- b\n"))
    assert issues_of(excinfo) == [(1, "the top level must be a mapping of sections")]


def test_missing_referenced_files_and_cross_references(tmp_path):
    path = write(tmp_path, """
        rules:
          files: [nope.yaml]
        alerting:
          receivers:
            - {name: a, type: console}
            - {name: a, type: console}
        """)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    got = issues_of(excinfo)
    assert got[0][0] == 2 and "no such file" in got[0][1] and got[0][1].startswith("rules.files[0]")
    assert got[1] == (6, "alerting.receivers[1].name: receivers names must be unique: 'a' is used twice")


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        load_config(tmp_path / "missing.yaml")
    assert "cannot read" in excinfo.value.issues[0].message


# ------------------------------------------------------------------ reference


def test_config_reference_lists_every_key_with_its_default():
    ref = config_reference()
    assert ref.startswith("| key | type | default | description |")
    for name in PolicyConfig.model_fields:
        assert f"| `policy.{name}` |" in ref
    assert "| `policy.job_hang_interval` | int (> 0) | `1800` |" in ref
    assert "| `alerting.receivers[].url` |" in ref
    assert "| `storage.sqlite` | path \\| null | `null` |" in ref
    for line in ref.splitlines()[2:]:
        if line.startswith("|"):
            assert line.rstrip("|").rsplit("|", 1)[1].strip(), f"no description: {line}"


def test_a_billion_laughs_config_is_refused_at_load_with_its_line(tmp_path):
    """Issue 17: nine levels of nine aliases (387 M values) are refused before validation walks them."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines + ["policy: *a8"]) + "\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert len(excinfo.value.issues) == 1
    line, message = issues_of(excinfo)[0]
    assert line == 6 and "billion laughs" in message and excinfo.value.issues[0].file == str(path)
