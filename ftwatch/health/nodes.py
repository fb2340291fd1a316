"""The node check on this machine: each node is a worker group of agents (``ftwatch.health.agent``).

:class:`LocalNodes` runs :func:`ftwatch.health.nodecheck.check` with real torch process groups:
a pair of nodes is one group of ``2 x nproc_per_node`` ranks (gloo on CPU, NCCL on GPUs) doing
the timed GEMM, the allgather and the all-reduce. ``report`` turns the verdicts into log lines,
a :class:`~ftwatch.health.ftlog.CheckResult` per node, and the elastic outcome (``--nnodes
MIN:MAX``): how many nodes may start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ftwatch.config.health import NodeCheckConfig
from ftwatch.events import Action, FailureClass
from ftwatch.health.agents import Agent, run_group
from ftwatch.health.ftlog import CheckResult
from ftwatch.health.nodecheck import STRAGGLER_EXITS, Group, NodeVerdict, RoundResult, check


class LocalNodes:
    """``nnodes`` worker groups of ``nproc_per_node`` agents each, on this machine.

    Args:
        nnodes: how many nodes (worker groups) to check.
        nproc_per_node: agents per node.
        config: sizes, timeout and the straggler factor.
        python: the agents' interpreter (None: this one).
    """

    def __init__(self, nnodes: int, nproc_per_node: int, config: NodeCheckConfig, python: str | None = None):
        import sys
        self.config = config
        self.agents = {n: [Agent(n, python or sys.executable) for _ in range(nproc_per_node)]
                       for n in range(nnodes)}

    def run(self, group: Group) -> dict[int, tuple[float | None, str, bool]]:
        """One collective check of ``group``'s nodes: {node: (seconds or None, error, whether one of
        its check processes died: the agents' ``down``)}."""
        members = [(n, a) for n in group for a in self.agents[n]]
        cfg = self.config
        answers = run_group([a for _, a in members], {"gemm": cfg.gemm_size, "gemm_iters": cfg.gemm_iters,
                                                       "bytes": cfg.allreduce_bytes, "iters": 2}, cfg.timeout)
        return {node: node_result([ans for (n, _), ans in zip(members, answers) if n == node]) for node in group}

    def check(self) -> tuple[list[RoundResult], list[NodeVerdict], list[str]]:
        """Both rounds and the verdicts (``ftwatch.health.nodecheck.check``); agents closed after."""
        try:
            return check(sorted(self.agents), self.run, self.config.straggler_factor)
        finally:
            for agents in self.agents.values():
                for agent in agents:
                    agent.close()


def node_result(answers: Sequence[dict]) -> tuple[float | None, str, bool]:
    """One node's result of a collective check from its agents' answers: (its time, the slowest
    agent's GEMM + allgather seconds, or None; the error; whether one of its processes died)."""
    bad = [a for a in answers if not a.get("ok") or not a.get("allreduce_ok")]
    if bad:
        dead = [a for a in bad if a.get("down")]
        return None, (dead or bad)[0].get("error", "wrong all-reduce result"), bool(dead)
    return max(a["gemm_s"] + a["allgather_s"] for a in answers), "", False


@dataclass(frozen=True)
class Outcome:
    """What the check means for the start: ``usable`` nodes, ``excluded`` ones, and whether at
    least ``min_nodes`` are usable (``can_start``)."""

    usable: tuple[int, ...]
    excluded: tuple[int, ...]
    can_start: bool


def outcome(found: Sequence[NodeVerdict], min_nodes: int, exclude_straggler: bool) -> Outcome:
    """Faulty and suspect nodes are not usable; stragglers only when ``exclude_straggler``."""
    bad = {"faulty", "suspect"} | ({"straggler"} if exclude_straggler else set())
    usable = tuple(v.node for v in found if v.status not in bad)
    excluded = tuple(v.node for v in found if v.status in bad)
    return Outcome(usable, excluded, len(usable) >= min_nodes)


def report_lines(rounds: Sequence[RoundResult], found: Sequence[NodeVerdict], notes: Sequence[str],
                 exclude_straggler: bool, name: str = "node") -> list[str]:
    """Human-readable lines: each round's groups and times, each node's verdict, the notes."""
    lines = []
    for r in rounds:
        parts = []
        for g in r.groups:
            own = r.by_group.get(g, r.times)          # the group's own times, not a node's best of the round
            times = ", ".join(f"{n}: {'FAILED' if own.get(n) is None else f'{own[n]:.3f}s'}" for n in g)
            parts.append(f"({times})")
        lines.append(f"Node Check round {r.number}: {' '.join(parts)}")
    for v in found:
        text = v.message
        if v.status == "straggler" and exclude_straggler:
            text = f"{STRAGGLER_EXITS} ({v.message})"
        lines.append(f"Node Check {name} {v.node}: {v.status}: {text}")
    lines += [f"Node Check note: {n}" for n in notes]
    return lines


def results_of(found: Sequence[NodeVerdict], exclude_straggler: bool, lines: Sequence[str]) -> list[CheckResult]:
    """One ``nodecheck`` CheckResult for the whole check (its lines), plus one per bad node (a
    finding each: faulty -> isolate the node; straggler -> notify, or isolate when excluded)."""
    out = [CheckResult("nodecheck", "ok", tuple(lines), fields={"verdicts": [v.__dict__ for v in found]})]
    for v in found:
        if v.status == "faulty":
            out.append(CheckResult("nodecheck", "fail", (f"node {v.node}: {v.message}",),
                                   failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                                   fields={"node": v.node}))
        elif v.status in ("straggler", "suspect_straggler"):
            exits = exclude_straggler and v.status == "straggler"
            out.append(CheckResult("nodecheck", "warn", (f"node {v.node}: {STRAGGLER_EXITS if exits else 'slow'}: "
                                                         f"{v.message}",),
                                   failure_class=FailureClass.STRAGGLER,
                                   action=Action.ISOLATE_NODE if exits else Action.NOTIFY,
                                   fields={"node": v.node, "slowdown": v.slowdown}))
        elif v.status == "suspect":
            out.append(CheckResult("nodecheck", "fail", (f"node {v.node}: Failed: {v.message}",),
                                   failure_class=FailureClass.RETRYABLE_INFRA, action=Action.NOTIFY,
                                   fields={"node": v.node}))
    return out
