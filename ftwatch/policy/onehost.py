"""A job whose processes all run on one host, read from its own launch lines (issue 12: a set-up
that never worked against a transient fault).

The knowledge: NCCL's ``ncclSystemError`` ("unhandled system error") says "a call to an external
library failed" (NCCL user guide, Troubleshooting > Runtime and MPI issues > Errors). Between the
GPUs of one host NCCL's calls are the host's own: "To communicate between processes and even between
threads of a process, NCCL creates shared memory segments, traditionally in /dev/shm ... If
insufficient shared memory is available, NCCL will fail to initialize", and "Docker containers
default to limited shared and pinned memory resources" (``--shm-size=1g --ulimit memlock=-1``; the
same page, Memory issues > Shared memory > Docker); pytorch/tutorials PR #2475: ``nn.DataParallel``
in a container with the default shared memory crashes at NCCL's initialisation (``ncclShmOpen``).
No link, switch or peer host is on that path, so when such a call fails before the job made any
progress (the caller, ``ftwatch.policy.initphase.at_init``, checks that) the host's or container's
set-up failed (its shared memory size, its IPC namespace, its memlock limit), which a restart on the
same set-up repeats: user_code, fail_job. What ``ncclSystemError`` says between hosts (a socket, an
IB verbs call) keeps its retryable grade.

The reading (:func:`one_host`), a job is on one host when, before the failure:

* the failure's own traceback passes through ``nn.DataParallel`` (``torch/nn/parallel/data_parallel.py``
  or ``replicate.py``, which broadcast the module to the GPUs through NCCL inside one process): one
  process drives every GPU of its machine (PyTorch docs, torch.nn.DataParallel); or
* the program says so itself (``launch.single_process_host``: Marian built without MPI logs
  "[comm] Compiled without MPI support. Running as a single process on <host>", and that one process
  drives every GPU of ``--devices``), with no second host among the findings; or
* the job's rendezvous address, as a launch line states it (``rendezvous.config_line``:
  ``MASTER_ADDR``, ``--master_addr``; ``rendezvous.init_method_tcp``: ``init_method`` / ``dist_url``
  ``tcp://host:port``; the detectron2-style launchers' ``Process group URL: tcp://host:port``, the
  ``init_method`` that detectron2's ``engine/launch.py`` and YOLOX's ``core/launch.py`` passed, which
  is ``tcp://127.0.0.1:<free port>`` for ``dist_url="auto"`` on one machine), is a loopback address (RFC 1122 3.2.1.3: 127/8 "MUST NOT appear outside a
  host"; torchrun: "For single node multi-proc training the --master-addr can simply be 127.0.0.1"),
  or the job's list of nodes is loopback addresses only (Paddle 1.x's launcher prints its
  ``--cluster_node_ips``, "Paddle cluster nodes ips", default ``127.0.0.1``:
  python/paddle/distributed/launch.py),
  and nothing says there is more than one node: no node rank of 1 or more, no node count above 1
  (``NNODES``, ``--nnodes``), no launch line naming a rendezvous address that is not a loopback one, no
  second host among the findings (``loopback.job_hosts``). The master
  pod of a multi-node Kubeflow job is given ``localhost`` too, so a job whose lines name its node count
  as more than one keeps its grade.
"""

from __future__ import annotations

import re
from typing import Iterable

from ftwatch.events import Finding
from ftwatch.parsers.multiline import FRAME
from ftwatch.policy.loopback import is_loopback, job_hosts
from ftwatch.policy.rdzvconfig import NODE_RANK

#: NCCL's generic code for a failed call of its own, as torch raises it and as its detail names it
SYSTEM_ERRORS = frozenset({"nccl.unhandled_system_error", "nccl.code.system_error"})
#: the launch lines read (both in rules/packs/lifecycle.yaml)
CONFIG_RULES = frozenset({"rendezvous.config_line", "rendezvous.init_method_tcp"})
#: the program's own word that the job is one process on one host (rules/packs/lifecycle.yaml)
SINGLE_PROCESS = "launch.single_process_host"
#: a frame of nn.DataParallel: torch/nn/parallel/data_parallel.py or replicate.py (not distributed.py: DDP)
_DATA_PARALLEL = re.compile(r"torch[/\\]nn[/\\]parallel[/\\](?:data_parallel|replicate)\.py$")
#: a rendezvous address as a launch line states it: group 1 the host
_ADDRESS = re.compile(r"(?:\bMASTER_ADDR|\bmaster_addr|--master[_-]addr|\binit_method|\bdist_url|\bProcess group URL)['\"]?"
                      r"(?:\s*[=:]\s*|\s+)['\"]?(?:tcp://)?\[?([\w.:-]+?)\]?(?::\d+)?['\",]?(?=[\s,]|$)")
#: Paddle's list of the job's nodes (``--cluster_node_ips``, "Paddle cluster nodes ips, such as
#: 192.168.0.16,192.168.0.17..", printed as ``cluster_node_ips: 127.0.0.1``): group 1 the list
_NODE_LIST = re.compile(r"(?:--cluster_node_ips(?:\s*=\s*|\s+)|\bcluster_node_ips['\"]?\s*[=:]\s*)['\"]?([\w.:,\[\]-]+)")
#: a node count that says the job spans nodes (a node rank >= 1 says it too: rdzvconfig.NODE_RANK)
_NODE_COUNT = re.compile(r"(?:\bNNODES|\bnnodes|--nnodes|\bnum_nodes|--num[_-]nodes)(?:\s*[=:]\s*|\s+)(\d+)")

SOURCE = ("NCCL user guide, Troubleshooting > Runtime and MPI issues (Errors: ncclSystemError, 'a call to an "
          "external library failed'; Memory issues > Shared memory: 'To communicate between processes and even "
          "between threads of a process, NCCL creates shared memory segments ... If insufficient shared memory is "
          "available, NCCL will fail to initialize'; Docker: containers default to limited shared and pinned "
          "memory, --shm-size=1g --ulimit memlock=-1); pytorch/tutorials PR #2475 (nn.DataParallel in a container "
          "with default shm crashes at NCCL init in ncclShmOpen); marian-dev src/training/communicator.cpp ('[comm] "
          "Compiled without MPI support. Running as a single process on <host>', path from memory); RFC 1122 3.2.1.3 (loopback never leaves its "
          "host); PyTorch docs, torch.nn.DataParallel and torchrun --master-addr (127.0.0.1 for a single node)")
MEANING = ("before any progress, NCCL's own system call failed in a job whose processes all run on one host ({why}): "
           "no network between hosts is on that path, only the host's shared memory, IPC and memlock limits, so "
           "the host's or container's set-up failed (shm size, --ipc=host, ulimit memlock), which a restart repeats")


def one_host(f: Finding, evidence: Iterable[Finding]) -> str | None:
    """Why ``f`` is a failed NCCL system call of a job on one host (the module docstring), or None.

    Args:
        f: the incident's root cause; only :data:`SYSTEM_ERRORS` are read (the caller checks that no
            progress came before it).
        evidence: the incident's findings (every instance); launch facts before ``f`` are read, and
            ``f``'s own traceback lines (``f.evidence``).

    Returns:
        The meaning, naming what says the job is on one host; None when ``f`` is no NCCL system
        error, or nothing before it says the job is on one host, or something says it spans nodes.
    """
    if f.rule_id not in SYSTEM_ERRORS:
        return None
    if any((m := FRAME.match(line)) and _DATA_PARALLEL.search(m.group(1)) for line in f.evidence):
        return MEANING.format(why="its traceback is in nn.DataParallel: one process drives every GPU")
    seen = [g for g in evidence if (g.time, g.seq) < (f.time, f.seq)]
    if any(g.rule_id == SINGLE_PROCESS for g in seen) and len(job_hosts(evidence)) <= 1:
        return MEANING.format(why="the program said it runs as a single process on one host")
    loops: set[str] = set()
    listed: set[str] = set()        # those from a node list (Paddle's cluster_node_ips)
    for g in seen:
        if g.rule_id not in CONFIG_RULES:
            continue
        if any(int(m.group(1)) >= 1 for m in NODE_RANK.finditer(g.line)) or any(
                int(m.group(1)) >= 2 for m in _NODE_COUNT.finditer(g.line)):
            return None
        for m in _ADDRESS.finditer(g.line):
            if not is_loopback(m.group(1)):
                return None             # an address other ranks could meet at from another host
            loops.add(m.group(1))
        for m in _NODE_LIST.finditer(g.line):
            ips = [ip.strip("[]") for ip in m.group(1).split(",") if ip.strip("[]")]
            if not all(is_loopback(ip) for ip in ips):
                return None             # a node list naming a host other than this one
            loops.update(ips)
            listed.update(ips)
    if not loops or len(job_hosts(evidence)) > 1:
        return None
    if loops == listed:
        return MEANING.format(why=f"its launch lists its nodes as the loopback address {sorted(loops)[0]} only")
    return MEANING.format(why=f"its ranks rendezvous at the loopback address {sorted(loops)[0]}")
