"""Rendezvous: which nodes make up generation ``g`` of the job, and where their workers meet.

Every generation of the job has a world (torchelastic's "rendezvous round"): the nodes that run
it, in group-rank order, their worker counts and the workers' ``MASTER_ADDR``/``MASTER_PORT``
(the first node's address, a port that node picked free). An agent *arrives* for a generation
(``join/<g>/<node>``: its address, a free port, its worker count); the leader *closes* it
(``world/<g>``) when

* generation 0: ``MAX`` nodes arrived, or at least ``MIN`` did and ``last_call`` seconds passed
  since the MIN-th (torchrun's c10d: ``last_call_timeout``);
* a later generation: every node the decision kept (``expected``) arrived, or the ones missing
  are lost; fewer than MIN then closes it empty, with the reason (the job fails).

``vet`` (the node check, ``ftwatch.pipeline.cluster.nodecheck``) may take nodes out of
generation 0 before its world is published; their agents read why in ``left/<node>``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ftwatch.config.cluster import ClusterConfig
from ftwatch.pipeline.cluster.store import KV


@dataclass(frozen=True)
class World:
    """One generation's nodes and where their workers meet.

    Attributes:
        gen: the generation (0 for the first start; each job-level decision adds one).
        nodes: the node ids, in group-rank order (GROUP_RANK = the index).
        nproc: node id -> its worker count (LOCAL_WORLD_SIZE).
        master_addr, master_port: the workers' rendezvous (rank 0's node).
        reason: why the world is empty (the job cannot go on), else "".
    """

    gen: int
    nodes: tuple[int, ...]
    nproc: Mapping[int, int] = field(default_factory=dict)
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    reason: str = ""

    @property
    def size(self) -> int:
        """WORLD_SIZE: every worker of every node."""
        return sum(self.nproc[n] for n in self.nodes)

    def group_rank(self, node: int) -> int:
        return self.nodes.index(node)

    def rank_offset(self, node: int) -> int:
        """The global rank of ``node``'s local rank 0."""
        return sum(self.nproc[n] for n in self.nodes[: self.group_rank(node)])

    def to_msg(self) -> dict:
        return {"gen": self.gen, "nodes": list(self.nodes), "nproc": {str(k): v for k, v in self.nproc.items()},
                "master_addr": self.master_addr, "master_port": self.master_port, "reason": self.reason}

    @classmethod
    def from_msg(cls, m: dict) -> "World":
        return cls(int(m["gen"]), tuple(m["nodes"]), {int(k): int(v) for k, v in m["nproc"].items()},
                   m["master_addr"], int(m["master_port"]), m.get("reason", ""))


def free_port(addr: str) -> int:
    """A TCP port free on ``addr`` now (the kernel's pick; another process may take it later)."""
    with socket.socket() as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


class Rendezvous:
    """The keys of the rendezvous; the agents arrive, the leader closes.

    Args:
        kv: the job's store.
        config: MIN:MAX and ``last_call``.
    """

    def __init__(self, kv: KV, config: ClusterConfig):
        self.kv, self.config = kv, config
        self._min_reached: dict[int, float] = {}     # gen -> mono when MIN nodes had arrived

    # -- every agent --------------------------------------------------------------------------

    def node_id(self, given: int | None) -> int:
        """This agent's node id: ``--node-rank`` when given, else the next by arrival (c10d)."""
        if given is not None:
            return given
        return self.kv.count("next_node") - 1

    def arrive(self, gen: int, node: int, addr: str, nproc: int) -> None:
        """Announce ``node`` for generation ``gen`` (a fresh free port with it)."""
        self.kv.put(f"join/{gen}/{node}", {"addr": addr, "port": free_port(addr), "nproc": nproc})

    def world(self, gen: int) -> World | None:
        """Generation ``gen``'s world once the leader closed it, else None."""
        m = self.kv.read(f"world/{gen}")
        return None if m is None else World.from_msg(m)

    # -- the leader -----------------------------------------------------------------------------

    def arrived(self, gen: int, candidates: Sequence[int]) -> list[int]:
        return [n for n in candidates if self.kv.has(f"join/{gen}/{n}")]

    def candidates(self) -> list[int]:
        """Every node id that may have arrived (static ranks below MAX, plus those given out)."""
        return list(range(max(self.config.max_nodes, self.kv.count("next_node", 0))))

    def close(self, gen: int, mono: float, expected: Sequence[int] | None, alive: Callable[[int], bool],
              vet: Callable[[list[int]], tuple[list[int], dict[int, str]]] | None = None) -> World | None:
        """Close generation ``gen`` when it is ready (see the module docstring); returns the
        world published, or None while it waits.

        Args:
            gen: the generation.
            mono: monotonic seconds now (``last_call``).
            expected: the nodes a decision kept (None: generation 0, anyone may come).
            alive: whether a node's heartbeat is fresh.
            vet: the node check: members -> (kept, {left out: why}).
        """
        if self.kv.has(f"world/{gen}"):
            return self.world(gen)
        cfg = self.config
        if expected is None:
            came = self.arrived(gen, self.candidates())
            if len(came) < cfg.min_nodes:
                return None
            since = self._min_reached.setdefault(gen, mono)
            if len(came) < cfg.max_nodes and mono - since < cfg.last_call:
                return None
            members = came[: cfg.max_nodes]
        else:
            came = self.arrived(gen, expected)
            if any(n not in came and alive(n) for n in expected):
                return None
            members = came
        left: dict[int, str] = {}
        if vet is not None and expected is None and len(members) > 1:
            members, left = vet(members)
        for n, why in left.items():
            self.kv.put(f"left/{n}", why)
        reason = "" if len(members) >= cfg.min_nodes else (
            f"{len(members)} node(s) left, fewer than the {cfg.min_nodes} --nnodes={cfg.nnodes} needs")
        return self.publish(gen, members if not reason else [], reason)

    def publish(self, gen: int, members: Sequence[int], reason: str = "") -> World:
        """Publish generation ``gen``'s world over ``members`` (their arrival records)."""
        joins = {n: self.kv.read(f"join/{gen}/{n}") for n in members}
        first = joins[members[0]] if members else {"addr": "127.0.0.1", "port": 0}
        world = World(gen, tuple(members), {n: int(j["nproc"]) for n, j in joins.items()},
                      first["addr"], int(first["port"]), reason)
        self.kv.put(f"world/{gen}", world.to_msg())
        return world
