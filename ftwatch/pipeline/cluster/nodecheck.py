"""``ftwatch run --network-check`` across the agents of a multi-node job (SPEC H2, seed 003).

Before generation 0's world is published the leader runs the node check over its members with
:func:`ftwatch.health.nodecheck.check` (round 1 neighbours, round 2 fastest with slowest, the
verdicts), each pair of nodes being one real process group across the two machines: every node's
check processes (``ftwatch.health.agent``, one per worker, gloo on CPU, NCCL on GPUs) do the
timed GEMM, the allgather and the all-reduce. Faulty nodes (and stragglers with
``--exclude-straggler``) are left out within MIN:MAX (:func:`ftwatch.health.nodes.outcome`);
their agents read why in ``left/<node>`` ("The node is down.", "The node is a straggler and
exits.") and end.

Keys: ``check/seq`` (requests so far), ``check/req/<k>`` (the group of request k, or ``end``),
``check/port/<k>`` (the group's first node: its address and a free port),
``check/res/<k>/<node>`` (a node's result: seconds or None, error, whether a process died).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from ftwatch.config.health import NodeCheckConfig
from ftwatch.health.agents import Agent
from ftwatch.health.nodecheck import DOWN, STRAGGLER_EXITS, Group, check
from ftwatch.health.nodes import node_result, outcome, report_lines
from ftwatch.pipeline.cluster.rendezvous import free_port
from ftwatch.pipeline.cluster.store import KV

LOOK_SECONDS = 0.05     # between looks at the store while a pair runs


class ClusterCheck:
    """This node's part of the node check, and the leader's conduct of it.

    Args:
        kv: the job's store.
        node: this node's id.
        addr: this node's address (a group's first node hosts its process group).
        config: sizes, timeout, the straggler factor (``health.nodecheck``).
        exclude_straggler: leave stragglers out too (``--exclude-straggler``).
        say: a line for the person watching.
        nproc: check processes on this node (one per worker).
        min_nodes: the fewest nodes the job may start with (MIN of ``--nnodes``).
    """

    def __init__(self, kv: KV, node: int, addr: str, config: NodeCheckConfig | None, exclude_straggler: bool,
                 say: Callable[[str], None] = print, nproc: int = 1, min_nodes: int = 1):
        self.kv, self.node, self.addr = kv, node, addr
        self.config = config or NodeCheckConfig()
        self.exclude_straggler, self.say, self.nproc, self.min_nodes = exclude_straggler, say, nproc, min_nodes
        self._next = 1                     # the next request this node has not looked at
        self._agents: list[Agent] = []

    # -- every node -----------------------------------------------------------------------------

    def serve(self, node: int) -> None:
        """Answer the requests published so far that name this node (called while waiting for
        generation 0's world)."""
        while self.kv.has(f"check/req/{self._next}"):
            req = self.kv.read(f"check/req/{self._next}")
            k, self._next = self._next, self._next + 1
            if req.get("end"):
                self.close()
            elif node in req["group"]:
                self._answer(k, tuple(req["group"]))

    def close(self) -> None:
        for agent in self._agents:
            agent.close()
        self._agents.clear()

    # -- the leader -------------------------------------------------------------------------------

    def vet(self, members: list[int]) -> tuple[list[int], dict[int, str]]:
        """Check ``members``; returns (the nodes kept, {node left out: why})."""
        self.say(f"ftwatch: cluster: node check of nodes {members}")
        try:
            rounds, found, notes = check(members, self._run_group, self.config.straggler_factor)
        finally:
            k = self.kv.count("check/seq")
            self.kv.put(f"check/req/{k}", {"end": True})
        for line in report_lines(rounds, found, notes, self.exclude_straggler):
            self.say(f"ftwatch: {line}")
        result = outcome(found, self.min_nodes, self.exclude_straggler)
        if not result.can_start:            # too few would be left: leave out the faulty only
            result = outcome(found, self.min_nodes, False)
        left = {v.node: STRAGGLER_EXITS if v.status == "straggler" else f"{DOWN} ({v.status}: {v.message})"
                for v in found if v.node in result.excluded}
        return [n for n in members if n not in left], left

    def _run_group(self, group: Group) -> dict[int, tuple[float | None, str, bool]]:
        k = self.kv.count("check/seq")
        self.kv.put(f"check/req/{k}", {"group": list(group)})
        if self.node in group:
            self._answer(k, group)
        deadline = time.monotonic() + self.config.timeout + 30
        out: dict[int, tuple[float | None, str, bool]] = {}
        while len(out) < len(group):
            for n in group:
                res = self.kv.read(f"check/res/{k}/{n}") if n not in out else None
                if res is not None:
                    out[n] = (res[0], res[1], bool(res[2]))
            if len(out) < len(group):
                if time.monotonic() > deadline:
                    for n in group:
                        out.setdefault(n, (None, "its agent did not answer the node check", True))
                    break
                time.sleep(LOOK_SECONDS)
        return out

    # -- internals -------------------------------------------------------------------------------

    def _answer(self, k: int, group: Group) -> None:
        """Run this node's check processes in request ``k``'s group; publish its result."""
        if self._next <= k:
            self._next = k + 1             # the leader answers its own part inline
        where = self._where(k, group)
        while len(self._agents) < self.nproc:
            self._agents.append(Agent(self.node, sys.executable))
        cfg, j = self.config, group.index(self.node)
        world = len(group) * self.nproc
        for i, agent in enumerate(self._agents):
            agent.send({"op": "collective", "rank": j * self.nproc + i, "world": world, "addr": where["addr"],
                        "port": where["port"], "timeout": cfg.timeout, "gemm": cfg.gemm_size,
                        "gemm_iters": cfg.gemm_iters, "bytes": cfg.allreduce_bytes, "iters": 2})
        deadline = time.monotonic() + cfg.timeout + 15
        answers = [agent.receive(deadline) for agent in self._agents]
        self.kv.put(f"check/res/{k}/{self.node}", list(node_result(answers)))

    def _where(self, k: int, group: Group) -> Any:
        if group[0] == self.node:
            self.kv.put(f"check/port/{k}", {"addr": self.addr, "port": free_port(self.addr)})
        while (where := self.kv.read(f"check/port/{k}")) is None:
            time.sleep(LOOK_SECONDS)
        return where
