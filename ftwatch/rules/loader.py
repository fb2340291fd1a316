"""Keyword rule files (YAML) -> ``Rule`` objects (SPEC R1, R2, T1; DESIGN "House rules").

A rule file is a mapping with one key, ``rules:``, holding a list of rules; the schema is in
``ftwatch/rules/packs/README.md`` and at the top of every built-in pack. The built-in packs
(``ftwatch/rules/packs/*.yaml``) are read with ``importlib.resources``.

Loading never stops at the first problem: every problem in every file (YAML syntax, duplicate
keys, unknown keys, bad values, duplicate rule ids across files, patterns that the matcher
cannot compile) becomes an ``Issue(file, line, message)`` and one ``RuleError`` carrying all of
them is raised at the end. A caller that already runs with rules keeps them when a reload raises
(SPEC Q1: a half-written rule file leaves the old rules in force).

``load_rules`` serves a file whose content loaded without an issue before from
``ftwatch.rules.rulecache`` (keyed by that content and this code: an edited file is read and
checked in full again), which makes a start with 10,000 unchanged rules ~50 ms instead of ~1.3 s.
"""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from ftwatch.errors import Issue, RuleError
from ftwatch.events import Action, FailureClass, Severity
from ftwatch.rules import rulecache
from ftwatch.rules.conditions import ConditionError, compile_condition
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern, Rule
from ftwatch.config.yamlsource import LineDict, LineList, LineLoader, parse_yaml, read_yaml_text

__all__ = ["LineDict", "LineList", "LineLoader", "parse_yaml", "RULE_KEYS", "TOP_KEYS", "builtin_pack_files",
           "load_rules", "rules_from_text", "rules_from_keywords"]

RULE_KEYS: frozenset[str] = frozenset({
    "id", "keywords", "regex", "caseless", "class", "action", "severity", "priority", "tags",
    "source", "classified_by", "description", "examples", "counterexamples",
    "source_class", "source_action", "source_regex", "notes", "when",
})
"""Keys a rule may have; the last four only document where a built-in rule departs from its source."""

TOP_KEYS: frozenset[str] = frozenset({"rules"})
ID_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$")
SEVERITIES = ("info", "warning", "error", "critical")
RETRYABLE_KEYWORD_PRIORITY = 15
_STR_KEYS = ("source", "classified_by", "description", "source_class", "source_action",
             "source_regex", "notes")
_LIST_KEYS = ("keywords", "regex", "tags", "examples", "counterexamples")


def builtin_pack_files() -> list[Any]:
    """The built-in packs (``importlib.resources`` Traversables), sorted by name."""
    folder = importlib.resources.files("ftwatch.rules").joinpath("packs")
    return sorted((f for f in folder.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out.extend(sorted(q for q in path.iterdir() if q.suffix in (".yaml", ".yml")))
        else:
            out.append(path)
    return out


def load_rules(paths: Sequence[str | Path] = (), builtin: bool = True, *, hyperscan: bool = True) -> list[Rule]:
    """Loads keyword rules: the built-in packs (unless ``builtin=False``), then each file in ``paths``.

    Args:
        paths: rule files, or folders whose ``*.yaml``/``*.yml`` files are read in name order.
        builtin: include ``ftwatch/rules/packs/*.yaml``.
        hyperscan: check each file's patterns on Hyperscan here (``rules_from_text``: one compile
            of the file's set; the built-in packs never are). False where the caller compiles the
            rules into an engine's database next (``pipeline.build.build_engine``): that compile
            checks them, and a user's file is not compiled twice (a 10,000-rule file: ~2.3 s of a
            ~11 s start with an empty cache, issue 16: "validated and compiled once"). The caller
            then loads again with the check when the engine rejects a pattern, for issues at the
            pattern's own line.

    Returns:
        The rules in file order; each ``location`` is ``file:line`` of the rule's ``- id:`` item.

    Raises:
        RuleError: with one Issue per problem found in any file (all files are read first).
    """
    issues: list[Issue] = []
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    sources: list[tuple[str, str, bool]] = []      # (name, text, a built-in pack)
    if builtin:
        for f in builtin_pack_files():
            sources.append((str(f), f.read_text(encoding="utf-8"), True))
    for path in _expand(paths):
        try:
            sources.append((str(path), read_yaml_text(path), False))
        except (OSError, UnicodeDecodeError) as exc:
            issues.append(Issue(str(path), 0, f"cannot read rule file: {exc}"))
    for name, text, packed in sources:
        for rule in _file_rules(text, name, issues, hyperscan and not packed):
            if rule.id in seen:
                line = int(rule.location.rsplit(":", 1)[1])
                issues.append(Issue(name, line, f"duplicate rule id {rule.id!r} (first at {seen[rule.id]})"))
                continue
            seen[rule.id] = rule.location
            rules.append(rule)
    if issues:
        order = {name: i for i, (name, _, _) in enumerate(sources)}
        issues.sort(key=lambda i: (order.get(i.file, -1), i.line))
        raise RuleError(issues)
    return rules


def _file_rules(text: str, name: str, issues: list[Issue], hyperscan: bool = True) -> list[Rule]:
    """``rules_from_text``, served from ``ftwatch.rules.rulecache`` when this content loaded
    without an issue before (and stored there when it does now). ``hyperscan``: as
    ``rules_from_text``'s (False: its patterns checked on RE2 only). A load without the check
    takes an entry stored with it too; one with the check only such an entry."""
    cache_key = rulecache.key(text, hyperscan)
    cached = rulecache.load(cache_key, name)
    if cached is None and not hyperscan:
        cached = rulecache.load(rulecache.key(text, True), name)
    if cached is not None:
        return cached
    found: list[Issue] = []
    rules = rules_from_text(text, name, found, hyperscan=hyperscan)
    if found:
        issues.extend(found)
    else:
        rulecache.store(cache_key, rules)
    return rules


def rules_from_text(text: str, name: str, issues: list[Issue], *, hyperscan: bool = True) -> list[Rule]:
    """The valid rules of one rule file; every problem found is appended to ``issues``.

    Args:
        text: the file's content.
        name: the file name for issues and locations.
        issues: where problems go (the caller decides when to raise).
        hyperscan: check the patterns on Hyperscan too (one compile of the file's set). False
            for the built-in packs (``load_rules``): the engine compiles every pattern into its
            one database anyway, and names the rule of any it rejects (``Engine``); the packs'
            compile is what every test's engine does. A user's file is checked here, so its
            problems name their own lines, unless the caller builds an engine next
            (``load_rules``' ``hyperscan``). (With an empty cache the packs' own check cost
            ~1.7 s of a ~3.6 s start, issue 16: "validated and compiled once".)
    """
    data, found = parse_yaml(text, name)
    issues.extend(found)
    if data is None:
        if not found:
            issues.append(Issue(name, 1, "empty rule file: expected a mapping with a 'rules:' list"))
        return []
    if not isinstance(data, LineDict):
        issues.append(Issue(name, 1, "a rule file must be a mapping with a 'rules:' list"))
        return []
    for key in data:
        if key not in TOP_KEYS:
            issues.append(Issue(name, data.line_of(key), f"unknown key {key!r} (expected 'rules')"))
    items = data.get("rules")
    if "rules" not in data:
        issues.append(Issue(name, data.line, "missing 'rules:' list"))
        return []
    if items is None:
        return []
    if not isinstance(items, LineList):
        issues.append(Issue(name, data.line_of("rules"), "'rules' must be a list of rules"))
        return []
    out: list[Rule] = []
    ids_here: dict[str, int] = {}
    checks: list[tuple[Pattern, Issue, int]] = []   # (pattern, its issue if bad, its rule's index in out)
    for index, item in enumerate(items):
        line = items.line_of(index)
        if not isinstance(item, LineDict):
            issues.append(Issue(name, line, "a rule must be a mapping (id, keywords/regex, class, action ...)"))
            continue
        mine: list[tuple[Pattern, Issue]] = []
        rule = _build_rule(item, name, issues, mine)
        if rule is None or rule.id in ids_here:
            checks.extend((pattern, issue, -1) for pattern, issue in mine)   # reported, nothing to drop
            if rule is not None:
                issues.append(Issue(name, item.line_of("id"),
                                    f"duplicate rule id {rule.id!r} (first at line {ids_here[rule.id]})"))
            continue
        ids_here[rule.id] = item.line_of("id")
        checks.extend((pattern, issue, len(out)) for pattern, issue in mine)
        out.append(rule)
    # Every pattern of the file checked at once: one Hyperscan compile, not one per pattern.
    dropped: set[int] = set()
    for (pattern, issue, k), problem in zip(checks, Matcher.check_many([c[0] for c in checks], hyperscan)):
        if problem:
            issues.append(Issue(issue.file, issue.line, f"{issue.message}{problem}"))
            dropped.add(k)
    return [rule for k, rule in enumerate(out) if k not in dropped]


def _build_rule(item: LineDict, name: str, issues: list[Issue],
                checks: list[tuple[Pattern, Issue]]) -> Rule | None:
    """One rule from its mapping, or None (with issues appended) when anything is wrong.

    Its keyword and regex patterns are not checked here: each goes to ``checks`` with the issue
    (message without the reason) that it makes if ``Matcher.check_many`` finds it bad.
    """
    before = len(issues)

    def bad(key: str, message: str) -> None:
        issues.append(Issue(name, item.line_of(key), message))

    rule_id = item.get("id")
    label = f"rule {rule_id!r}: " if isinstance(rule_id, str) else ""
    for key in item:
        if key not in RULE_KEYS:
            bad(key, f"{label}unknown key {key!r}; a rule takes {', '.join(sorted(RULE_KEYS))}")
    if rule_id is None:
        bad("id", "rule has no 'id'")
    elif not isinstance(rule_id, str) or not ID_RE.match(rule_id):
        bad("id", f"bad id {rule_id!r}: use dotted names of letters, digits, '_' and '-' (nccl.timeout)")

    lists = {key: _str_list(item, key, name, issues, label) for key in _LIST_KEYS}
    caseless = item.get("caseless", False)
    if not isinstance(caseless, bool):
        bad("caseless", f"{label}'caseless' must be true or false, not {caseless!r}")
        caseless = False
    patterns: list[Pattern] = []
    for key, is_regex in (("keywords", False), ("regex", True)):
        values = item.get(key)
        for i, text in enumerate(lists[key]):
            line = values.line_of(i) if isinstance(values, LineList) else item.line_of(key)
            pattern = Pattern(text, regex=is_regex, caseless=caseless)
            if not text.strip():
                issues.append(Issue(name, line, f"{label}{key} {text!r}: empty pattern"))
            else:
                checks.append((pattern, Issue(name, line, f"{label}{key} {text!r}: ")))
                patterns.append(pattern)
    when, predicate = _condition(item, caseless, patterns, label, bad, name, checks)
    if "keywords" not in item and "regex" not in item and "when" not in item:
        bad("id", f"{label}no patterns: give 'keywords', 'regex' and/or 'when'")
    elif not patterns and len(issues) == before:
        bad("keywords" if "keywords" in item else "regex", f"{label}no patterns: the lists are empty")

    failure_class = _enum(item, "class", name, issues, label, [c.value for c in FailureClass],
                          FailureClass)
    action = _enum(item, "action", name, issues, label, [a.label for a in Action],
                   lambda v: Action[v.upper()])
    severity = Severity.ERROR
    if "severity" in item:
        severity = _enum(item, "severity", name, issues, label, list(SEVERITIES),
                         lambda v: Severity[v.upper()])
    priority = item.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        bad("priority", f"{label}'priority' must be an integer, not {priority!r}")
    texts = {}
    for key in _STR_KEYS:
        value = item.get(key, "")
        if not isinstance(value, str):
            bad(key, f"{label}{key!r} must be a string, not {type(value).__name__}")
            value = ""
        texts[key] = value
    if len(issues) > before:
        return None
    source = texts["source"]
    if texts["classified_by"]:
        source = f"{source} ; classified by: {texts['classified_by']}" if source else texts["classified_by"]
    return Rule(
        id=rule_id, patterns=tuple(patterns), failure_class=failure_class, action=action,
        severity=severity, priority=priority, examples=tuple(lists["examples"]),
        counterexamples=tuple(lists["counterexamples"]), source=source,
        description=texts["description"], tags=tuple(lists["tags"]),
        location=f"{name}:{item.line}", when=when, predicate=predicate,
    )


def _condition(item: LineDict, caseless: bool, patterns: list[Pattern], label: str, bad, name: str,
               checks: list[tuple[Pattern, Issue]]):
    """The rule's ``when:`` (SPEC P4) compiled: (text, predicate), both empty when absent.

    Without ``keywords``/``regex`` the condition's positive terms become the rule's patterns
    (appended to ``patterns``, and to ``checks`` with the issue each makes if the file's pattern
    check finds it bad: ``compile_condition`` checks a term on RE2 only); a condition with none
    is an issue (it would run on every line).
    """
    if "when" not in item:
        return "", None
    text = item["when"]
    if not isinstance(text, str):
        bad("when", f"{label}'when' must be a string (a condition), not {type(text).__name__}")
        return "", None
    try:
        condition = compile_condition(text, caseless)
    except ConditionError as exc:
        bad("when", f"{label}when: {exc}")
        return "", None
    if "keywords" not in item and "regex" not in item:
        if condition.prefilter is None:
            bad("when", f"{label}when: the condition has no positive keyword or regex term (only fields, "
                        f"levels or 'not' terms), so it would have to run on every line; add 'keywords:' or "
                        f"'regex:', or a keyword/regex term outside 'not'")
            return "", None
        patterns.extend(condition.prefilter)
        line = item.line_of("when")
        checks.extend((p, Issue(name, line, f"{label}when: {'regex' if p.regex else 'keyword'} {p.text!r}: "))
                      for p in condition.prefilter)       # on Hyperscan too: they join its database
    return text, condition.predicate


def _str_list(item: LineDict, key: str, name: str, issues: list[Issue], label: str) -> list[str]:
    """The list of strings under ``key`` ([] when absent); a wrong shape is an issue."""
    if key not in item or item[key] is None:
        return []
    values = item[key]
    if not isinstance(values, LineList):
        issues.append(Issue(name, item.line_of(key),
                            f"{label}{key!r} must be a list of strings (write [\"...\"]), "
                            f"not {type(values).__name__}"))
        return []
    out = []
    for i, value in enumerate(values):
        if not isinstance(value, str):
            issues.append(Issue(name, values.line_of(i),
                                f"{label}{key}[{i}] must be a string, not {value!r} (quote it)"))
        else:
            out.append(value)
    return out


def _enum(item: LineDict, key: str, name: str, issues: list[Issue], label: str,
          allowed: list[str], convert) -> Any:
    """The value under ``key`` converted, or None with an issue when missing or not in ``allowed``."""
    value = item.get(key)
    if value is None:
        issues.append(Issue(name, item.line_of(key) if key in item else item.line,
                            f"{label}missing {key!r} (one of {'|'.join(allowed)})"))
        return None
    if not isinstance(value, str) or value not in allowed:
        issues.append(Issue(name, item.line_of(key),
                            f"{label}bad {key} {value!r}; expected one of {'|'.join(allowed)}"))
        return None
    return convert(value)


def rules_from_keywords(keywords: Sequence[str], id_prefix: str = "custom.retryable",
                        source: str = "retryable_errors (AIMaster set_retryable_errors)") -> list[Rule]:
    """Rules for user-declared retryable error strings (SPEC R2; AIMaster ``set_retryable_errors``).

    Each keyword is a literal (substring) rule: class ``retryable_infra``, action ``restart_job``,
    severity error, priority 15 (above the generic and user-error rules, below hardware, OOM and
    fallout rules). Duplicates are dropped; ids are ``<id_prefix>.<slug of the keyword>``.

    Args:
        keywords: the strings, as the user gave them.
        id_prefix: a dotted prefix for the ids.
        source: what ``Rule.source`` says.

    Raises:
        RuleError: an empty keyword, a non-string, or one the matcher cannot compile
            (``Issue("<retryable_errors>", n, ...)``, n = 1-based position).
    """
    issues: list[Issue] = []
    rules: list[Rule] = []
    used: set[str] = set()
    seen: set[str] = set()
    for n, keyword in enumerate(keywords, start=1):
        if not isinstance(keyword, str) or not keyword.strip():
            issues.append(Issue("<retryable_errors>", n, f"keyword {keyword!r} must be a non-empty string"))
            continue
        problem = Matcher.check(Pattern(keyword))
        if problem:
            issues.append(Issue("<retryable_errors>", n, f"keyword {keyword!r}: {problem}"))
            continue
        if keyword in seen:
            continue
        seen.add(keyword)
        slug = re.sub(r"[^a-z0-9]+", "_", keyword.lower()).strip("_")[:48] or "keyword"
        rule_id, k = f"{id_prefix}.{slug}", 2
        while rule_id in used:
            rule_id, k = f"{id_prefix}.{slug}_{k}", k + 1
        used.add(rule_id)
        rules.append(Rule(
            id=rule_id, patterns=(Pattern(keyword),), failure_class=FailureClass.RETRYABLE_INFRA,
            action=Action.RESTART_JOB, severity=Severity.ERROR, priority=RETRYABLE_KEYWORD_PRIORITY,
            examples=(keyword,), source=source, description=f"user-declared retryable error {keyword!r}",
            tags=("custom", "retryable"), location=f"<retryable_errors>:{n}",
        ))
    if issues:
        raise RuleError(issues)
    return rules
