"""``ftwatch explain``: why a decision was taken, in plain text (SPEC D6).

It prints the decision (action, target, time), the root-cause line with its rule, failure
class and the rule's source, the evidence from each instance (the findings of the same job,
attempt and run, grouped by instance, each marked root cause / fallout / finding), the restart
budgets left, and the policy clause.

The store is duck-typed (``decision``, ``last_decision``, ``findings_for`` as in
``ftwatch.pipeline.sinks.sqlite.SqliteStore``), so that alerting does not import the pipeline.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable, Iterator, Protocol

from ftwatch.config.limits import MAX_FINDINGS_PER_JOB
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.rootcause import analyse

MAX_FINDINGS_PER_INSTANCE = 10
MAX_EVIDENCE_LINES = 8
#: the newest findings of the attempt read for what was fallout: as many as the incident desk keeps
#: as one job's evidence (``limits.max_findings_per_job``' default). A long attempt's store holds
#: far more (a retryable warning printed on every step: 200,000 took 21 s and 650 MB to read)
MAX_ANALYSED = MAX_FINDINGS_PER_JOB


class DecisionStore(Protocol):
    """What explain reads (SqliteStore has it)."""

    def decision(self, decision_id_or_prefix: str) -> dict[str, Any] | None: ...

    def last_decision(self) -> dict[str, Any] | None: ...

    def findings_for(self, job: str, attempt: int | None = None) -> list[dict[str, Any]]: ...
    # A decision with a ``run`` (the store's run of a job id used again) is asked with ``run=`` too:
    # findings_for(job, attempt, run=R) -> that run's only (None: of no known run).

    # Optional, used where present (SqliteStore has it): the same in time order, read as used.
    # def iter_findings(self, job: str, attempt: int | None = None) -> Iterator[dict[str, Any]]: ...


def explain(store: DecisionStore, decision_id: str | None = None) -> str:
    """The explanation of one decision.

    Args:
        store: the SQLite store (or anything with its readers).
        decision_id: a decision id or a unique prefix; None for the latest decision.

    Returns:
        Plain text, lines separated by ``\\n``, ending with a newline.

    Raises:
        LookupError: no decision has that id (or none is recorded at all).
        ValueError: the prefix matches several decisions.
    """
    if decision_id is None:
        d = store.last_decision()
        if d is None:
            raise LookupError("no decision is recorded yet")
    else:
        d = store.decision(decision_id)
        if d is None:
            raise LookupError(f"no decision has the id {decision_id!r}")
    root = d.get("root_cause")
    reader = getattr(store, "iter_findings", None)
    run = {"run": d["run"]} if "run" in d else {}      # its own run's (a job id used again: sinks.runs)
    stored = (reader(d["job"], d.get("attempt"), **run) if reader is not None else
              sorted(store.findings_for(d["job"], d.get("attempt"), **run), key=_order))
    extra: dict[tuple, dict[str, Any]] = {}          # the decision's own, once each
    for f in ([root] if root else []) + list(d.get("findings") or []):
        extra.setdefault(_key(f), f)
    out: list[str] = []
    out += _decision_block(d)
    out += _root_block(root)
    out += _evidence_block(d, _Evidence(stored, extra, _key(root) if root else None), root)
    out += _acted_block(store, d)
    out += ["", "Budgets",
            f"  restarts used  {d.get('restarts_used', 0)}",
            f"  restarts left  {d.get('restarts_left', 0)}",
            "", "Policy clause",
            f"  {d.get('policy_clause') or '(none recorded)'}"]
    return "\n".join(out) + "\n"


def describe_target(target: dict[str, Any]) -> str:
    """``the whole job`` or ``instance worker-1, rank 1, node n1`` (known parts only)."""
    parts = []
    if target.get("instance") is not None:
        parts.append(f"instance {target['instance']}")
    if target.get("rank") is not None:
        parts.append(f"rank {target['rank']}")
    if target.get("node") is not None:
        parts.append(f"node {target['node']}")
    return ", ".join(parts) if parts else "the whole job"


def _acted_block(store: Any, d: dict[str, Any]) -> list[str]:
    """What the actuator did with the decision (``watch``'s ``actuator`` events naming its id:
    status, and each Kubernetes API call's line); nothing when the store has no events."""
    events = getattr(store, "events", None)
    if events is None:
        return []
    mine = [e for e in events(d["job"]) if e.get("kind") == "actuator"
            and (e.get("detail") or {}).get("decision_id") == d["decision_id"]]
    if not mine:
        return []
    out = ["", "Action taken"]
    for e in mine:
        detail = e["detail"]
        out.append(f"  {detail.get('action', '?')}: {detail.get('status', '?')}")
        calls = detail.get("calls") or []
        lines = calls or [x for x in str(detail.get("output") or "").splitlines() if x.strip()][:MAX_EVIDENCE_LINES]
        if calls and detail.get("output") and not str(detail["output"]).startswith(calls[0]):
            out.append(f"    {str(detail['output']).splitlines()[0]}")    # why (held, failed)
        out += [f"    {line}" for line in lines]
    return out


def _decision_block(d: dict[str, Any]) -> list[str]:
    return [f"Decision {d['decision_id']}: {d['action']}",
            f"  time     {d['time']}",
            f"  job      {d['job']}, attempt {d.get('attempt', 0)}",
            f"  target   {describe_target(d.get('target') or {})}"]


def _root_block(root: dict[str, Any] | None) -> list[str]:
    if not root:
        return ["", "Root cause", "  none recorded (the decision was not caused by a finding)"]
    where = _where(root)
    return ["", "Root cause",
            f"  line           {root.get('line', '')}",
            f"  where          {where}, at {root.get('time', '?')}",
            f"  rule           {root.get('rule_id', '?')} ({root.get('kind', '?')}, "
            f"severity {root.get('severity', '?')})",
            f"  failure class  {root.get('failure_class', '?')}",
            f"  rule source    {root.get('source') or '(not given)'}"]


class _Evidence:
    """The attempt's findings, each once, in time order, read in one pass over the store (a long
    attempt's holds hundreds of thousands): per instance its count, whether the root cause is
    among them and its first :data:`MAX_FINDINGS_PER_INSTANCE` (those shown); and the newest
    :data:`MAX_ANALYSED`, read for what was fallout (:func:`_fallout_keys`); a finding older than
    those counts as no fallout. The decision's own findings (``extra``, by key) join where they
    fall, unless the store holds them too: a stored one goes first among those of its time. A
    finding is counted once however often it is stored.

    Args:
        stored: the stored findings in time order (:func:`_order`).
        extra: the decision's root cause and findings by :func:`_key`.
        root_key: the root cause's key, or None.
    """

    def __init__(self, stored: Iterable[dict[str, Any]], extra: dict[tuple, dict[str, Any]],
                 root_key: tuple | None):
        self.root_key = root_key
        self.total = 0
        self.counts: dict[str, int] = {}
        self.has_root: set[str] = set()
        shown: dict[str, list[tuple]] = {}           # instance -> (order, 0 stored / 1 extra, n, finding)
        newest: deque[tuple] = deque(maxlen=MAX_ANALYSED)
        matched: set[tuple] = set()
        moment, here = None, set()                   # the keys stored at one ISO time (ms): a finding
        for n, f in enumerate(stored):               # stored twice is read twice, next to each other
            key = _key(f)
            if key[2] != moment:
                moment, here = key[2], set()
            elif key in here:
                continue
            here.add(key)
            if key in extra:
                matched.add(key)
            entry = (_order(f), 0, n, f)
            self._count(f, key, entry, shown, stored=True)
            newest.append(entry)
        added = [(_order(f), 1, n, f) for n, (key, f) in enumerate(extra.items()) if key not in matched]
        for entry in added:
            self._count(entry[3], _key(entry[3]), entry, shown, stored=False)
            shown[str(entry[3].get("instance"))].sort(key=lambda e: e[:3])     # where it falls
        for name, entries in shown.items():
            del entries[MAX_FINDINGS_PER_INSTANCE:]
        self.shown = {name: [e[3] for e in entries] for name, entries in shown.items()}
        analysed = [e[3] for e in sorted([*newest, *added], key=lambda e: e[:3])[-MAX_ANALYSED:]]
        self.fallout = _fallout_keys(analysed)
        self.analysed: dict[str, int] = {}           # instance -> how many of its findings were read
        self.real: set[str] = set()                  # instances with one of those that is no fallout
        for f in analysed:
            name = str(f.get("instance"))
            self.analysed[name] = self.analysed.get(name, 0) + 1
            if _key(f) not in self.fallout:
                self.real.add(name)

    def _count(self, f: dict[str, Any], key: tuple, entry: tuple, shown: dict[str, list[tuple]],
               stored: bool) -> None:
        self.total += 1
        name = str(f.get("instance"))
        self.counts[name] = self.counts.get(name, 0) + 1
        if self.root_key and key == self.root_key:
            self.has_root.add(name)
        mine = shown.setdefault(name, [])
        if not stored or len(mine) < MAX_FINDINGS_PER_INSTANCE:   # (stored ones come in time order)
            mine.append(entry)

    def verdict(self, name: str) -> str:
        """``root cause here``, ``fallout only`` or ``errors, not fallout``."""
        if name in self.has_root:
            return "root cause here"
        real = name in self.real or self.counts[name] > self.analysed.get(name, 0)
        return "errors, not fallout" if real else "fallout only"


def _evidence_block(d: dict[str, Any], ev: _Evidence, root: dict[str, Any] | None) -> list[str]:
    out = ["", f"Evidence by instance (job {d['job']}, attempt {d.get('attempt', 0)})"]
    if not ev.total:
        return out + ["  no findings recorded"]
    if ev.total > MAX_ANALYSED:
        out.append(f"  (fallout read from the newest {MAX_ANALYSED:,} of {ev.total:,} findings, as many as "
                   "the incident desk keeps)")
    root_key = ev.root_key
    groups = ev.shown

    def order(name: str) -> tuple[int, int, str]:
        rank = groups[name][0].get("rank")
        return (rank is None, rank if rank is not None else 0, name)

    for name in sorted(groups, key=order):
        items = groups[name]
        first = items[0]
        count = ev.counts[name]
        out.append(f"  {name}  rank {_dash(first.get('rank'))}  node {_dash(first.get('node'))}"
                   f"  ({count} finding{'s' if count != 1 else ''}; {ev.verdict(name)})")
        for f in items:
            mark = ("root cause" if _key(f) == root_key else
                    "fallout" if _key(f) in ev.fallout else "finding")
            out.append(f"    [{mark}] {f.get('time', '?')}  {f.get('rule_id', '?')} "
                       f"({f.get('failure_class', '?')})")
            out.append(f"      {f.get('line', '')}")
            evidence = [e for e in f.get("evidence") or [] if e != f.get("line")]
            for e in evidence[:MAX_EVIDENCE_LINES]:
                out.append(f"      | {e}")
            if len(evidence) > MAX_EVIDENCE_LINES:
                out.append(f"      | ... {len(evidence) - MAX_EVIDENCE_LINES} more lines")
        if count > MAX_FINDINGS_PER_INSTANCE:
            out.append(f"    ... {count - MAX_FINDINGS_PER_INSTANCE} more findings")
    return out


def _order(f: dict[str, Any]) -> tuple:
    """A finding's place in time (``epoch``, then its ISO time, then its sequence number)."""
    return (f.get("epoch") or 0.0, str(f.get("time")), f.get("seq") or 0)


def _fallout_keys(findings: list[dict[str, Any]]) -> set[tuple]:
    """Keys of the stored findings the policy counts as fallout (``rules.rootcause.analyse``, R7).

    Besides the fallout class this includes a survivor's generic exit when its log shows only
    fallout, so explain marks exactly what the decision ignored.
    """
    rebuilt: list[tuple[Finding, tuple]] = []
    for d in findings:
        try:
            origin = Origin(str(d.get("instance")), d.get("rank"), str(d.get("job")), str(d.get("node")),
                            str(d.get("stream") or ""))
            f = Finding(d["rule_id"], d["kind"], FailureClass(d["failure_class"]), Action.parse(d["action"]),
                        Severity.parse(d["severity"]), origin, d.get("line", ""),
                        float(d.get("epoch") or 0.0), int(d.get("seq") or 0), (), dict(d.get("fields") or {}))
        except (KeyError, ValueError, TypeError):
            continue
        rebuilt.append((f, _key(d)))
    real = set(map(id, analyse([f for f, _ in rebuilt]).real))
    return {key for f, key in rebuilt
            if id(f) not in real and (f.failure_class is FailureClass.FALLOUT or f.severity >= Severity.ERROR)}


def _key(f: dict[str, Any] | None) -> tuple:
    if not f:
        return ()
    return (f.get("rule_id"), f.get("instance"), str(f.get("time")), f.get("seq"), f.get("line"))


def _where(f: dict[str, Any]) -> str:
    parts = [f"instance {f.get('instance', '?')}", f"rank {_dash(f.get('rank'))}",
             f"node {_dash(f.get('node'))}"]
    if f.get("stream"):
        parts.append(str(f["stream"]))
    return ", ".join(parts)


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)
