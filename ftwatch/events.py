"""The data that flows between the stages (sources -> parsers -> rules -> policy -> actuator/alerting/sinks).

This module is the bottom of the dependency graph: it imports no stage package.
All types are frozen dataclasses with slots. Times are float seconds since the
Unix epoch (``time``) unless a name says ``mono`` (monotonic seconds).

Vocabulary (SPEC.md): a *job* is one training run, an *instance* one worker process
or pod (it has a *rank*), a *node* a machine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum, IntEnum
from typing import Any, Mapping


class Action(IntEnum):
    """What a decision does, in escalation order (SPEC vocabulary).

    ``ISOLATE_NODE`` is always followed by a restart elsewhere. The order matters to
    the policy ("the most drastic recommendation wins" is a policy clause, see
    ``ftwatch.policy.policy``), not to the enum itself.
    """

    NONE = 0
    NOTIFY = 1
    RESTART_INSTANCE = 2
    RESTART_IN_PLACE = 3
    RESTART_JOB = 4
    ISOLATE_NODE = 5
    FAIL_JOB = 6

    @property
    def label(self) -> str:
        """The wire name: ``none``, ``notify``, ``restart_instance`` ... ``fail_job``."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Action":
        """Parse a wire name or a fault-table action.

        The fault tables (shared/data/fault-tables/README.md) use
        ``ignore | restart_process_in_place | restart_job | isolate_node_and_restart | fail_job``;
        those map to NONE, RESTART_IN_PLACE, RESTART_JOB, ISOLATE_NODE, FAIL_JOB.

        Raises:
            ValueError: for an unknown name.
        """
        key = text.strip().lower()
        key = _ACTION_ALIASES.get(key, key)
        try:
            return cls[key.upper()]
        except KeyError:
            raise ValueError(f"unknown action {text!r}; expected one of "
                             f"{', '.join(a.label for a in cls)}") from None


_ACTION_ALIASES = {
    "ignore": "none",
    "restart_process_in_place": "restart_in_place",
    "isolate_node_and_restart": "isolate_node",
    "fail": "fail_job",
}


class FailureClass(str, Enum):
    """The failure class of a finding (SPEC vocabulary)."""

    RETRYABLE_INFRA = "retryable_infra"
    HARDWARE_NODE = "hardware_node"
    USER_CODE = "user_code"
    OOM = "oom"
    HANG = "hang"
    STRAGGLER = "straggler"
    FALLOUT = "fallout"
    INFO = "info"

    @property
    def retryable(self) -> bool:
        """True for the classes ExitCodeAndErrorMsg restarts on (SPEC D2: infra, hardware, hang)."""
        return self in (FailureClass.RETRYABLE_INFRA, FailureClass.HARDWARE_NODE, FailureClass.HANG)


class Severity(IntEnum):
    """How bad a finding is; ``ERROR`` and above can be a root cause."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    CRITICAL = 3

    @classmethod
    def parse(cls, text: str) -> "Severity":
        """Parse ``info|warning|warn|error|critical`` (case-insensitive). Raises ValueError."""
        key = text.strip().upper()
        key = {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(key, key)
        try:
            return cls[key]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}") from None


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a line came from: the identity labels plus the stream.

    Attributes:
        instance: the worker's name, e.g. ``worker-3`` (a pod name at scale).
        rank: the global rank, when known at the source.
        job: the job id.
        node: the machine's host name.
        stream: ``stdout``, ``stderr``, a file path, or a forward tag.
        source: the source kind (``process``, ``file``, ``replay`` ...).
        labels: the pod's Kubernetes labels as sorted ``(name, value)`` pairs (shipped lines of
            a pod; ``ftwatch.pipeline.sources.identity``), else empty. Not part of equality or hash:
            the same instance is the same origin whatever its labels.

    Its hash (of the fields equality compares) is made once, at construction, and again when
    unpickled (issue 16: an Origin keys the hot path's per-stream maps many times per chunk).
    """

    instance: str
    rank: int | None = None
    job: str = "local"
    node: str = "localhost"
    stream: str = "stdout"
    source: str = "process"
    labels: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # An Origin keys the per-stream dicts of the hot path many times per chunk (issue 16):
        # its hash, of the fields equality compares, is computed once, here.
        object.__setattr__(self, "_hash", hash((self.instance, self.rank, self.job, self.node, self.stream,
                                                self.source)))

    def __hash__(self) -> int:
        return self._hash

    def __setstate__(self, state: list) -> None:
        # pickled in another process: str hashes differ there, so the hash is made again
        for name, value in zip(("instance", "rank", "job", "node", "stream", "source", "labels"), state):
            object.__setattr__(self, name, value)
        self.__post_init__()

    @property
    def key(self) -> tuple[str, str]:
        """(job, instance): the key per-instance state is kept under."""
        return (self.job, self.instance)

    def with_rank(self, rank: int | None) -> "Origin":
        """A copy whose rank is ``rank`` (learned from a line's prefix).

        When the source did not know the rank, each rank of the stream becomes its own instance:
        ``rank3`` in a replayed combined log, ``<instance>/rank3`` elsewhere (a pod running
        torchrun with several local workers), so ranks never share per-instance state.
        """
        if rank is None or rank == self.rank:
            return self
        if self.rank is not None:       # the source knew the rank: a prefix only confirms or corrects it
            instance = self.instance
        elif self.source == "replay":   # a combined log: each rank is an instance
            instance = f"rank{rank}"
        else:                           # one stream carrying several ranks (a pod running torchrun)
            instance = f"{self.instance}/rank{rank}"
        return Origin(instance, rank, self.job, self.node, self.stream, self.source, self.labels)


@dataclass(frozen=True, slots=True)
class Record:
    """A parsed log event: one line, or several joined (a traceback).

    Attributes:
        origin: where it came from (rank learned from a prefix is already applied).
        text: the cleaned text (ANSI stripped, rank prefix removed); lines joined by ``\\n``.
        time: epoch seconds, from the line's own timestamp where present, else receive time.
        seq: a sequence number that orders records within one engine.
        fields: extracted fields (``xid``, ``fault_code``, ``pci`` ...).
    """

    origin: Origin
    text: str
    time: float
    seq: int = 0
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        return self.origin.rank


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """A worker process ended.

    Attributes:
        returncode: the exit status when it exited, else None.
        signal: the signal number that killed it, else None.
        stopped_by_us: True when ftwatch itself sent the stop (a survivor of a failure,
            or a restart); such exits are never findings.
    """

    origin: Origin
    pid: int
    returncode: int | None
    signal: int | None
    time: float
    stopped_by_us: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.signal is None


@dataclass(frozen=True, slots=True)
class Tick:
    """The only way time reaches the rules (tests advance a FakeClock; they never sleep)."""

    time: float
    mono: float


#: Finding kinds that are not log lines (an exit, a hang, an instance that exited 0 under ``ftwatch
#: run``): they never explain an exit nor spell out another finding.
NOT_LOG_LINES = frozenset({"exit_code", "hang", "exit_hang", "exit_ok"})


@dataclass(frozen=True, slots=True)
class Finding:
    """What a rule saw: the rule engine's output.

    Attributes:
        rule_id: the rule that fired (``nccl.unhandled_system_error``, ``xid.79``, ``exit.sigkill``).
        kind: ``keyword``, ``fault_code``, ``exit_code``, ``hang``, ``exit_hang`` or ``summary``.
        failure_class, action, severity: the rule's verdict and recommendation.
        origin: the instance it is about.
        line: the one line a person reads first (the root-cause line).
        time: epoch seconds of the evidence; seq orders ties.
        evidence: a few lines around it (a traceback's lines).
        fields: what the rule extracted (``xid``, ``fault_code``, ``exitcode``, ``signal`` ...).
        source: where the rule's fact comes from (a URL, a file at a commit).
    """

    rule_id: str
    kind: str
    failure_class: FailureClass
    action: Action
    severity: Severity
    origin: Origin
    line: str
    time: float
    seq: int = 0
    evidence: tuple[str, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def rank(self) -> int | None:
        return self.origin.rank

    @property
    def fingerprint(self) -> str:
        """Rule id plus instance: what "the same error on one instance" means (SPEC D3)."""
        return f"{self.rule_id}@{self.origin.instance}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (used by sinks and ``explain``)."""
        return {
            "rule_id": self.rule_id,
            "kind": self.kind,
            "failure_class": self.failure_class.value,
            "action": self.action.label,
            "severity": self.severity.name.lower(),
            "job": self.origin.job,
            "instance": self.origin.instance,
            "rank": self.origin.rank,
            "node": self.origin.node,
            "stream": self.origin.stream,
            "line": self.line,
            "time": iso(self.time),
            "seq": self.seq,
            "evidence": list(self.evidence),
            "fields": dict(self.fields),
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class Target:
    """Which job / instance / rank / node a decision acts on (None = the whole job)."""

    job: str
    instance: str | None = None
    rank: int | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The policy's output; the actuator, alerting and the sinks consume it.

    ``to_json`` is the stable contract (README "Decisions"): one JSON object per line.
    """

    time: float
    action: Action
    target: Target
    root_cause: Finding | None
    policy_clause: str
    restarts_used: int
    restarts_left: int
    findings: tuple[Finding, ...] = ()
    attempt: int = 0

    @property
    def decision_id(self) -> str:
        """A stable hash of time, action, target and root-cause rule."""
        rule = self.root_cause.rule_id if self.root_cause else ""
        raw = f"{self.time:.6f}|{self.action.label}|{self.target}|{rule}"
        return hashlib.sha1(raw.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        """The decision as the README's contract shape."""
        rc = self.root_cause
        return {
            "time": iso(self.time),
            "action": self.action.label,
            "target": {"job": self.target.job, "instance": self.target.instance,
                       "rank": self.target.rank, "node": self.target.node},
            "root_cause": None if rc is None else {
                "rule_id": rc.rule_id, "failure_class": rc.failure_class.value,
                "rank": rc.rank, "line": rc.line},
            "policy_clause": self.policy_clause,
            "restarts_used": self.restarts_used,
            "restarts_left": self.restarts_left,
        }


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What became of one notification: alerting (``ftwatch.alerting.notify``) makes it, the
    sinks store it (the SQLite ``alerts`` table, the Elasticsearch ``alerts`` stream).

    Attributes:
        receiver: the receiver's name.
        notification_id: the notification's stable id.
        status: ``delivered``, ``spooled`` (in the spool, will be resent), ``failed`` (a dead
            letter), ``muted``, ``inhibited``, or ``queued`` (in the spool and handed to the
            receiver's delivery worker, whose own result follows; never stored).
        attempts: sends tried in total, including earlier ones for a spooled notification.
        error: the last failure's message ("" when delivered at once).
        decision_id: the id of the decision the alert is about (an alert made from no
            decision: its own id, ``Alert.id``).
        text: the rendered text.
        time: epoch seconds when the result was known.
    """

    receiver: str
    notification_id: str
    status: str
    attempts: int
    error: str = ""
    decision_id: str = ""
    text: str = ""
    time: float = 0.0


def iso(t: float) -> str:
    """Epoch seconds -> ISO-8601 in UTC with milliseconds (``2026-11-21T09:36:03.735+00:00``)."""
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds")


def is_error(f: Finding) -> bool:
    """A real error: severity error or worse and a class other than ``info`` (fallout included)."""
    return f.severity >= Severity.ERROR and f.failure_class is not FailureClass.INFO


def precedes(a: Finding, b: Finding) -> bool:
    """``a`` comes before ``b`` in an incident's (time, seq) order."""
    return (a.time, a.seq) < (b.time, b.seq)
