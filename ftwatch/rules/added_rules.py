"""Rules added to a compiled engine at run time (R2: ``set_retryable_errors``; ``watch``: a job's,
removed again when the job ends), matched by a small database beside the compiled one.

Compiling the whole set again for a few added keywords took 2.1-2.5 s of CPU at 1,082 rules and
4.5-4.8 s at 10,000 (2-vCPU EPYC, ``make bench``), in the loop that reads every job's output,
past the SDK's 4 s answer limit. Here only the added rules' patterns are compiled (milliseconds), into a
:class:`LayeredMatcher` that answers as one matcher of both sets, their ids after the compiled
database's. ``Engine.add_rules`` and ``Engine.remove_rules`` call :func:`layer`; split from
``ftwatch.rules.engine`` (this module's one job: the added rules), as ``batches`` is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ftwatch.rules.judge import Judge
from ftwatch.rules.matcher import Matcher, PatternError
from ftwatch.rules.model import Pattern, Rule

if TYPE_CHECKING:
    from ftwatch.rules.engine import Engine


class LayeredMatcher:
    """A compiled :class:`~ftwatch.rules.matcher.Matcher` and a small one for patterns added at
    run time, answering as one Matcher of ``base.patterns + extra`` would: the added patterns'
    ids follow the base's. Each scan costs one more scan of the chunk, by the small database;
    its database is not stored in the disk cache (it would push out the large sets' a start
    reads).

    Args:
        base: the compiled base patterns (its backend is used for ``extra``).
        extra: the added patterns (not empty).

    Raises:
        PatternError: an added pattern is invalid (its index counted among ``extra``).
    """

    def __init__(self, base: Matcher, extra: Sequence[Pattern]):
        self.base = base
        self.extra = Matcher(extra, backend=base.backend, cache=False)
        self.backend: str = base.backend
        self.patterns: tuple[Pattern, ...] = base.patterns + self.extra.patterns
        self._first = len(base.patterns)

    def scan(self, data: bytes) -> list[tuple[int, int]]:
        """As ``Matcher.scan`` over both: sorted, unique ``(line_start, pattern_id)`` pairs."""
        hits = self.base.scan(data)
        more = self.extra.scan(data)
        if not more:
            return hits
        first = self._first
        return sorted(hits + [(start, first + pid) for start, pid in more])

    def match_text(self, text: str) -> frozenset[int]:
        """As ``Matcher.match_text`` over both."""
        more = self.extra.match_text(text)
        found = self.base.match_text(text)
        return found | {self._first + pid for pid in more} if more else found


def layer(engine: Engine, rules: list[Rule]) -> None:
    """Make ``rules`` the engine's: the compiled ones (its first ``_compiled``, unchanged, in its
    database) and rules added at run time after them, whose patterns are compiled alone, their
    ids after the database's (none: the database alone again).

    Raises:
        RuleError: an added rule's pattern the matcher refuses, at the rule's ``file:line``.
    """
    from ftwatch.rules.engine import _rule_error      # the engine's own wording of a refusal
    base = engine.matcher.base if isinstance(engine.matcher, LayeredMatcher) else engine.matcher
    owner = engine._owner[:len(base.patterns)]
    extra: list[Pattern] = []
    for index in range(engine._compiled, len(rules)):
        for pattern in rules[index].patterns:
            extra.append(pattern)
            owner.append(index)
    try:
        matcher = LayeredMatcher(base, extra) if extra else base
    except PatternError as exc:
        raise _rule_error(PatternError(len(base.patterns) + exc.index, exc.reason), rules, owner) from None
    engine.rules, engine._owner, engine.matcher = rules, owner, matcher
    engine.judge = Judge(rules, owner, matcher, engine.tables, engine.exceptions)
