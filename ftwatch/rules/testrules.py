"""Runs every rule's ``examples`` and ``counterexamples`` (SPEC T2: ``ftwatch test-rules``).

All patterns of all rules go into ONE Matcher, exactly as the engine compiles them, so a rule
is tested with the engine's semantics (raw lines, both backends' common subset) and its ``when:``
condition (SPEC P4) is applied to each line its patterns hit, as the engine does; an example line
is judged with no rank and node ``localhost``. An example must hit its own rule; a counterexample
must not hit it. Other rules hitting the same line are
reported as context (they matter for priorities) but are not failures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ftwatch.events import Origin
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Rule


@dataclass(frozen=True, slots=True)
class RuleTestFailure:
    """One example or counterexample that did not behave.

    Attributes:
        rule_id: the rule under test.
        location: ``file:line`` of the rule.
        line: the example or counterexample text.
        expected: ``"hit"`` (an example) or ``"no hit"`` (a counterexample); ``"compile"`` when
            the rule's patterns do not compile at all.
        message: what happened, in words.
        also_hit: ids of the other rules that hit the line.
    """

    rule_id: str
    location: str
    line: str
    expected: str
    message: str
    also_hit: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.location}: {self.rule_id}: {self.message}: {self.line!r}"


def _owners(rules: Sequence[Rule]) -> tuple[list, list[int]]:
    patterns, owner = [], []
    for index, rule in enumerate(rules):
        for pattern in rule.patterns:
            patterns.append(pattern)
            owner.append(index)
    return patterns, owner


def run_rule_tests(rules: Sequence[Rule], backend: str | None = None) -> list[RuleTestFailure]:
    """Checks every example hits its rule and every counterexample does not.

    Args:
        rules: loaded rules (``ftwatch.rules.loader.load_rules``).
        backend: the matcher backend (``hyperscan``/``re2``); None picks as the engine does.

    Returns:
        The failures, in rule order (empty when all pass). A rule whose patterns do not compile
        gives one ``expected="compile"`` failure and is left out of the shared matcher.
    """
    rules = list(rules)
    failures: list[RuleTestFailure] = []
    patterns, owner = _owners(rules)
    try:
        matcher = Matcher(patterns, backend)
    except ValueError:
        good = []
        for rule in rules:
            try:
                Matcher(rule.patterns, backend)
                good.append(rule)
            except ValueError as exc:
                failures.append(RuleTestFailure(rule.id, rule.location, "", "compile", str(exc)))
        rules = good
        patterns, owner = _owners(rules)
        matcher = Matcher(patterns, backend)

    origin = Origin("test-rules")

    def hits(text: str) -> set[int]:
        """Rules hitting a line of ``text``: a pattern matches and the rule's condition holds."""
        out: set[int] = set()
        for line in text.split("\n"):
            raw = _encode(line)
            for index in {owner[i] for i in matcher.match_text(line)}:
                predicate = rules[index].predicate
                if predicate is None or predicate(raw, origin):
                    out.add(index)
        return out

    for index, rule in enumerate(rules):
        for example in rule.examples:
            got = hits(example)
            if index not in got:
                others = tuple(rules[i].id for i in sorted(got))
                failures.append(RuleTestFailure(rule.id, rule.location, example, "hit",
                                                "example does not hit the rule", others))
        for counter in rule.counterexamples:
            got = hits(counter)
            if index in got:
                others = tuple(rules[i].id for i in sorted(got - {index}))
                failures.append(RuleTestFailure(rule.id, rule.location, counter, "no hit",
                                                "counterexample hits the rule", others))
    return failures


def _encode(line: str) -> bytes:
    """A line as the engine scans it (the matcher's own encoding of text)."""
    try:
        return line.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return line.encode("utf-8", "replace")


def format_report(failures: Sequence[RuleTestFailure], n_rules: int) -> str:
    """A human report: one block per failure, then a summary line.

    Args:
        failures: from ``run_rule_tests``.
        n_rules: how many rules were tested.

    Returns:
        Text ending in ``N rules, M failures`` (``ok`` when there are none).
    """
    lines: list[str] = []
    for f in failures:
        lines.append(f"FAIL {f.location}: {f.rule_id}")
        if f.expected == "compile":
            lines.append(f"    {f.message}")
        else:
            lines.append(f"    {f.message} (expected {f.expected})")
            lines.append(f"    line: {f.line!r}")
        if f.also_hit:
            lines.append(f"    other rules hitting it: {', '.join(f.also_hit)}")
    status = "ok" if not failures else f"{len(failures)} failure{'s' if len(failures) != 1 else ''}"
    lines.append(f"{n_rules} rules tested: {status}")
    return "\n".join(lines)
