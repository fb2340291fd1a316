"""Fast start: compiled databases cached on disk by content, a rule file checked in one compile."""

from __future__ import annotations

import pytest

from ftwatch.errors import RuleError
from ftwatch.events import Origin
from ftwatch.rules import diskcache
from ftwatch.rules import matcher as matcher_mod
from ftwatch.rules.loader import load_rules
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern

needs_hs = pytest.mark.skipif(matcher_mod._hs is None, reason="hyperscan not installed")

PATTERNS = [Pattern("unhandled system error"), Pattern("connection closed by peer", caseless=True),
            Pattern(r"OpType=(\w+), NumelIn=\d+", regex=True), Pattern(r"error[^:]*:\s*\d", regex=True)]
DATA = (b"x\nNCCL error: unhandled system error\nConnection Closed By Peer\n"
        b"WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1)\nerror code: 3\n")


@pytest.fixture
def compiles(monkeypatch):
    """Counts Hyperscan compiles (each call of the matcher's ``_hs_compile``: its expressions)."""
    calls: list[int] = []
    real = matcher_mod._hs_compile
    monkeypatch.setattr(matcher_mod, "_hs_compile",
                        lambda exprs, ids=None: calls.append(len(exprs)) or real(exprs, ids))
    return calls


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(diskcache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "hyperscan"


@needs_hs
def test_a_second_matcher_of_the_same_patterns_loads_the_database_instead_of_compiling(cache, compiles):
    first = Matcher(PATTERNS)
    assert compiles == [len(PATTERNS)] and len(list(cache.glob("*.hsdb"))) == 1
    second = Matcher(PATTERNS)
    assert compiles == [len(PATTERNS)]                  # no second compile
    assert second.scan(DATA) == first.scan(DATA) and len(first.scan(DATA)) == 4


@needs_hs
def test_other_patterns_or_flags_are_another_database(cache, compiles):
    Matcher(PATTERNS)
    Matcher(PATTERNS[:-1] + [Pattern(r"error[^:]*:\s*\d", regex=True, caseless=True)])
    assert len(compiles) == 2 and len(list(cache.glob("*.hsdb"))) == 2


@needs_hs
def test_a_damaged_cache_file_is_compiled_over(cache, compiles):
    Matcher(PATTERNS)
    (path,) = cache.glob("*.hsdb")
    path.write_bytes(b"not a database")
    again = Matcher(PATTERNS)
    assert len(compiles) == 2 and len(again.scan(DATA)) == 4
    assert path.read_bytes() != b"not a database"


@needs_hs
def test_cache_off_writes_nothing(tmp_path, monkeypatch, compiles):
    monkeypatch.setenv(diskcache.CACHE_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    Matcher(PATTERNS)
    Matcher(PATTERNS)
    assert len(compiles) == 2 and not any(tmp_path.rglob("*.hsdb"))


@needs_hs
def test_an_invalid_pattern_is_never_served_from_the_cache(cache):
    with pytest.raises(ValueError, match="pattern 1"):
        Matcher([Pattern("ok"), Pattern("(?U)x", regex=True)])
    assert not list(cache.glob("*.hsdb"))
    with pytest.raises(ValueError, match="pattern 1"):
        Matcher([Pattern("ok"), Pattern("(?U)x", regex=True)])


@needs_hs
def test_check_many_is_one_compile_and_none_once_the_set_was_seen_valid(cache, compiles):
    patterns = [Pattern(f"keyword number {i}") for i in range(200)] + PATTERNS
    assert Matcher.check_many(patterns) == [None] * len(patterns)
    assert compiles == [len(patterns)]
    assert Matcher.check_many(patterns) == [None] * len(patterns)
    assert compiles == [len(patterns)]                  # the set's "valid" mark is cached


@needs_hs
def test_check_many_names_each_bad_pattern_as_check_does(cache):
    patterns = ([Pattern(f"keyword number {i}") for i in range(100)]
                + [Pattern("(?U)a+", regex=True), Pattern("a(", regex=True), Pattern(r"\p{Greek}", regex=True)])
    problems = Matcher.check_many(patterns)
    assert problems[:100] == [None] * 100
    assert problems[100:] == [Matcher.check(p) for p in patterns[100:]]
    assert "Hyperscan" in problems[100] and "RE2" in problems[101] and "Hyperscan" in problems[102]


@needs_hs
def test_a_rule_file_is_checked_with_one_compile_and_keeps_file_and_line(tmp_path, cache, compiles):
    body = ["rules:"]
    for i in range(300):
        body += [f"  - id: team.r{i}", f"    keywords: [\"failure number {i}\"]", "    class: retryable_infra",
                 "    action: restart_job"]
    good = tmp_path / "good.yaml"
    good.write_text("\n".join(body) + "\n")
    assert len(load_rules([good], builtin=False)) == 300
    assert compiles == [300]
    body[2] = "    regex: ['(?U)a+']"
    bad = tmp_path / "bad.yaml"
    bad.write_text("\n".join(body) + "\n")
    with pytest.raises(RuleError) as err:
        load_rules([bad], builtin=False)
    (issue,) = err.value.issues
    assert (issue.file, issue.line) == (str(bad), 3) and "Hyperscan" in issue.message
    assert issue.message.startswith("rule 'team.r0': regex '(?U)a+': ")


@needs_hs
def test_the_cache_keeps_the_newest_databases_only(cache, monkeypatch):
    monkeypatch.setattr(diskcache, "CACHE_KEEP", 3)
    for i in range(5):
        Matcher([Pattern(f"keyword {i}")])
    assert len(list(cache.glob("*.hsdb"))) == 3
    monkeypatch.setattr(diskcache, "CACHE_BYTES", 1)
    Matcher([Pattern("the last one")])
    assert len(list(cache.glob("*.hsdb"))) == 1            # over the byte budget: only the newest stays


@needs_hs
def test_the_built_in_packs_are_compiled_once_with_the_engine_and_a_users_file_is_checked_with_its_own(
        tmp_path, cache, compiles):
    """Validated and compiled once (issue 16): with an empty cache the built-in packs load with no
    Hyperscan compile of their own (RE2's side is checked; Hyperscan's is the engine's one database),
    a user's rule file is still checked at load (its problems name their own lines)."""
    from ftwatch.rules.engine import Engine
    user = tmp_path / "mine.yaml"
    user.write_text("rules:\n  - id: team.thing\n    regex: ['thing [0-9]+ broke']\n"
                    "    class: user_code\n    action: fail_job\n", encoding="utf-8")
    rules = load_rules([user])
    assert compiles == [1]                               # the user's file alone
    Engine(rules)
    # then the engine's databases: the scan's (every pattern not gated, the gated ones' literals)
    # and the gated patterns' own (ftwatch.rules.gates: the built-in packs hold some)
    assert len(compiles) == 3 and compiles[1] + compiles[2] > len(rules)


def _user_rules(tmp_path, name: str, regexes: list[str]):
    """A user's rule file of one rule per regex (rule ``team.r<k>``, its regex on line 4 + 5k)."""
    body = ["rules:"]
    for k, regex in enumerate(regexes):
        body += [f"  - id: team.r{k}", "    class: user_code", f"    regex: ['{regex}']", "    action: fail_job",
                 "    severity: error"]
    path = tmp_path / name
    path.write_text("\n".join(body) + "\n", encoding="utf-8")
    return path


@needs_hs
def test_the_engine_of_run_watch_and_replay_compiles_a_users_rule_file_once(tmp_path, cache, compiles):
    """Validated and compiled once (issue 16): ``build_engine`` leaves a user's file's Hyperscan
    check to its own compile (with an empty cache, one build in all: the scan's database and the
    gated patterns', ``ftwatch.rules.gates``); the next start compiles nothing; a later
    ``load_rules`` with the check (``ftwatch check``) does not take the unchecked file from the
    cache: it compiles the file's set."""
    from ftwatch.config.model import Config
    from ftwatch.pipeline.build import build_engine
    user = _user_rules(tmp_path, "mine.yaml", ["thing [0-9]+ broke", "other (thing|part) failed"])
    config = Config.model_validate({"rules": {"files": [str(user)]}})
    engine = build_engine(config)
    assert len(compiles) == 2 and sum(compiles) > len(engine.matcher.patterns)
    assert [f.rule_id for f in engine.feed(Origin("w"), b"x\nthing 7 broke\n", 0.0)] == ["team.r0"]
    build_engine(config)
    assert len(compiles) == 2                               # rules and databases from the cache
    load_rules([user], builtin=False)
    assert compiles[2:] == [2]                              # the file's own check, as before


@needs_hs
def test_a_pattern_hyperscan_rejects_in_a_users_file_is_named_at_its_own_line_by_the_engine(tmp_path, cache):
    """The engine's compile finds it; the rule files loaded again with the check name it (and any
    other) at its own line, as ``load_rules`` and ``ftwatch check`` do. ``(?U)``: RE2's, not
    Hyperscan's."""
    from ftwatch.config.model import Config
    from ftwatch.pipeline.build import build_engine
    bad = _user_rules(tmp_path, "bad.yaml", ["fine [0-9]+", "(?U)ba+d", "also (?U)wro+ng"])
    with pytest.raises(RuleError) as checked:
        load_rules([bad])
    with pytest.raises(RuleError) as built:
        build_engine(Config.model_validate({"rules": {"files": [str(bad)]}}))
    assert built.value.issues == checked.value.issues
    assert [(i.file, i.line) for i in built.value.issues] == [(str(bad), 9), (str(bad), 14)]
    assert all("Hyperscan" in i.message for i in built.value.issues)


@needs_hs
def test_a_pattern_the_engines_compile_rejects_names_its_rules_file_and_line():
    """A built-in pack's pattern is checked on Hyperscan only by the engine's compile: one it
    rejects is a RuleError at its rule's file:line (``(?U)``: RE2's, not Hyperscan's)."""
    from ftwatch.events import Action, FailureClass
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.model import Rule
    rules = [Rule("t.fine", (Pattern("fine"),), FailureClass.INFO, Action.NOTIFY, location="packs/a.yaml:3"),
             Rule("t.bad", (Pattern(r"(?U)ba+d", regex=True),), FailureClass.USER_CODE, Action.FAIL_JOB,
                  location="packs/a.yaml:9")]
    with pytest.raises(RuleError) as info:
        Engine(rules)
    [issue] = info.value.issues
    assert (issue.file, issue.line) == ("packs/a.yaml", 9) and "t.bad" in issue.message and "Hyperscan" in issue.message
