"""The evaluation corpus on disk: one case per directory, its ``case.yaml`` schema and its logs.

A corpus is a directory of cases, one sub-directory each (``tests/corpus/README.md``): a
``case.yaml`` (where the failure comes from, what its thread concluded, the expected action and
failure class, and ``held_out`` for a case written after a rule freeze) and the logs, one file per
instance (``rank3.log``) or one combined log, exactly as ``ftwatch replay`` takes them. Loading
checks every case and reports every bad one at once, file:line.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ftwatch.config.yamlsource import dotted, line_index, parse_yaml
from ftwatch.errors import ConfigError, Issue
from ftwatch.events import Action, FailureClass

CASE_FILE = "case.yaml"
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
#: log files named by their launcher without a log suffix: Paddle's ``paddle.distributed.launch``
#: writes local worker N's output to ``<log_dir>/workerlog.N`` (paddle/distributed/utils/launch_utils.py,
#: ``open("%s/workerlog.%d" % (log_dir, idx), "a")``); ``ftwatch replay`` reads any file it is given
LAUNCHER_LOG_NAMES = re.compile(r"workerlog\.\d+")
NONE_CLASS = "none"
CLASSES = tuple(c.value for c in FailureClass) + (NONE_CLASS,)


class Expected(BaseModel):
    """What the thread concluded, as ftwatch should decide it."""

    model_config = ConfigDict(extra="forbid")
    action: str = Field(description="the action the job should get: none, notify, restart_instance, "
                                    "restart_in_place, restart_job, isolate_node or fail_job")
    failure_class: str = Field(description="the root cause's failure class (SPEC vocabulary), or none")
    rule: str | None = Field(None, description="the root-cause rule id, where the case checks it")
    rank: int | None = Field(None, description="the root-cause rank, where the case checks it")


class CaseSpec(BaseModel):
    """One ``case.yaml``."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="the case id; equals its directory name")
    title: str = Field(description="one line: what failed")
    source: str = Field(description="the public thread the case is rebuilt from (URL)")
    software: str = Field(description="pytorch, nccl, deepspeed, megatron, ascend, hang, ...")
    conclusion: str = Field(description="what the thread concluded, in one sentence of our own words")
    expected: Expected = Field(description="the decision ftwatch should take")
    flags: list[str] | None = Field(None, description="AIMaster flags for this case (default DEFAULT_FLAGS)")
    known_miss: str | None = Field(None, description="why ftwatch still decides this case wrongly (kept on purpose); "
                                                     "a note for readers, it gates nothing")
    notes: str | None = Field(None, description="anything else: how the log was rebuilt, what was changed")
    held_out: str | None = Field(None, description="the rule freeze (a date, '2026-11-26', with '.N' for the "
                                                   "day's N-th freeze: '2026-11-26.2') this case was written "
                                                   "after, without changing a rule for it: its accuracy is "
                                                   "reported apart and its decision never shown",
                                                   pattern=r"^\d{4}-\d{2}-\d{2}(\.\d+)?$")

    @field_validator("held_out", mode="before")
    @classmethod
    def _date_as_text(cls, value: Any) -> Any:
        """An unquoted ``held_out: 2026-11-26`` is a YAML date: take it as its ISO text."""
        return value.isoformat() if isinstance(value, datetime.date) else value


@dataclass(frozen=True)
class Case:
    """A case read from disk: its spec, its directory and its log files (sorted)."""

    spec: CaseSpec
    path: Path
    logs: tuple[Path, ...]


def is_log_name(name: str) -> bool:
    """True when a file of a case directory is one of its logs: a log suffix (``LOG_SUFFIXES``) or a
    launcher's own log name (``LAUNCHER_LOG_NAMES``: Paddle's ``workerlog.N``)."""
    return Path(name).suffix in LOG_SUFFIXES or LAUNCHER_LOG_NAMES.fullmatch(name) is not None


def load_case(path: Path) -> Case:
    """Read one case directory.

    Raises:
        ConfigError: ``case.yaml`` is missing, not YAML, or breaks the schema (file:line), an
            action or class is unknown, the id is not the directory's name, or there is no log.
    """
    spec_file = path / CASE_FILE
    name = str(spec_file)
    try:
        text = spec_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Issue(name, 0, f"cannot read: {exc.strerror or exc}")]) from None
    data, issues = parse_yaml(text, name)          # never raises: syntax errors come as issues
    if issues:
        raise ConfigError(issues)
    try:
        spec = CaseSpec.model_validate(data)
    except ValidationError as exc:
        lines = line_index(data)
        raise ConfigError([Issue(name, lines.get(tuple(e["loc"]), lines.get(tuple(e["loc"][:-1]), 0)),
                                 f"{dotted(e['loc'])}: {e['msg']}") for e in exc.errors()]) from None
    problems = []
    try:
        Action.parse(spec.expected.action)
    except (KeyError, ValueError):
        problems.append(f"expected.action: unknown action {spec.expected.action!r}")
    if spec.expected.failure_class not in CLASSES:
        problems.append(f"expected.failure_class: unknown class {spec.expected.failure_class!r} "
                        f"(one of {', '.join(CLASSES)})")
    if spec.id != path.name:
        problems.append(f"id {spec.id!r} is not the directory's name {path.name!r}")
    logs = tuple(sorted(p for p in path.iterdir() if p.is_file() and is_log_name(p.name)))
    if not logs:
        problems.append(f"no log file ({', '.join(LOG_SUFFIXES)}) beside it")
    if problems:
        raise ConfigError([Issue(name, 0, p) for p in problems])
    return Case(spec, path, logs)


def load_corpus(root: Path) -> list[Case]:
    """Every case under ``root`` (sub-directories holding a ``case.yaml``), by name.

    Raises:
        ConfigError: any case is bad; every bad case is reported at once.
    """
    cases, issues = [], []
    for sub in sorted(p for p in Path(root).iterdir() if (p / CASE_FILE).is_file()):
        try:
            cases.append(load_case(sub))
        except ConfigError as exc:
            issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
    if not cases:
        raise ConfigError([Issue(str(root), 0, f"no case (a directory with {CASE_FILE})")])
    return cases
