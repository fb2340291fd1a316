"""``ftwatch evaluate`` (T4): a tiny synthetic corpus for the report and exit codes, then the real
corpus under tests/corpus (>= 90 % correct actions, no unmarked miss)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftwatch.cli import main
from ftwatch.errors import ConfigError
from ftwatch.cli.evaluate import evaluate, format_report, load_case, load_corpus, report_json
from ftwatch.rules.loader import load_rules

CORPUS = Path(__file__).parent / "corpus"

KEYERROR_LOG = """\
[default1]:[rank1]: Traceback (most recent call last):
[default1]:[rank1]:   File "/srv/train.py", line 88, in <module>
[default1]:[rank1]:     batch = cache["tokens"]
[default1]:[rank1]: KeyError: 'tokens'
[default0]:[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:29500
"""
GLOO_ONLY_LOG = """\
[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.7]:28048
"""


def write_case(root: Path, name: str, log: str, action: str, cls: str, *, known_miss: str | None = None,
               extra: str = "") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "combined.log").write_text(log)
    miss = f"known_miss: {known_miss!r}\n" if known_miss else ""
    (d / "case.yaml").write_text(
        f"id: {name}\ntitle: t\nsource: https://example.test/{name}\nsoftware: pytorch\n"
        f"conclusion: c\nexpected:\n  action: {action}\n  failure_class: {cls}\n{miss}{extra}")
    return d


@pytest.fixture(scope="module")
def rules():
    return load_rules([], builtin=True)


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    write_case(root, "a-right", KEYERROR_LOG, "fail_job", "user_code")
    write_case(root, "b-wrong", KEYERROR_LOG, "restart_job", "retryable_infra")
    write_case(root, "c-known", GLOO_ONLY_LOG, "fail_job", "user_code", known_miss="peer exit not visible")
    return root


def test_report_counts_confusion_and_misses(corpus, rules):
    """Right, wrong and known-miss cases land in the right cells of the table."""
    report = evaluate(load_corpus(corpus), rules)
    by_id = {o.case.spec.id: o for o in report.outcomes}
    assert by_id["a-right"].correct and by_id["a-right"].rule == "python.key_error" and by_id["a-right"].rank == 1
    assert not by_id["b-wrong"].correct and by_id["b-wrong"].action == "fail_job"
    assert by_id["c-known"].action == "restart_job" and by_id["c-known"].failure_class == "retryable_infra"
    assert report.confusion == {("fail_job", "fail_job"): 1, ("restart_job", "fail_job"): 1,
                                ("fail_job", "restart_job"): 1}
    assert report.by_class == {"user_code": (1, 2), "retryable_infra": (0, 1)}
    assert [o.case.spec.id for o in report.unmarked_misses] == ["b-wrong"]
    assert report.action_accuracy == pytest.approx(1 / 3)
    text = format_report(report)
    assert "MISS       b-wrong: expected restart_job [retryable_infra], decided fail_job [user_code]" in text
    assert "known miss c-known" in text and "why: peer exit not visible" in text
    assert "3 cases: actions correct 1/3 (33.3%)" in text
    assert json.loads(json.dumps(report_json(report)))["confusion"][0] == {
        "expected": "fail_job", "decided": "fail_job", "n": 1}


def test_exit_code_follows_unmarked_misses_and_min_accuracy(corpus, capsys):
    """Non-zero on an unmarked miss or below --min-accuracy; known misses alone only cost accuracy."""
    assert main(["evaluate", str(corpus), "--min-accuracy", "0"]) == 1            # b-wrong is unmarked
    capsys.readouterr()
    import shutil
    shutil.rmtree(corpus / "b-wrong")
    assert main(["evaluate", str(corpus), "--min-accuracy", "0.5"]) == 0          # 1 of 2 right, c marked
    out = capsys.readouterr().out
    assert "actions correct 1/2 (50.0%)" in out and "unmarked misses 0" in out
    assert main(["evaluate", str(corpus)]) == 1                                    # default 0.9
    assert "action accuracy 50.0% < 90%" in capsys.readouterr().err
    assert main(["evaluate", str(corpus), "--json", "--min-accuracy", "0.5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cases"] == 2 and data["by_class"]["user_code"] == {"correct": 1, "cases": 2}


def test_a_marked_miss_that_now_passes_is_reported(tmp_path, rules):
    root = tmp_path / "c"
    write_case(root, "fixed", KEYERROR_LOG, "fail_job", "user_code", known_miss="used to be wrong")
    report = evaluate(load_corpus(root), rules)
    assert report.fixed_misses and "note: fixed is marked known_miss but is now decided correctly" in format_report(report)


def test_case_flags_change_the_policy(tmp_path, rules):
    """A case's own AIMaster flags replace the defaults (here: restarts disabled → fail_job)."""
    root = tmp_path / "c"
    write_case(root, "no-restart", GLOO_ONLY_LOG, "fail_job", "retryable_infra",
               extra="flags: ['--enable-job-restart=False']\n")
    (o,) = evaluate(load_corpus(root), rules).outcomes
    assert o.correct and "enable_job_restart=False" in o.clause


@pytest.mark.parametrize("extra, message", [
    ("bogus: 1\n", "bogus: Extra inputs are not permitted"),
    ("", "expected.action: unknown action 'restart_everything'"),
])
def test_bad_cases_are_rejected_with_file_and_line(tmp_path, extra, message):
    root = tmp_path / "c"
    action = "restart_everything" if not extra else "fail_job"
    write_case(root, "bad", KEYERROR_LOG, action, "user_code", extra=extra)
    with pytest.raises(ConfigError) as err:
        load_corpus(root)
    text = "\n".join(str(i) for i in err.value.issues)
    assert "bad/case.yaml" in text and message in text
    if extra:
        assert "case.yaml:9:" in text                 # the line of the unknown key


def test_case_without_logs_or_with_a_wrong_id_is_rejected(tmp_path):
    d = write_case(tmp_path, "x", KEYERROR_LOG, "fail_job", "user_code")
    (d / "combined.log").unlink()
    (d / "case.yaml").write_text((d / "case.yaml").read_text().replace("id: x", "id: y"))
    with pytest.raises(ConfigError) as err:
        load_case(d)
    text = "\n".join(str(i) for i in err.value.issues)
    assert "id 'y' is not the directory's name 'x'" in text and "no log file" in text


@pytest.mark.slow
def test_the_corpus_reaches_90_percent_and_has_no_unmarked_miss(rules):
    """The acceptance bar of T4 on the real corpus; misses that remain are marked known_miss.
    (Slow: a fresh engine is compiled for each of the ~70 cases.)"""
    cases = load_corpus(CORPUS)
    assert len(cases) >= 60
    assert all(c.spec.source.startswith("https://github.com/") for c in cases)
    report = evaluate(cases, rules)
    assert report.action_accuracy >= 0.9, format_report(report)
    assert not report.unmarked_misses, format_report(report)
    assert not report.fixed_misses, format_report(report)


def test_a_case_that_is_not_yaml_is_reported_with_its_line(tmp_path):
    d = write_case(tmp_path, "y", KEYERROR_LOG, "fail_job", "user_code")
    (d / "case.yaml").write_text("id: y\ntitle: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_case(d)
    assert any("YAML syntax error" in str(i) and "case.yaml:" in str(i) for i in err.value.issues)
