"""The exception tree.

::

    FtwatchError
     +-- ConfigError          bad config / rule / table / template; carries every Issue found
     |    +-- RuleError       a rule file problem (file:line)
     |    +-- TemplateError   an alert template that does not compile or render
     +-- SourceError          a source could not start or broke (restart that source)
     +-- NotifyError          a receiver did not take an alert (``retryable`` says whether to retry)
     +-- SinkError            a sink did not take a batch (``retryable``)

A parser never raises into the loop: bad lines are counted, not fatal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem found while loading: where it is and what is wrong.

    Attributes:
        file: the file's path (or ``<argv>`` for command-line flags).
        line: 1-based line number, or 0 when unknown.
        message: what is wrong, in words a user can act on.
    """

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


class FtwatchError(Exception):
    """Base of every error ftwatch raises on purpose."""


class ConfigError(FtwatchError):
    """Config, rules, tables or templates are invalid. ``issues`` holds every problem found."""

    def __init__(self, issues: list[Issue] | Issue | str):
        if isinstance(issues, str):
            issues = [Issue("<config>", 0, issues)]
        elif isinstance(issues, Issue):
            issues = [issues]
        self.issues: list[Issue] = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class RuleError(ConfigError):
    """A rule file is invalid (file:line in each issue)."""


class TemplateError(ConfigError):
    """An alert template does not compile or render."""


class SourceError(FtwatchError):
    """A source could not start or broke."""


class NotifyError(FtwatchError):
    """A receiver did not accept a notification.

    Attributes:
        retryable: True when sending again may succeed (timeouts, 5xx, 429).
    """

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class SinkError(FtwatchError):
    """A sink did not accept a batch (``retryable`` as for NotifyError)."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable
