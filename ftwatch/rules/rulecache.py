"""One rule file's validated rules, cached on disk by the file's content (issue 16: fast start).

Loading 10,000 rules from YAML costs ~1.3 s of CPU (the YAML parse with line numbers, every
check, an RE2 compile of every pattern) and leaves ~40 MiB of the parse's garbage in the
process (freed, but not given back to the system). A file that loaded without a single issue
is stored here, as plain tuples (``marshal``), and the next load of the same content builds its
``Rule`` objects straight from them: ~50 ms and only the rules' own memory.

The key (``key``) hashes the file's text with everything else its validity depends on: this
format's version, the source of the modules that parse and check rules (``CODE``), and the
pattern engines it was checked on (``Matcher.engines``: with or without Hyperscan, its version;
RE2 alone for a file whose Hyperscan side an engine's compile checks). So an edited
rule file, another ftwatch, or another Hyperscan is another key, and the file is loaded and
checked in full again; a file with any issue is never stored, so its problems are reported
with file:line on every load. Names are not in the key: a rule's ``location`` is rebuilt from
the name it is loaded under and its line. ``when:`` conditions are kept parsed (their AST as
tuples: a warm start neither parses nor imports pyparsing) and compiled again from that (a
predicate is code); one that no longer compiles (the fault tables changed) makes the entry a miss. Stored with ``ftwatch.rules.diskcache`` (suffix ``rules``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import marshal
from pathlib import Path
from typing import Sequence

from ftwatch.events import Action, FailureClass, Severity
from ftwatch.rules import diskcache
from ftwatch.parsers.grammars.conditions import ConditionSyntaxError, from_tuple, parse_condition, to_tuple
from ftwatch.rules.conditions import ConditionError, compile_parsed
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern, Rule

FORMAT = 2
"""The stored tuples' layout (``_encode``); bump it when that changes (2: a ``when:``'s AST)."""

CODE: tuple[str, ...] = (
    "ftwatch.events", "ftwatch.config.yamlsource", "ftwatch.parsers.grammars.conditions",
    "ftwatch.rules.loader", "ftwatch.rules.model", "ftwatch.rules.patterns", "ftwatch.rules.matcher",
    "ftwatch.rules.conditions", "ftwatch.rules.rulecache",
)
"""The modules whose source decides what a rule file loads as (schema, checks, the model)."""


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """The hash of the source of ``CODE`` ("" when one cannot be read: then nothing is cached)."""
    digest = hashlib.sha256()
    for name in CODE:
        try:
            digest.update(Path(importlib.import_module(name).__file__).read_bytes())
        except (OSError, TypeError, ImportError):
            return ""
    return digest.hexdigest()


def key(text: str, hyperscan: bool = True) -> str | None:
    """The cache key of a rule file's text, loaded with its patterns checked on Hyperscan
    (``hyperscan``) or on RE2 only (``ftwatch.rules.loader.rules_from_text``'s), or None when
    caching is off or impossible. The two are two keys: a file that loaded without an issue
    unchecked may still hold a pattern Hyperscan rejects."""
    code = _code_digest()
    if not code or diskcache.cache_root() is None:
        return None
    checked = Matcher.engines() if hyperscan else "re2"
    digest = hashlib.sha256(f"ftwatch-rules-{FORMAT} {code} {checked}\n".encode())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def load(cache_key: str | None, name: str) -> list[Rule] | None:
    """The rules stored under ``cache_key``, located in ``name``, or None (a miss: not stored,
    unreadable, damaged, or a ``when:`` that no longer compiles)."""
    if cache_key is None:
        return None
    data = diskcache.read("rules", cache_key, "rules")
    if data is None:
        return None
    try:
        version, rows = marshal.loads(data)
        if version != FORMAT:
            return None
        return [_decode(row, name) for row in rows]
    except (ValueError, EOFError, TypeError, KeyError, IndexError, ConditionError):
        return None


def store(cache_key: str | None, rules: Sequence[Rule]) -> None:
    """Stores one file's rules (all valid: the file loaded without an issue). Never raises."""
    if cache_key is None:
        return
    try:
        data = marshal.dumps((FORMAT, [_encode(rule) for rule in rules]))
    except (ValueError, TypeError, ConditionSyntaxError):
        return
    diskcache.store("rules", cache_key, "rules", data)


def _encode(rule: Rule) -> tuple:
    """A rule as plain values (``_decode`` reads them back; its line, not its file)."""
    line = int(rule.location.rsplit(":", 1)[1])
    return (rule.id, tuple((p.text, p.regex, p.caseless) for p in rule.patterns), rule.failure_class.value,
            rule.action.name, rule.severity.name, rule.priority, rule.examples, rule.counterexamples,
            rule.source, rule.description, rule.tags, line, rule.when,
            to_tuple(parse_condition(rule.when)) if rule.when else None)


def _decode(row: tuple, name: str) -> Rule:
    """The Rule of an ``_encode``d row, in file ``name`` (raises on a damaged row)."""
    (rule_id, patterns, failure_class, action, severity, priority, examples, counterexamples,
     source, description, tags, line, when, ast) = row
    patterns = tuple(Pattern(text, regex=regex, caseless=caseless) for text, regex, caseless in patterns)
    predicate = None
    if when:    # every pattern of a rule carries the rule's caseless (the loader's, the prefilter's)
        predicate = compile_parsed(when, from_tuple(ast), patterns[0].caseless if patterns else False).predicate
    return Rule(id=rule_id, patterns=patterns, failure_class=FailureClass(failure_class), action=Action[action],
                severity=Severity[severity], priority=priority, examples=examples,
                counterexamples=counterexamples, source=source, description=description, tags=tags,
                location=f"{name}:{line}", when=when, predicate=predicate)
