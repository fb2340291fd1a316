"""Rule files -> Rules: file:line for every kind of bad input, all problems at once (SPEC R1, T1, Q1)."""

from __future__ import annotations

import textwrap

import pytest

from ftwatch.errors import RuleError
from ftwatch.events import Action, FailureClass, Severity
from ftwatch.rules.loader import load_rules, parse_yaml, rules_from_keywords
from ftwatch.rules.matcher import Matcher

GOOD = """\
rules:
  - id: team.loss_spike
    keywords: ["loss spiked"]
    regex: ['grad norm: (inf|nan)']
    caseless: true
    class: user_code
    action: fail_job
    severity: critical
    priority: 12
    tags: [training]
    source: "our trainer"
    classified_by: "us"
    description: "the loss jumped"
    examples: ["step 10 LOSS SPIKED to 9e9"]
    counterexamples: ["loss steady"]

  - id: team.second
    keywords: ["second thing"]
    class: retryable_infra
    action: restart_job
"""


def _write(tmp_path, text, name="rules.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _issues(paths):
    with pytest.raises(RuleError) as info:
        load_rules(paths, builtin=False)
    return [(i.file.rsplit("/", 1)[-1], i.line, i.message) for i in info.value.issues]


def _one_rule(body: str) -> str:
    return "rules:\n  - id: t.rule\n" + textwrap.indent(textwrap.dedent(body), "    ")


def test_good_file_loads_with_locations(tmp_path):
    path = _write(tmp_path, GOOD)
    first, second = load_rules([path], builtin=False)
    assert first.id == "team.loss_spike"
    assert first.location == f"{path}:2"
    assert second.location == f"{path}:17"
    assert [(p.text, p.regex, p.caseless) for p in first.patterns] == [
        ("loss spiked", False, True), ("grad norm: (inf|nan)", True, True)]
    assert (first.failure_class, first.action, first.severity, first.priority) == (
        FailureClass.USER_CODE, Action.FAIL_JOB, Severity.CRITICAL, 12)
    assert first.tags == ("training",)
    assert first.examples == ("step 10 LOSS SPIKED to 9e9",)
    assert first.source == "our trainer ; classified by: us"
    assert (second.severity, second.priority, second.examples) == (Severity.ERROR, 0, ())


def test_builtin_packs_load_with_user_files(tmp_path):
    path = _write(tmp_path, GOOD)
    rules = load_rules([path])
    ids = [r.id for r in rules]
    assert "nccl.unhandled_system_error" in ids and ids[-2:] == ["team.loss_spike", "team.second"]
    assert all(r.location.rsplit(":", 1)[1].isdigit() for r in rules)


def test_folder_of_rule_files(tmp_path):
    _write(tmp_path, GOOD, "a.yaml")
    _write(tmp_path, "rules:\n  - {id: b.one, keywords: [x], class: info, action: none}\n", "b.yml")
    _write(tmp_path, "not: rules", "ignored.txt")
    assert [r.id for r in load_rules([tmp_path], builtin=False)] == ["team.loss_spike", "team.second", "b.one"]


@pytest.mark.parametrize("body, line, fragment", [
    ("keywords: [x]\nclass: info\naction: none\ncolour: red\n", 6, "unknown key 'colour'"),
    ("keywords: [x]\nclass: retryable\naction: none\n", 4, "bad class 'retryable'"),
    ("keywords: [x]\nclass: info\naction: ignore\n", 5, "bad action 'ignore'"),
    ("keywords: [x]\nclass: info\naction: none\nseverity: fatal\n", 6, "bad severity 'fatal'"),
    ("keywords: [x]\naction: none\n", 2, "missing 'class'"),
    ("keywords: [x]\nclass: info\n", 2, "missing 'action'"),
    ("class: info\naction: none\n", 2, "no patterns"),
    ("keywords: []\nclass: info\naction: none\n", 3, "the lists are empty"),
    ("keywords: ['']\nclass: info\naction: none\n", 3, "empty pattern"),
    ("keywords: x\nclass: info\naction: none\n", 3, "'keywords' must be a list"),
    ("regex: ['(a)\\1']\nclass: info\naction: none\n", 3, "regex '(a)\\\\1'"),
    ("regex: ['x(?=y)']\nclass: info\naction: none\n", 3, "regex 'x(?=y)'"),
    ("regex: ['x*']\nclass: info\naction: none\n", 3, "empty"),
    ("keywords: [x]\nclass: info\naction: none\nexamples: 'x'\n", 6, "'examples' must be a list"),
    ("keywords: [x]\nclass: info\naction: none\nexamples:\n  - ok\n  - 7\n", 8, "examples[1] must be a string"),
    ("keywords: [x]\nclass: info\naction: none\ncaseless: maybe\n", 6, "'caseless' must be true or false"),
    ("keywords: [x]\nclass: info\naction: none\npriority: high\n", 6, "'priority' must be an integer"),
    ("keywords: [x]\nclass: info\naction: none\nsource: [a, b]\n", 6, "'source' must be a string"),
])
def test_each_kind_of_bad_rule_has_its_line(tmp_path, body, line, fragment):
    path = _write(tmp_path, _one_rule(body))
    issues = _issues([path])
    assert any(ln == line and fragment in msg for _, ln, msg in issues), issues


def test_bad_and_missing_ids(tmp_path):
    path = _write(tmp_path, """\
        rules:
          - keywords: [x]
            class: info
            action: none
          - id: "has space"
            keywords: [y]
            class: info
            action: none
        """)
    issues = _issues([path])
    assert ("rules.yaml", 2, "rule has no 'id'") in issues
    assert any(ln == 5 and "bad id 'has space'" in msg for _, ln, msg in issues)


def test_several_errors_reported_at_once_in_line_order(tmp_path):
    path = _write(tmp_path, """\
        rules:
          - id: a.one
            keywords: [x]
            class: nope
            action: none
          - id: a.two
            regex: ['(unclosed']
            class: info
            action: explode
          - id: a.three
            keywords: [fine]
            class: info
            action: none
        """)
    issues = _issues([path])
    assert [ln for _, ln, _ in issues] == [4, 7, 9]
    with pytest.raises(RuleError) as info:
        load_rules([path], builtin=False)
    assert str(info.value).splitlines()[0].endswith("rules.yaml:4: rule 'a.one': bad class 'nope'; "
                                                     "expected one of retryable_infra|hardware_node|"
                                                     "user_code|oom|hang|straggler|fallout|info")


def test_duplicate_keys_are_rejected(tmp_path):
    path = _write(tmp_path, """\
        rules:
          - id: a.one
            keywords: [x]
            class: info
            class: oom
            action: none
        """)
    assert _issues([path]) == [("rules.yaml", 5, "duplicate key 'class' (first at line 4)")]


def test_duplicate_ids_in_one_file_and_across_files(tmp_path):
    a = _write(tmp_path, """\
        rules:
          - {id: x.same, keywords: [a], class: info, action: none}
          - {id: x.same, keywords: [b], class: info, action: none}
        """, "a.yaml")
    b = _write(tmp_path, "rules:\n  - {id: x.same, keywords: [c], class: info, action: none}\n", "b.yaml")
    issues = _issues([a, b])
    assert issues[0] == ("a.yaml", 3, "duplicate rule id 'x.same' (first at line 2)")
    assert issues[1][:2] == ("b.yaml", 2)
    assert "duplicate rule id 'x.same' (first at " in issues[1][2] and "a.yaml:2" in issues[1][2]


def test_user_rule_may_not_reuse_a_builtin_id(tmp_path):
    path = _write(tmp_path, "rules:\n  - {id: nccl.remote_error, keywords: [c], class: info, action: none}\n")
    with pytest.raises(RuleError) as info:
        load_rules([path])
    assert [(i.line, i.message.split(" (")[0]) for i in info.value.issues] == [
        (2, "duplicate rule id 'nccl.remote_error'")]


def test_half_written_file_gives_the_yaml_error_line(tmp_path):
    full = textwrap.dedent(GOOD)
    cut = full[: full.index("examples:") + len("examples: [\"step 10 LO")]
    path = _write(tmp_path, cut)
    issues = _issues([path])
    assert len(issues) == 1
    name, line, message = issues[0]
    assert name == "rules.yaml" and line in (14, 15) and message.startswith("YAML syntax error")


def test_broken_file_does_not_hide_problems_in_other_files(tmp_path):
    a = _write(tmp_path, "rules:\n  - id: a.b\n    keywords: [x\n", "a.yaml")
    b = _write(tmp_path, _one_rule("keywords: [x]\nclass: bogus\naction: none\n"), "b.yaml")
    issues = _issues([a, b])
    assert [(f, ln) for f, ln, _ in issues] == [("a.yaml", 4), ("b.yaml", 4)]


@pytest.mark.parametrize("text, fragment", [
    ("", "empty rule file"),
    ("- id: a.b\n", "must be a mapping"),
    ("rule: []\n", "unknown key 'rule'"),
    ("rules: {id: a.b}\n", "'rules' must be a list"),
    ("rules:\n  - just a string\n", "a rule must be a mapping"),
])
def test_bad_file_shapes(tmp_path, text, fragment):
    path = _write(tmp_path, text)
    assert any(fragment in msg for _, _, msg in _issues([path]))


def test_missing_file(tmp_path):
    issues = _issues([tmp_path / "nope.yaml"])
    assert issues[0][:2] == ("nope.yaml", 0) and "cannot read rule file" in issues[0][2]


def test_parse_yaml_keeps_lines():
    data, issues = parse_yaml("a:\n  b: [1,\n    2]\n  c:\n    - x\n    - y\n", "<t>")
    assert issues == []
    assert data.line == 1 and data.line_of("a") == 1
    assert data["a"].line_of("c") == 4
    assert data["a"]["c"].item_lines == [5, 6]


def test_empty_rules_list_is_fine(tmp_path):
    assert load_rules([_write(tmp_path, "rules:\n")], builtin=False) == []


# --- retryable keywords (R2) ------------------------------------------------------------------------

def test_rules_from_keywords():
    rules = rules_from_keywords(["Connection reset", "loss is nan (step *)", "Connection reset"])
    assert [r.id for r in rules] == ["custom.retryable.connection_reset", "custom.retryable.loss_is_nan_step"]
    rule = rules[1]
    assert (rule.failure_class, rule.action, rule.priority) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB, 15)
    assert rule.patterns[0].regex is False
    matcher = Matcher(rule.patterns)
    assert matcher.match_text("warn: loss is nan (step *) at 1200")
    assert not matcher.match_text("loss is nan (step 3)")


def test_rules_from_keywords_prefix_and_slug_collisions():
    rules = rules_from_keywords(["a-b", "a b", "!!!"], id_prefix="sdk.retry")
    assert [r.id for r in rules] == ["sdk.retry.a_b", "sdk.retry.a_b_2", "sdk.retry.keyword"]


def test_rules_from_keywords_rejects_empty_ones():
    with pytest.raises(RuleError) as info:
        rules_from_keywords(["ok", "  ", 3])
    assert [(i.file, i.line) for i in info.value.issues] == [("<retryable_errors>", 2), ("<retryable_errors>", 3)]


# --- bounded YAML (issue 17) ------------------------------------------------------------------------

def billion_laughs(levels: int = 9, top: str = "rules") -> str:
    """A "billion laughs" document: each level is nine aliases of the one above (9**levels values)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"{top}: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_rule_file_is_refused_at_load_with_its_line(tmp_path):
    """Without the bound the aliases expand to 387 million values while the rules are built."""
    issues = _issues([_write(tmp_path, billion_laughs())])
    assert len(issues) == 1
    name, line, message = issues[0]
    assert (name, line) == ("rules.yaml", 6)            # a5 is the first level over 200,000 nodes
    assert "billion laughs" in message


def test_a_recursive_alias_and_an_oversized_rule_file_are_refused(tmp_path):
    assert _issues([_write(tmp_path, "rules: &r\n  - *r\n")])[0][:2] == ("rules.yaml", 1)
    big = _write(tmp_path, "rules:\n" + "#" * (9 * 1024 * 1024) + "\n", "big.yaml")
    assert _issues([big]) == [("big.yaml", 0, f"cannot read rule file: file too large: over {8 * 1024 * 1024:,} bytes")]
    data, issues = parse_yaml("a: 1\n" * (2 * 1024 * 1024), "<t>")
    assert data is None and issues[0].line == 8 * 1024 * 1024 // 5 + 1 and "too large" in issues[0].message


def test_aliases_within_the_bound_still_load(tmp_path):
    text = billion_laughs(levels=3, top="x") + "rules:\n  - id: a.b\n    keywords: [boom]\n    class: user_code\n" \
                                               "    action: fail_job\n"
    with pytest.raises(RuleError) as info:        # x is an unknown top key: the document was built
        load_rules([_write(tmp_path, text)], builtin=False)
    assert "billion" not in str(info.value)
