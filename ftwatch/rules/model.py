"""The rule model: what a keyword rule is, once loaded (stage 3, the rule engine's input).

Rule files (YAML, see ``ftwatch/rules/packs/``) are turned into these by ``ftwatch.rules.loader``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Container, Protocol

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity


@dataclass(frozen=True, slots=True)
class Pattern:
    """One thing to look for in a line.

    Attributes:
        text: a literal keyword, or a regex in the subset shared by RE2 and Hyperscan
            (no backreferences, no lookaround).
        regex: True when ``text`` is a regex.
        caseless: match ignoring case.
    """

    text: str
    regex: bool = False
    caseless: bool = False


@dataclass(frozen=True, slots=True)
class Rule:
    """A keyword rule: any of its patterns in a line (that passes ``predicate``) makes a finding.

    Attributes:
        id: unique, dotted (``nccl.unhandled_system_error``).
        patterns: any one matching is a hit.
        failure_class, action, severity: the verdict.
        priority: when several rules hit one record (a traceback), the highest priority
            wins, then the most drastic action. Generic rules (any Python exception) sit
            low; fallout rules (a peer closed the connection) sit high, so a traceback
            that ends in a gloo "Connection closed by peer" is fallout, not user code.
        examples / counterexamples: lines that must / must not hit (``ftwatch test-rules``).
        source: where the string and its classification come from.
        description: what it means, in one line.
        tags: free labels (component: nccl, gloo, cuda ...).
        location: ``file:line`` of the rule's definition.
        when: the rule's condition as written (SPEC P4), or "".
        predicate: the compiled condition (``ftwatch.rules.conditions``), called only on lines
            that hit one of ``patterns``: ``predicate(raw_line, origin) -> bool``; None: every
            hit counts.
    """

    id: str
    patterns: tuple[Pattern, ...]
    failure_class: FailureClass
    action: Action
    severity: Severity = Severity.ERROR
    priority: int = 0
    examples: tuple[str, ...] = ()
    counterexamples: tuple[str, ...] = ()
    source: str = ""
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    location: str = ""
    when: str = ""
    predicate: Callable[[bytes, Origin], bool] | None = field(default=None, compare=False, repr=False)


class StepTap(Protocol):
    """The chunks the engine hands over to find step lines in (H3; ``ftwatch.rules.stragglers.StepTracker``).

    The tap finds its lines itself, in one pass over each chunk; its patterns are not in the
    engine's database.
    """

    def find(self, data: bytes) -> list:
        """The step lines of ``data`` (complete lines), sorted by offset, to hand back to
        ``take_chunk`` (``Engine.scan_many`` finds a whole batch's at once)."""

    def take_chunk(self, origin: Origin | Callable[[int], Origin], data: bytes, end: int, skip: Container[int],
                   time_at: Callable[[int], float], next_seq: Callable[[], int],
                   hits: list | None = None) -> list[Finding]:
        """The step lines of ``data`` before offset ``end`` whose starts are not in ``skip`` (lines
        blocks took); ``time_at(start)``: a line's time (epoch s), ``next_seq()``: a finding's
        sequence number; ``hits``: ``find(data)`` when known; ``origin``: the chunk's stream, or
        the stream of the line at an offset (a chunk of many streams). Returns the findings (stragglers),
        at the latest by the chunk's end."""
