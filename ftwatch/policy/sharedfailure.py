"""A failure that many ranks made themselves at once at start-up: the set-up they share (issue 12).

A transient fault is a fault of one component: a link, a NIC, a GPU, a host that came up late. It
fails the ranks that use that component, and their peers learn of it second-hand: NCCL returns
``ncclRemoteError`` ("a remote process exiting prematurely or a network error", ncclResult_t) or
their collective times out; a rendezvous blip at scale leaves one rank of hundreds unable to
connect (facebookresearch/metaseq's TCP-store retry). When, before the job made any progress,
several ranks each fail *the same call of their own* and none of them reports a lost peer, no one
component explains them: what they share failed, the job's set-up, which a restart repeats.

Two families (:data:`FAMILIES`), each read apart:

* NCCL's generic codes for a failed call of the rank itself, ``ncclSystemError`` ("a call to the
  system failed") and ``ncclUnhandledCudaError`` ("a call to a CUDA function failed"), as torch
  raises them and as its detail line names them, from :data:`MIN_INSTANCES` ranks or more (more
  than the two ends of one connection): the container, the NCCL build against the driver, the
  transport settings, the layout (NCCL user guide, Troubleshooting > Errors: "ncclUnhandledCudaError
  and ncclSystemError indicate that a call to an external library failed ... refer to the NCCL
  warning message to understand how to resolve the problem"). ``ncclUnhandledCudaError`` counts
  from :data:`MIN_LOCAL_INSTANCES` (two): NCCL returns it only from a failed CUDA call on the
  rank's own device (``CUDACHECK`` in ``src/include/checks.h``), a lost peer or connection from
  ``ncclSystemError`` / ``ncclRemoteError``, so no one link explains two ranks failing with it;
  one GPU of one rank that fails alone keeps the retryable grade.
* A connect to the job's rendezvous service that ran out of time (the c10d TCPStore client's
  ``timed out ... trying to connect``, a ``DistNetworkError``; the JAX coordination service's gRPC
  ``DEADLINE_EXCEEDED`` on ``RegisterTask`` / ``PjRT_Client_Connect``) from :data:`MIN_INSTANCES`
  ranks or more *including rank 0*: rank 0 hosts that service (PyTorch ``init_process_group``
  env://: ``MASTER_ADDR`` is "the address of rank 0", whose process starts the TCPStore server with
  ``is_master``; torchrun's c10d rendezvous is hosted by the agent on the endpoint's host, the first
  node; ``jax.distributed.initialize``: ``coordinator_address`` is "the IP address of process 0 and a
  port on which that process should launch a coordinator service"). When the service's own host
  cannot reach it either, the address, name or port every rank was given does not lead to it, and no
  late or lost peer explains that. A rank's connect that fails alone keeps its retryable grade.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from ftwatch.events import Finding

#: Ranks that must report the family themselves: more than the two ends of one connection.
MIN_INSTANCES = 3
#: Ranks that must report a failed CUDA call of their own: two. A CUDA call runs on the rank's own
#: device, so no single link between two ranks fails both ends with it (the module docstring).
MIN_LOCAL_INSTANCES = 2
#: Findings that say a peer went away: then the ranks did not all fail on their own.
PEER_LOSS = frozenset({"nccl.remote_error", "nccl.code.remote_error", "nccl.socket_call_failed",
                       "nccl.connection_closed_by_remote_peer", "c10d.store_peer_closed"})
#: A program's execution that ran past its deadline is no rendezvous connect.
_EXECUTION = re.compile(r"Execution of replica \d+ failed")

_NCCL_SOURCE = ("NCCL docs, API types, ncclResult_t (ncclSystemError 'a call to the system failed', "
                "ncclUnhandledCudaError 'a call to a CUDA function failed': the reporting rank's own call; "
                "ncclRemoteError: a peer or the network between them failed); NCCL user guide, Troubleshooting > "
                "Errors")
_CUDA_LOCAL_SOURCE = ("; NVIDIA/nccl src/include/checks.h (CUDACHECK: a failed CUDA runtime call on the rank's own "
                      "device, WARN 'Cuda failure', returns ncclUnhandledCudaError; a lost peer or connection "
                      "returns ncclSystemError or ncclRemoteError instead)")
_NCCL_MEANING = ("before any progress, {n} ranks each failed the same NCCL call themselves and none reported a lost "
                 "peer: what they share failed (the container, the NCCL build against the driver, the transport "
                 "settings, the layout), not one link, NIC or GPU, and a restart of the same set-up repeats it")
_RDZV_SOURCE = ("PyTorch torch.distributed docs, init_process_group env:// (MASTER_ADDR: address of rank 0; rank 0 "
                "starts the TCPStore server, is_master) and torchrun's c10d rendezvous (hosted by the agent on the "
                "endpoint's host); JAX jax.distributed.initialize (coordinator_address: process 0 launches the "
                "coordinator service); facebookresearch/metaseq (a rendezvous blip at scale leaves single ranks "
                "unable to connect: transient)")
_RDZV_MEANING = ("before any progress, {n} ranks, rank 0 among them, timed out connecting to the job's rendezvous "
                 "service, which rank 0 itself hosts: the address, name or port the ranks were given does not lead "
                 "to it (the launch's configuration), which a restart repeats")


@dataclass(frozen=True)
class Family:
    """Rules whose findings count together, whether rank 0 must be among the reporters, the reading."""

    rules: frozenset[str]
    needs_rank0: bool
    source: str
    meaning: str
    min_instances: int = 3


FAMILIES = (
    Family(frozenset({"nccl.unhandled_system_error", "nccl.code.system_error"}), False, _NCCL_SOURCE, _NCCL_MEANING),
    Family(frozenset({"nccl.unhandled_cuda_error", "nccl.code.unhandled_cuda_error"}), False,
           _NCCL_SOURCE + _CUDA_LOCAL_SOURCE, _NCCL_MEANING, MIN_LOCAL_INSTANCES),
    Family(frozenset({"torch.store_client_timeout", "c10d.store_connect_timed_out", "torch.dist_network_error",
                      "xla.status.deadline_exceeded"}), True, _RDZV_SOURCE, _RDZV_MEANING),
)


@dataclass(frozen=True)
class Shared:
    """What :func:`shared_failure` found: the source and the meaning of the reading, the reporters."""

    source: str
    meaning: str
    instances: frozenset[str]


def shared_failure(f: Finding, evidence: Iterable[Finding]) -> Shared | None:
    """Whether ``f`` is a failure many ranks made themselves at once (the module docstring).

    The caller checks that the job made no progress before ``f`` (``initphase.at_init``).

    Args:
        f: the incident's root cause.
        evidence: the incident's findings (every instance).

    Returns:
        The reading when ``f``'s family (:data:`FAMILIES`) is reported by :data:`MIN_INSTANCES`
        instances or more (rank 0 among them where the family asks it), none of the findings says a
        peer was lost (:data:`PEER_LOSS`), and ``f`` is no program execution past its deadline; None
        otherwise.
    """
    family = next((fam for fam in FAMILIES if f.rule_id in fam.rules), None)
    if family is None or _EXECUTION.search(f.line):
        return None
    seen = list(evidence)
    if any(g.rule_id in PEER_LOSS for g in seen):
        return None
    mine = [g for g in seen if g.rule_id in family.rules and not _EXECUTION.search(g.line)]
    instances = frozenset(g.origin.instance for g in mine)
    if len(instances) < family.min_instances or (family.needs_rank0 and not any(g.rank == 0 for g in mine)):
        return None
    return Shared(family.source, family.meaning.format(n=len(instances)), instances)
