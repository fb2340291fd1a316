"""Unknown failures as signatures (SPEC T5): the evidence of catch-all decisions, mined with Drain3.

A decision whose root cause explains nothing — a rule tagged ``catch_all`` (``python.uncaught_exception``),
a traceback graded only by a generic exception class (``RuntimeError``, ``OSError``: the catalog's
``decides: message`` rows, ``ftwatch.rules.exceptions``), an exit code the table does not list or
the generic code 1 (``Finding.fields["generic"]``), or no rule at all — leaves its evidence lines here (:meth:`Miner.decision`). Drain3 groups them into
templates across jobs, with the parameters masked (:data:`MASKING`: times, IPs, hex codes, paths,
ranks, sizes, numbers) after the per-line prefixes are cut (:func:`strip_prefix`: torchrun's
``[default3]:``, torch's ``[rank3]:``, glog and ISO timestamps). Each template is a
:class:`Signature`: how often it was seen, first and last seen (epoch s), the jobs, nodes, rule
ids, failure classes and actions of the decisions that printed it, and a few example lines.

State: one JSON file, ``<state-dir>/mining/signatures.json`` (format ``ftwatch-mining`` v1),
written atomically (``ftwatch.policy.statefile``): the Drain3 snapshot (its own
``PersistenceHandler`` hands the bytes over, :class:`SnapshotInMemory`) and the signatures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.persistence_handler import PersistenceHandler
from drain3.template_miner_config import TemplateMinerConfig

from ftwatch.events import Decision
from ftwatch.policy.statefile import read_state, write_state
from ftwatch.rules.exceptions import ExceptionCatalog

FORMAT, VERSION = "ftwatch-mining", 1
CATCH_ALL_TAG = "catch_all"     # a rule tag (rule packs): its findings explain nothing specific
NEW_SIGNATURE_JOBS = 3          # default: a signature seen in this many jobs is news
MAX_EXAMPLES = 5                # raw lines kept per signature
MAX_LINE = 2000                 # characters of a line mined (the rest is cut)

#: (mask name, regex), applied in order: Drain3 masking instructions.
MASKING: tuple[tuple[str, str], ...] = (
    ("TIME", r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"),
    ("TIME", r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b"),
    ("IP", r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?(?![\w.])"),
    ("IP", r"\[[0-9a-fA-F:]*::[0-9a-fA-F:]*\](?::\d+)?"),
    ("HEX", r"\b0x[0-9a-fA-F]+\b"),
    ("HEX", r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b"),
    ("PATH", r"(?<![\w.])(?:[A-Za-z]:)?(?:/[\w.@+\-]+){2,}/?"),
    ("RANK", r"\b(?:[Rr]ank|RANK|local_rank|LOCAL_RANK)[ =:#]?\s*\d+\b"),
    ("SIZE", r"\b\d+(?:\.\d+)?\s?(?:[KMGTP]i?B|bytes|[KMGT])\b"),
    ("NUM", r"(?<![A-Za-z0-9_])[-+]?\d+(?:\.\d+)?(?![A-Za-z0-9_])"),
)

_PREFIX = re.compile(
    r"^(?:\s*(?:\[(?:default|rank)\d+\]: ?|\d{1,5}: |\[\d+,\d+\]<std(?:out|err)>:|"  # torchrun, torch, mpirun
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z(?: std(?:out|err) [FP])? |"  # CRI / docker stamps
    r"\[?[EWIF]\d{3,4} \d\d:\d\d:\d\d\.\d+\s+\d*\s*[\w./\-]+:\d+\]\s?|"      # glog header
    r"\[[EWIF] [\w./\-]+:\d+\]\s?))+")                                      # old glog header
_FRAME = re.compile(r'^(?:Traceback \(most recent call last\):|\s*File ".*", line \d+|\s*\^+\s*$|\s*~+)')


def strip_prefix(line: str) -> str:
    """``line`` without the prefixes every rank and logger puts before the message."""
    return _PREFIX.sub("", line.rstrip("\r\n"), count=1).rstrip()


def worth_mining(text: str) -> bool:
    """False for ``text`` (a line, prefix stripped) that says nothing by itself: blank, a
    traceback's header or frame, the code line under a frame or any other indented line, a
    caret marker."""
    return bool(text.strip()) and not text[0].isspace() and not _FRAME.match(text)


def miner_config() -> TemplateMinerConfig:
    """Drain3's configuration: :data:`MASKING`, similarity 0.5, no periodic snapshots (ftwatch
    saves after each decision)."""
    config = TemplateMinerConfig()
    config.masking_instructions = [MaskingInstruction(p, name) for name, p in MASKING]
    config.drain_sim_th = 0.5
    config.drain_depth = 5
    config.snapshot_interval_minutes = 10 ** 6
    config.parametrize_numeric_tokens = True
    return config


class SnapshotInMemory(PersistenceHandler):
    """Drain3's persistence, kept in memory: :class:`Miner` writes it into its state file."""

    def __init__(self, state: bytes | None = None):
        self.state = state

    def save_state(self, state: bytes) -> None:
        self.state = state

    def load_state(self) -> bytes | None:
        return self.state


@dataclass
class Signature:
    """One template and what is known of the decisions whose evidence printed it.

    Attributes:
        id: Drain3's cluster id (stable within one state dir).
        template: the line with parameters masked (``<NUM>``, ``<PATH>``, ``<*>``...).
        count: lines seen.
        first_seen, last_seen: epoch seconds.
        jobs, nodes: where it was seen.
        rules, classes, actions: root-cause rule id / failure class / action label -> count.
        examples: up to :data:`MAX_EXAMPLES` raw lines, distinct.
    """

    id: int
    template: str
    count: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0
    jobs: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=dict)
    classes: dict[str, int] = field(default_factory=dict)
    actions: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Signature":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def top(self, what: str) -> str:
        """The most frequent of ``rules``, ``classes`` or ``actions`` ("" when none)."""
        counts: dict[str, int] = getattr(self, what)
        return max(sorted(counts), key=counts.__getitem__) if counts else ""


def _bump(counts: dict[str, int], key: str | None) -> None:
    if key:
        counts[key] = counts.get(key, 0) + 1


def is_catch_all(decision: Decision, catch_all: Iterable[str]) -> bool:
    """True when the decision's root cause explains nothing specific (:func:`catch_all_root`)."""
    rc = decision.root_cause
    return rc is None or catch_all_root(rc.rule_id, rc.fields, catch_all)


def catch_all_root(rule_id: str, fields: Mapping[str, Any], catch_all: Iterable[str]) -> bool:
    """True for a root cause (its rule id and fields) that explains nothing specific: an exit
    code the table does not list or the generic code (``fields["generic"]``), a rule in
    ``catch_all``, or a traceback graded only by a generic exception class whose message should
    have decided (``python.exception.RuntimeError``: its catalog row says ``decides: message``,
    and no rule hit the message)."""
    if fields.get("generic") or rule_id in set(catch_all):
        return True
    name = fields.get("exception")
    grade = ExceptionCatalog.load().lookup(str(name)) if name else None
    return grade is not None and not grade.decides_by_class


def worth_lines(evidence: Sequence[str], line: str) -> list[str]:
    """The lines of a root cause worth mining: its evidence (else its line), frames and headers
    dropped."""
    return [x for x in (list(evidence) or [line]) if worth_mining(strip_prefix(x))]


class Miner:
    """Drain3 over the evidence of catch-all decisions, across jobs.

    Args:
        path: the state file (``<state-dir>/mining/signatures.json``), or None to keep nothing.
        catch_all: rule ids whose findings are catch-alls (:func:`catch_all_ids`).
        new_jobs: a signature reaching this many jobs is new (:meth:`decision` returns it once).

    Raises:
        ConfigError: the state file is unreadable or of another format.
    """

    def __init__(self, path: Path | None = None, catch_all: Iterable[str] = (),
                 new_jobs: int = NEW_SIGNATURE_JOBS):
        self.path = Path(path) if path is not None else None
        self.catch_all = frozenset(catch_all)
        self.new_jobs = new_jobs
        data = read_state(self.path, FORMAT, VERSION) if self.path is not None else None
        data = data or {}
        self.snapshot = SnapshotInMemory(data["drain"].encode() if data.get("drain") else None)
        # no persistence without a file: Drain3 snapshots itself on every new template
        self.drain = TemplateMiner(self.snapshot if self.path is not None else None, miner_config())
        self.signatures: dict[int, Signature] = {
            int(k): Signature.from_dict(v) for k, v in data.get("signatures", {}).items()}
        self.announced: set[int] = set(data.get("announced", []))

    @classmethod
    def in_state_dir(cls, state_dir: Path, **kw: Any) -> "Miner":
        """The miner whose state lives under ``state_dir/mining/``."""
        return cls(Path(state_dir) / "mining" / "signatures.json", **kw)

    def add(self, line: str, time: float, job: str, node: str = "", rule: str = "",
            failure_class: str = "", action: str = "") -> Signature | None:
        """Mine one raw line seen at ``time`` (epoch s) in ``job`` on ``node``; the rule id,
        failure class and action label of the decision it belongs to. Returns its signature, or
        None for a line not worth mining."""
        text = strip_prefix(line)[:MAX_LINE]
        if not worth_mining(text):
            return None
        text = text.strip()
        result = self.drain.add_log_message(text)
        cid = int(result["cluster_id"])
        sig = self.signatures.get(cid)
        if sig is None:
            sig = self.signatures[cid] = Signature(cid, result["template_mined"], first_seen=time, last_seen=time)
        sig.template = result["template_mined"]
        sig.count += 1
        sig.first_seen, sig.last_seen = min(sig.first_seen, time), max(sig.last_seen, time)
        if job not in sig.jobs:
            sig.jobs.append(job)
        if node and node not in sig.nodes:
            sig.nodes.append(node)
        _bump(sig.rules, rule)
        _bump(sig.classes, failure_class)
        _bump(sig.actions, action)
        raw = line.rstrip("\r\n")[:MAX_LINE]
        if len(sig.examples) < MAX_EXAMPLES and raw not in sig.examples:
            sig.examples.append(raw)
        return sig

    def decision(self, decision: Decision) -> list[Signature]:
        """Mine a decision's evidence when it is a catch-all (:func:`is_catch_all`); save.
        Returns the signatures that reached ``new_jobs`` jobs with it (each once, ever)."""
        rc = decision.root_cause
        if rc is None or not is_catch_all(decision, self.catch_all):
            return []
        return self._mine(worth_lines(rc.evidence, rc.line), rc.time, decision.target.job, rc.origin.node,
                          rc.rule_id, rc.failure_class.value, decision.action.label)

    def stored(self, row: Mapping[str, Any]) -> list[Signature]:
        """:meth:`decision` for a stored decision (a ``ReportReader.decisions`` row: ``job``,
        ``action``, ``root_cause`` with ``rule_id``, ``fields``, ``evidence``, ``line``, ``epoch``,
        ``node``, ``failure_class``)."""
        rc = row.get("root_cause")
        if not rc or not catch_all_root(rc.get("rule_id", ""), rc.get("fields") or {}, self.catch_all):
            return []
        return self._mine(worth_lines(rc.get("evidence") or [], rc.get("line", "")), float(rc.get("epoch", 0.0)),
                          row["job"], rc.get("node") or "", rc.get("rule_id", ""), rc.get("failure_class", ""),
                          row.get("action", ""))

    def _mine(self, lines: list[str], time: float, job: str, node: str, rule: str, failure_class: str,
              action: str) -> list[Signature]:
        touched = {s.id: s for line in lines
                   if (s := self.add(line, time, job, node, rule, failure_class, action)) is not None}
        new = [s for s in touched.values() if len(s.jobs) >= self.new_jobs and s.id not in self.announced]
        self.announced.update(s.id for s in new)
        if touched:
            self.save()
        return new

    def ranked(self, min_jobs: int = 1) -> list[Signature]:
        """The signatures seen in at least ``min_jobs`` jobs, most jobs first, then most lines."""
        return sorted((s for s in self.signatures.values() if len(s.jobs) >= min_jobs),
                      key=lambda s: (-len(s.jobs), -s.count, s.id))

    def save(self) -> None:
        """Write the state file (nothing when the miner has no path)."""
        if self.path is None:
            return
        self.drain.save_state("ftwatch")    # into self.snapshot
        state = self.snapshot.state or b""
        write_state(self.path, {
            "format": FORMAT, "version": VERSION, "drain": state.decode("ascii"),
            "signatures": {str(k): s.to_dict() for k, s in self.signatures.items()},
            "announced": sorted(self.announced)})


def catch_all_ids(rules: Sequence[Any]) -> frozenset[str]:
    """The ids of the rules tagged :data:`CATCH_ALL_TAG`."""
    return frozenset(r.id for r in rules if CATCH_ALL_TAG in r.tags)
