"""M2: ModelArts annotations, C4D flags, escalation and blame settings in the config file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ftwatch.config.model import load_config, parse_aimaster_flags
from ftwatch.config.recovery import c4d_settings, parse_c4d_envs
from ftwatch.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ftwatch.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def test_the_seed_example_annotations_are_accepted(tmp_path):
    # seeds/002, API接口设置: the example annotations, values as strings.
    config = load_config(write(tmp_path, """
        modelarts:
          annotations:
            "fault-tolerance/job-retry-num": "8"
            "fault-tolerance/job-unconditional-retry": "true"
            "fault-tolerance/hang-retry": "true"
            "fault-tolerance/pod-retry-num": "3"
        """))
    ann = config.modelarts.annotations
    assert (ann.job_retry_num, ann.job_unconditional_retry, ann.hang_retry, ann.pod_retry_num) == (8, True, True, 3)
    assert config.modelarts.enabled


def test_defaults_leave_modelarts_off_and_blame_off(tmp_path):
    config = load_config(write(tmp_path, "job: {id: x}\n"))
    assert not config.modelarts.enabled and not config.recovery.blame.enabled and config.recovery.escalation


@pytest.mark.parametrize("value", ["0", "129", "many"])
def test_job_retry_num_is_1_to_128_with_the_line(tmp_path, value):
    path = write(tmp_path, f"""
        modelarts:
          annotations:
            "fault-tolerance/job-retry-num": "{value}"
        """)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    [issue] = exc.value.issues
    assert (issue.file, issue.line) == (str(path), 3)
    assert issue.message.startswith("modelarts.annotations.fault-tolerance/job-retry-num:")


def test_an_unknown_annotation_names_its_line_and_the_close_key(tmp_path):
    path = write(tmp_path, """
        modelarts:
          annotations:
            "fault-tolerance/job-retry-num": "3"
            "fault-tolerance/pod-retry": "2"
        """)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    [issue] = exc.value.issues
    assert issue.line == 4 and "did you mean 'fault-tolerance/pod-retry-num'" in issue.message


def test_a_strategy_without_job_retry_num_is_refused(tmp_path):
    path = write(tmp_path, """
        modelarts:
          annotations:
            "fault-tolerance/hang-retry": "true"
        """)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "fault-tolerance/hang-retry needs fault-tolerance/job-retry-num" in exc.value.issues[0].message
    assert exc.value.issues[0].line == 2


def test_c4d_flags_verbatim():
    fields, rest = parse_aimaster_flags("--enable-c4d-hang-detection=True --c4d-log-level=info "
                                        "--c4d-common-envs=C4D_HANG_TIMEOUT=1,C4D_HANG_TIMES=2 train.py")
    assert fields == {"enable_c4d_hang_detection": True, "c4d_log_level": "Info",
                      "c4d_common_envs": "C4D_HANG_TIMEOUT=1,C4D_HANG_TIMES=2"}
    assert rest == ["train.py"]
    assert c4d_settings(fields["c4d_common_envs"]) == (1e-6, 2)
    assert c4d_settings("") == (10.0, 18)


@pytest.mark.parametrize("envs", ["C4D_HANG_TIMES=0", "C4D_HANG_TIMEOUT=ten", "NOEQUALS"])
def test_bad_c4d_envs(envs):
    with pytest.raises(ValueError):
        parse_c4d_envs(envs)
    with pytest.raises(ConfigError, match="--c4d-common-envs"):
        parse_aimaster_flags([f"--c4d-common-envs={envs}"])


def test_blame_settings_with_lines(tmp_path):
    path = write(tmp_path, """
        recovery:
          escalation: false
          blame:
            enabled: true
            threshold: 1
        """)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert [(i.line, i.message.split(":")[0]) for i in exc.value.issues] == [(5, "recovery.blame.threshold")]
