"""The leader: one agent decides for the whole job, through the same incident core as a local run.

Election: the key ``leader`` holds ``"<node>:<token>"``; an agent takes it with a compare-and-set
from empty (the first wins), or from the holder's value once the holder's heartbeat is stale
(:class:`Beats`: a counter ``hb/<node>`` that must keep changing, judged on the reader's own
monotonic clock, so clock skew between machines does not matter). A leader that finds the key
no longer its own has been replaced and stops deciding.

Deciding (:meth:`Leader.tend`, called from the leader's run loop): the reports of generation
``g`` (``report/<g>/<node>/<k>``: a node's trigger, its attempt's findings and failed
instances) and the lost nodes (a node of the world whose heartbeat is stale and that is not
``done``: the finding ``cluster.node_lost``) go into the job's :class:`IncidentDesk`, with each
instance renamed ``node<N>/<instance>`` (their ranks are global already); ``settle`` seconds after the
first (at once for a lost node) the desk's verdict is the job's decision, published once
(``decided/<g>`` is claimed first) as ``decision/<g>`` with what every node does:

* ``restart``: every node of the world restarts, lost nodes left out (generation g+1);
* ``exclude``: ``isolate_node``: the root cause's node (``blamed``) leaves (its agent ends), the
  rest restart within MIN:MAX (generation g+1);
* ``fail``: every node stops and ftwatch ends with 1 (also when fewer than MIN would be left,
  unless the job's scheduler requeues the job for the decision: ``Leader.requeues``);
* ``none``: a decision that stops nothing (notify): answered to each report
  (``answer/<g>/<node>/<k>``), the generation goes on.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ftwatch.alerting.spool import decision_from_dict, decision_to_dict, finding_from_dict
from ftwatch.config.cluster import ClusterConfig
from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity
from ftwatch.pipeline.cluster.rendezvous import World
from ftwatch.pipeline.cluster.store import KV
from ftwatch.pipeline.incidents import IncidentDesk

NODE_LOST = "cluster.node_lost"


class Beats:
    """Whose heartbeat counters still move, on this agent's monotonic clock.

    Args:
        kv: the job's store.
        lost_after: seconds a counter may stand still before its node is lost.
    """

    def __init__(self, kv: KV, lost_after: float):
        self.kv, self.lost_after = kv, lost_after
        self._seen: dict[int, tuple[int, float]] = {}

    def stale(self, node: int, mono: float) -> float:
        """Seconds ``node``'s heartbeat has stood still (0 while it moves; its first reading
        starts the count, so a new observer gives every node the full ``lost_after``)."""
        beat = self.kv.count(f"hb/{node}", 0)
        last = self._seen.get(node)
        if last is None or last[0] != beat:
            self._seen[node] = (beat, mono)
            return 0.0
        return mono - last[1]

    def alive(self, node: int, mono: float) -> bool:
        """Whether ``node``'s agent still runs: not done, and its heartbeat moved within ``lost_after``."""
        return not self.kv.has(f"done/{node}") and self.stale(node, mono) <= self.lost_after


def lead(kv: KV, me: str, beats: Beats, mono: float, key: str = "leader") -> bool:
    """Whether ``me`` (``"<node>:<token>"``) holds ``key`` after this look: take it empty, or
    from a holder whose heartbeat is stale (or who is done). ``leader``: the lead; also who
    carries out a generation's decision (``handover.py``)."""
    holder = kv.claim(key, me)
    if holder == me:
        return True
    if beats.alive(int(holder.split(":", 1)[0]), mono):
        return False
    return kv.claim(key, me, expected=holder) == me


def node_lost(node: int, host: str, job: str, seconds: float, now: float) -> Finding:
    """The finding of a node whose agent stopped beating: a hardware/node class, isolate_node."""
    return Finding(NODE_LOST, "node_lost", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, Severity.CRITICAL,
                   Origin(f"node{node}/agent", None, job, host, "cluster", "cluster"),
                   f"node {node} ({host}) lost: its ftwatch agent sent no heartbeat for {seconds:.1f} s",
                   now, fields={"node_rank": node})


class Leader:
    """The job's decisions while this agent leads.

    Args:
        kv: the job's store.
        config: MIN:MAX, ``settle``.
        desk: the job's incident desk (built like the local one, with the job's own budgets).
        token: this agent's ``"<node>:<token>"``, the value of the ``leader`` key it holds.
        job: the job id.
        say: a line for the person watching.
    """

    def __init__(self, kv: KV, config: ClusterConfig, desk: IncidentDesk, token: str, job: str,
                 say: Callable[[str], None] = print):
        self.kv, self.config, self.desk, self.token, self.job, self.say = kv, config, desk, token, job, say
        self.gen = -1
        self._read: dict[int, int] = {}          # node -> reports taken this generation
        self._lost: set[int] = set()
        self._first: float | None = None         # mono of the first report of this generation
        self._waiting: list[tuple[int, int]] = []  # (node, k) reports to answer
        self._node_of: dict[str, int] = {}        # renamed instance -> node
        # whether the job's scheduler carries an action out by requeueing the job (Slurm): the job
        # starts again on a fresh allocation, so fewer than MIN nodes left is no failure
        self.requeues: Callable[[Action], bool] = lambda action: False

    def tend(self, world: World, beats: Beats, now: float, mono: float) -> dict | None:
        """Take the generation's reports and lost nodes; decide when due. Returns the published
        decision record, or None."""
        if world.gen != self.gen:
            self._new_generation(world, now)
        if self.kv.has(f"decision/{world.gen}"):
            return None
        lost_now = []
        for n in world.nodes:
            stale = beats.stale(n, mono)
            if n not in self._lost and stale > self.config.lost_after and not self.kv.has(f"done/{n}"):
                self._lost.add(n)
                host = (self.kv.read(f"host/{n}") or "?")
                lost_now.append(node_lost(n, host, self.job, stale, now))
                self.say(f"ftwatch: cluster: node {n} ({host}) lost (no heartbeat for {stale:.1f} s)")
        if lost_now:
            self.desk.add(lost_now, mono)
        got = self._take_reports(world, mono)
        if (got or lost_now) and self._first is None:
            self._first = mono
        if self._first is None or (not lost_now and mono - self._first < self.config.settle):
            return None
        return self._decide(world, now, mono)

    # -- internals -------------------------------------------------------------------------------

    def _new_generation(self, world: World, now: float) -> None:
        self.gen = world.gen
        self._read.clear()
        self._first = None
        self._waiting.clear()
        self.desk.new_attempt(now, world_size=world.size)

    def _take_reports(self, world: World, mono: float) -> bool:
        got = False
        for n in world.nodes:
            total = self.kv.count(f"reports/{world.gen}/{n}", 0)
            for k in range(self._read.get(n, 0) + 1, total + 1):
                report = self.kv.read(f"report/{world.gen}/{n}/{k}")
                if report is None:          # counted, not yet written: next time
                    break
                self._read[n] = k
                self._waiting.append((n, k))
                self._ingest(world, n, report, mono)
                got = True
        return got

    def _ingest(self, world: World, node: int, report: dict, mono: float) -> None:
        def renamed(f: Finding) -> Finding:        # ranks are global already (the supervisor's origins)
            o = f.origin
            inst = o.instance if o.instance.startswith("node") and "/" in o.instance else f"node{node}/{o.instance}"
            self._node_of[inst] = node
            return dataclasses.replace(f, origin=dataclasses.replace(o, instance=inst))

        findings = [renamed(finding_from_dict(d)) for d in report.get("findings", [])]
        self.desk.failed.update(f"node{node}/{i}" for i in report.get("failed", []))
        # this node's own findings are in its store already (its run loop's desk recorded them)
        self.desk.add(findings, mono, record=str(node) != self.token.split(":", 1)[0])

    def _decide(self, world: World, now: float, mono: float) -> dict | None:
        if self.desk.open is None:
            return None
        decision, _plan = self.desk.verdict(None, now, mono)
        act = decision.action
        lost = set(self._lost)
        if act in (Action.NONE, Action.NOTIFY):
            record = {"kind": "none", "decision": decision_to_dict(decision)}
            for n, k in self._waiting:
                self.kv.put(f"answer/{world.gen}/{n}/{k}", record)
            self._waiting.clear()
            self._first = None
            return record
        out = set(lost)
        kind = "restart"
        blamed = None
        if act is Action.FAIL_JOB:
            kind = "fail"
        elif act is Action.ISOLATE_NODE:
            blamed = self._node_of.get(decision.target.instance or "")
            if blamed is None and decision.root_cause is not None:
                blamed = decision.root_cause.fields.get("node_rank")
            if blamed is not None:
                blamed = int(blamed)
                out.add(blamed)
            kind = "exclude"
        keep = [n for n in world.nodes if n not in out]
        if kind != "fail" and len(keep) < self.config.min_nodes and not self.requeues(act):
            decision = dataclasses.replace(
                decision, action=Action.FAIL_JOB,
                policy_clause=f"{decision.policy_clause}; {len(keep)} node(s) left, fewer than "
                              f"--nnodes={self.config.nnodes} allows")
            kind = "fail"
        record: dict[str, Any] = {"kind": kind, "gen": world.gen, "decision": decision_to_dict(decision),
                                  "out": sorted(out), "next": keep if kind != "fail" else [],
                                  "lost": sorted(lost), "blamed": blamed}
        if self.kv.claim(f"decided/{world.gen}", self.token) != self.token:
            return None                           # another leader decided this generation
        self.kv.put(f"decision/{world.gen}", record)
        if kind != "fail":
            self.kv.put("gen", world.gen + 1)
        self.say(f"ftwatch: cluster: decision {world.gen}: {decision.action.label} -> {kind}"
                 f"{' without node(s) ' + ','.join(map(str, sorted(out))) if out else ''}")
        return record


def job_decision(record: dict) -> Decision:
    """The Decision of a published record (``decision/<g>`` or an answer)."""
    return decision_from_dict(record["decision"])
