"""The multi-node settings of ``ftwatch run`` (torchrun's flags, seed 004; dlrover-run's ``--nnodes
MIN:MAX``, seed 003): how many nodes, which one this is, where the agents meet.

torchrun's two ways to meet are both read: ``--master-addr``/``--master-port`` (static, with
``--node-rank``) and ``--rdzv-endpoint HOST[:PORT]`` with ``--rdzv-backend c10d`` (node ranks
given out in the order the agents arrive). Either way the agents meet at one PyTorch c10d
``TCPStore`` (``ftwatch.pipeline.cluster.store``), hosted on the endpoint's machine; the
workers' own ``MASTER_ADDR``/``MASTER_PORT`` are chosen afresh for each generation of the job.
A job with one node and no endpoint (``--standalone``, or no flag at all) is the plain local run.

Inside a Slurm step (``srun ftwatch run --nnodes $SLURM_NNODES ...``, one task per node) the
flags not given come from Slurm's environment (:func:`slurm_flags`): the node rank
``$SLURM_NODEID``, the endpoint the first host of ``$SLURM_STEP_NODELIST`` (else
``$SLURM_JOB_NODELIST``), the rendezvous id ``slurm-$SLURM_JOB_ID``.
"""

from __future__ import annotations

from typing import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ftwatch.config.supervisor import parse_elastic_range

DEFAULT_PORT = 29500        # torchrun's default --master-port / rendezvous port


class ClusterConfig(BaseModel):
    """One job's agents across nodes.

    Attributes:
        nnodes: ``N`` or ``MIN:MAX`` nodes (torchrun ``--nnodes``).
        node_rank: this node's rank (``--node-rank``); None: given out by arrival (c10d).
        endpoint_host, endpoint_port: where the store is (``--rdzv-endpoint`` or
            ``--master-addr``/``--master-port``); the node whose rank is 0, or the one whose
            address it is, hosts it.
        run_id: the rendezvous id (``--rdzv-id``): the store's keys live under it.
        local_addr: the address the other nodes reach this one at (default: 127.0.0.1 when the
            endpoint is loopback, else the host name).
        heartbeat: seconds between an agent's heartbeats.
        lost_after: seconds without a heartbeat after which a node is lost.
        last_call: seconds the first rendezvous waits for more than MIN nodes (torchrun: 30).
        settle: seconds the leader collects other nodes' reports after the first one.
        host_store: this agent starts the store (default: node rank 0, or a loopback endpoint's
            first arrival).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: str = "1"
    node_rank: int | None = Field(default=None, ge=0)
    endpoint_host: str = "127.0.0.1"
    endpoint_port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    run_id: str = "none"
    local_addr: str | None = None
    heartbeat: float = Field(default=1.0, gt=0)
    lost_after: float = Field(default=10.0, gt=0)
    last_call: float = Field(default=5.0, ge=0)
    settle: float = Field(default=1.0, ge=0)
    host_store: bool | None = None

    @field_validator("nnodes", mode="before")
    @classmethod
    def _range(cls, v):
        return str(parse_elastic_range(v if not isinstance(v, str) else v.strip()))

    @property
    def min_nodes(self) -> int:
        return parse_elastic_range(self.nnodes).min

    @property
    def max_nodes(self) -> int:
        return parse_elastic_range(self.nnodes).max

    @property
    def hosts_store(self) -> bool:
        """Whether this agent starts the store: ``host_store`` when given, else node rank 0."""
        return self.host_store if self.host_store is not None else self.node_rank == 0


def split_endpoint(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``"host:29400"`` -> ("host", 29400); ``"host"`` -> ("host", default_port); ``"[::1]:5"`` too.

    Raises:
        ValueError: a port that is not a number in 1..65535.
    """
    host, sep, port = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not sep:
        host, port = text, ""
    host = host.strip("[]") or "127.0.0.1"
    if not port:
        return host, default_port
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"bad port in {text!r}")
    return host, int(port)


def cluster_from_flags(*, nnodes: str | None, node_rank: int | None, master_addr: str | None,
                       master_port: int | None, rdzv_endpoint: str | None, rdzv_id: str | None,
                       rdzv_backend: str | None, standalone: bool, local_addr: str | None = None,
                       **timing: float) -> ClusterConfig | None:
    """The multi-node settings from torchrun's flags, or None for a job on this machine only
    (``--standalone``, or one node with no endpoint given).

    Raises:
        ValueError: ``--rdzv-backend`` other than c10d/static, ``--standalone`` with more nodes,
            a bad ``--nnodes`` or endpoint (the message names the flag).
    """
    if rdzv_backend not in (None, "c10d", "static"):
        raise ValueError(f"--rdzv-backend={rdzv_backend}: only c10d (PyTorch's TCPStore) is supported")
    try:
        span = parse_elastic_range(nnodes or "1")
    except ValueError as exc:
        raise ValueError(f"--nnodes={nnodes}: {exc}") from None
    if standalone:
        if span.max > 1:
            raise ValueError("--standalone runs one node; drop --nnodes or --standalone")
        return None
    if span.max == 1 and not (rdzv_endpoint or master_addr):
        return None
    if rdzv_endpoint:
        host, port = split_endpoint(rdzv_endpoint)
    else:
        host, port = master_addr or "127.0.0.1", master_port or DEFAULT_PORT
    return ClusterConfig(nnodes=str(span), node_rank=node_rank, endpoint_host=host, endpoint_port=port,
                         run_id=rdzv_id or "none", local_addr=local_addr, **timing)


def slurm_port(job_id: str) -> int:
    """The store's port of Slurm job ``job_id`` when ``--master-port`` is not given: 15000 plus
    the job id's last four digits (PyTorch Lightning's SLURM convention), so two jobs sharing a
    node do not meet at one port."""
    digits = "".join(c for c in job_id if c.isdigit())[-4:]
    return 15000 + int(digits or 0)


def slurm_flags(env: Mapping[str, str], hostnames: Callable[[str], list[str]], *, nnodes: str | None,
                node_rank: int | None,
                master_addr: str | None, master_port: int | None, rdzv_endpoint: str | None,
                rdzv_id: str | None) -> dict:
    """The multi-node flags a Slurm step's environment gives, for those not given (a flag wins).

    Args:
        env: the environment (``SLURM_JOB_ID``, ``SLURM_NODEID``, ``SLURM_PROCID``,
            ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST``); no ``SLURM_JOB_ID``: nothing.
        hostnames: a Slurm node list (``gpu-[1-4]``) -> its host names (``scontrol show hostnames``).
        nnodes: ``--nnodes`` (one node, or not given: nothing; a job on this machine stays one).
        node_rank, master_addr, master_port, rdzv_endpoint, rdzv_id: the flags as given (None: not).

    Returns:
        ``cluster_from_flags`` keywords filled from Slurm where the flag was not given: ``rdzv_id``;
        and when no endpoint was given (``--rdzv-endpoint``, ``--master-addr``) ``master_addr``
        (the first host of the step's nodes), ``master_port`` (:func:`slurm_port`) and
        ``node_rank`` (``$SLURM_NODEID``: node 0 is that first host, so it hosts the store);
        {} outside Slurm or for one node.

    Raises:
        ValueError: more than one task on a node (``SLURM_PROCID`` is not ``SLURM_NODEID``: one
            ``ftwatch run`` per node, ``srun --ntasks-per-node=1``), or no node list to find the
            endpoint in.
    """
    job = env.get("SLURM_JOB_ID")
    try:
        several = parse_elastic_range(nnodes or "1").max > 1
    except ValueError:
        several = False                   # cluster_from_flags names the bad --nnodes
    if not job or not several:
        return {}
    out: dict = {}
    node, proc = env.get("SLURM_NODEID"), env.get("SLURM_PROCID")
    if node is not None and proc is not None and node != proc:
        raise ValueError(f"Slurm task {proc} on node {node}: run one ftwatch per node (srun --ntasks-per-node=1)")
    if rdzv_id is None:
        out["rdzv_id"] = f"slurm-{job}"
    if not (rdzv_endpoint or master_addr):     # an endpoint given: its own way to meet (ranks by arrival)
        if node_rank is None and node is not None and node.isdigit():
            out["node_rank"] = int(node)       # node 0 is the node list's first host: it hosts the store
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise ValueError(f"inside Slurm job {job} without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: "
                             "give --rdzv-endpoint HOST:PORT")
        hosts = hostnames(nodelist)
        if not hosts:
            raise ValueError(f"no host in Slurm's node list {nodelist!r}: give --rdzv-endpoint HOST:PORT")
        out["master_addr"] = hosts[0]
        if master_port is None:
            out["master_port"] = slurm_port(job)
    return out
