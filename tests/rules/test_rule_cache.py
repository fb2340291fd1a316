"""Fast start (issue 16 item 2): a rule file's validated rules cached by content, the cache's LRU."""

from __future__ import annotations

import os

import pytest

from ftwatch.errors import RuleError
from ftwatch.events import Origin
from ftwatch.rules import diskcache, loader, rulecache
from ftwatch.rules import matcher as matcher_mod
from ftwatch.rules.loader import load_rules
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern
from test_loader import GOOD

RULES = GOOD + """
  - id: team.when_only
    when: 'keyword "disk full" and not level == INFO'
    class: retryable_infra
    action: restart_job
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(diskcache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def parses(monkeypatch):
    """Counts full loads of a rule file (``rules_from_text``: YAML parse and every check)."""
    calls: list[str] = []
    real = loader.rules_from_text
    monkeypatch.setattr(loader, "rules_from_text",
                        lambda text, name, issues, **kw: calls.append(name) or real(text, name, issues, **kw))
    return calls


def _fields(rule):
    return (rule.id, rule.patterns, rule.failure_class, rule.action, rule.severity, rule.priority, rule.examples,
            rule.counterexamples, rule.source, rule.description, rule.tags, rule.location, rule.when)


def test_a_second_load_of_the_same_file_comes_from_the_cache_equal(tmp_path, cache, parses):
    path = tmp_path / "team.yaml"
    path.write_text(RULES)
    first = load_rules([path])
    assert parses.count(str(path)) == 1 and len(list((cache / "rules").glob("*.rules"))) > 1   # packs too
    second = load_rules([path])
    assert len(parses) == len(set(parses))                  # nothing parsed twice: every file was served
    assert [_fields(r) for r in second] == [_fields(r) for r in first]
    assert [r.predicate is None for r in second] == [r.predicate is None for r in first]
    when = next(r for r in second if r.id == "team.when_only")
    origin = Origin("test")
    assert when.patterns == (Pattern("disk full"),)
    assert when.predicate(b"ERROR disk full", origin) and not when.predicate(b"INFO disk full", origin)


def test_an_edited_file_is_loaded_again_and_a_broken_one_fails_at_its_line(tmp_path, cache, parses):
    path = tmp_path / "team.yaml"
    path.write_text(RULES)
    load_rules([path], builtin=False)
    path.write_text(RULES.replace("loss spiked", "loss exploded"))
    (rule, _, _) = load_rules([path], builtin=False)
    assert rule.patterns[0] == Pattern("loss exploded", caseless=True) and parses.count(str(path)) == 2
    path.write_text(RULES.replace("action: fail_job", "action: explode"))
    for _ in range(2):                                       # a file with an issue is never cached
        with pytest.raises(RuleError) as err:
            load_rules([path], builtin=False)
        (issue,) = err.value.issues
        assert (issue.file, issue.line) == (str(path), 7) and "bad action 'explode'" in issue.message
    assert parses.count(str(path)) == 4


def test_a_bad_pattern_fails_at_its_line_on_every_load(tmp_path, cache):
    path = tmp_path / "team.yaml"
    path.write_text(RULES.replace("'grad norm: (inf|nan)'", "'a('"))
    for _ in range(2):
        with pytest.raises(RuleError) as err:
            load_rules([path], builtin=False)
        (issue,) = err.value.issues
        assert (issue.file, issue.line) == (str(path), 4) and "RE2" in issue.message


def test_the_same_content_under_another_name_is_located_there(tmp_path, cache, parses):
    (tmp_path / "a.yaml").write_text(RULES)
    (tmp_path / "b.yaml").write_text(RULES)
    load_rules([tmp_path / "a.yaml"], builtin=False)
    rules = load_rules([tmp_path / "b.yaml"], builtin=False)
    assert parses == [str(tmp_path / "a.yaml")]
    assert [r.location for r in rules] == [f"{tmp_path / 'b.yaml'}:{line}" for line in (2, 17, 22)]


def test_a_damaged_entry_or_other_code_is_a_miss(tmp_path, cache, parses, monkeypatch):
    path = tmp_path / "team.yaml"
    path.write_text(RULES)
    expected = [_fields(r) for r in load_rules([path], builtin=False)]
    (entry,) = (cache / "rules").glob("*.rules")
    entry.write_bytes(b"\x00garbage")
    assert [_fields(r) for r in load_rules([path], builtin=False)] == expected and len(parses) == 2
    monkeypatch.setattr(rulecache, "_code_digest", lambda: "another ftwatch")
    assert [_fields(r) for r in load_rules([path], builtin=False)] == expected and len(parses) == 3
    monkeypatch.setattr(matcher_mod, "_hs", None)            # checked without Hyperscan: another key
    load_rules([path], builtin=False)
    assert len(parses) == 4


def test_cache_off_writes_nothing(tmp_path, monkeypatch, parses):
    monkeypatch.setenv(diskcache.CACHE_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = tmp_path / "team.yaml"
    path.write_text(RULES)
    load_rules([path], builtin=False)
    load_rules([path], builtin=False)
    assert len(parses) == 2 and not any(tmp_path.rglob("*.rules"))


def test_eviction_drops_the_least_recently_read_not_the_oldest_written(cache, monkeypatch):
    monkeypatch.setattr(diskcache, "CACHE_KEEP", 3)
    for i, stamp in enumerate((100, 200, 300)):
        diskcache.store("t", f"k{i}", "bin", b"x")
        os.utime(cache / "t" / f"k{i}.bin", (stamp, stamp))
    assert diskcache.read("t", "k0", "bin") == b"x"          # read: now the most recently used
    diskcache.store("t", "k3", "bin", b"x")
    assert sorted(p.stem for p in (cache / "t").glob("*.bin")) == ["k0", "k2", "k3"]


@pytest.mark.skipif(matcher_mod._hs is None, reason="hyperscan not installed")
def test_more_checked_sets_than_databases_kept_all_stay_marked(cache, monkeypatch):
    """17 rule files (16 packs and one of the user's) once cycled through 16 marks: every start
    compiled every file again. Marks are kept by the thousand, and by last use."""
    compiles: list[int] = []
    real = matcher_mod._hs_compile
    monkeypatch.setattr(matcher_mod, "_hs_compile",
                        lambda exprs, ids=None: compiles.append(len(exprs)) or real(exprs, ids))
    sets = [[Pattern(f"set {k} keyword {i}") for i in range(3)] for k in range(diskcache.CACHE_KEEP + 4)]
    for patterns in sets:
        Matcher.check_many(patterns)
    assert len(compiles) == len(sets)
    for patterns in sets:
        assert Matcher.check_many(patterns) == [None] * 3
    assert len(compiles) == len(sets)


def test_a_warm_load_parses_no_condition_and_imports_no_pyparsing(tmp_path, cache):
    """The cache keeps each ``when:`` parsed (its AST as tuples): a second process loading the
    same files parses no condition, so pyparsing is never imported, and its predicates answer
    as the first process's."""
    import subprocess
    import sys
    path = tmp_path / "team.yaml"
    path.write_text(RULES)
    probe = ("import sys\n"
             "from ftwatch.events import Origin\n"
             "from ftwatch.rules.loader import load_rules\n"
             f"rules = {{r.id: r for r in load_rules([{str(path)!r}])}}\n"
             "p = rules['team.when_only'].predicate\n"
             "print(p(b'ERROR disk full', Origin('t')), p(b'INFO disk full', Origin('t')), 'pyparsing' in sys.modules)\n")
    env = {**os.environ, diskcache.CACHE_ENV: str(cache)}
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
            for _ in range(2)]
    assert runs == ["True False True\n", "True False False\n"]
