"""A node of rank 1 or more told to rendezvous at a loopback address (SPEC R6 phases, issue 12 item 3).

Every rank of a job meets at one place: with ``env://`` "MASTER_ADDR - required (except for rank
0); address of rank 0 node" (PyTorch docs, torch.distributed, "Environment variable
initialization"); torchrun's ``--master-addr`` is the "Address of the master node (rank 0)", which
"For single node multi-proc training ... can simply be 127.0.0.1", and its ``--rdzv-endpoint`` names
the ``<host>:<port>`` of the node that hosts the c10d rendezvous (torch/distributed/run.py). A
loopback address (``localhost``, 127.0.0.0/8, ``::1``; RFC 1122 3.2.1.3, RFC 4291 2.5.3) names the
host that reads it. On a node other than rank 0's it points that node at itself: it never reaches
rank 0's node, each node waits for peers that never join, and the job hangs at start-up (or its
store connect times out). A restart runs the same launch with the same address.

:func:`loopback_rendezvous` reads it from the launch's own lines (``rendezvous.config_line`` in
``rules/packs/lifecycle.yaml``: ``NODE_RANK=1 MASTER_ADDR=localhost``, ``--node-rank=1``,
DeepSpeed's ``node_rank=1``, torchrun's ``rdzv_endpoint : localhost:29500``): when an instance
states a node rank of 1 or more and a loopback rendezvous address, both before the failure, and the
failure is a job hang or a rendezvous store connect that timed out, with no progress before it
(``ftwatch.policy.initphase.at_init`` calls it only then), the failure is the launch's
configuration (user_code, fail_job). Node rank 0 with a loopback address is right (Kubeflow's
training-operator gives the master pod ``localhost``); so is any address on a single node.

The same holds when the ranks were given different meeting points: "MASTER_PORT - required; has to
be a free port on machine with rank 0" (the same docs) is one port for all. :func:`split_rendezvous`
reads launch lines that state an address and a port together (``MASTER_ADDR=127.0.0.1
MASTER_PORT=41733``, ``master_addr=..., master_port=...``, ``rdzv_endpoint : host:port``) printed
within :data:`TOGETHER_SECONDS` of each other before the failure: two that name the same address
with different ports, or different loopback addresses' ports, are ranks that wait at different
stores (a port each process picked for itself). A launcher that re-forms its group prints a new
port for the new round (torchelastic's ``master_port=`` after each rendezvous), minutes apart, after
a failure it reports: such lines are not together.

The node of rank 0 is the store's own host under torchrun's static rendezvous (the default when the
launch gives ``--master-addr`` and no ``--rdzv-endpoint``): torch/distributed/elastic/rendezvous/
static_tcp_rendezvous.py ``StaticTCPRendezvous`` "Creates TCPStore ... with the listener on the agent
with group_rank=0" (``is_master = self.rank == 0``), and that agent's own store client connects to
``master_addr:master_port`` like every other. :func:`own_store_unreachable` reads a node of rank 0
whose store connect to its own stated master address timed out: the address does not lead to the
host that listens (not one of its addresses, or one its own firewall drops), which no peer, late or
lost, explains; the launch's address is its configuration, which a restart repeats.
"""

from __future__ import annotations

import re
from typing import Iterable

from ftwatch.events import Finding
from ftwatch.policy.loopback import is_loopback

#: The evidence rule (lifecycle.yaml) whose lines state a launch's rendezvous address or node rank.
CONFIG_RULE = "rendezvous.config_line"
#: A rendezvous address as the launch states it: group 1 the host (``MASTER_ADDR=localhost``,
#: ``master_addr=127.0.0.1``, ``--master-addr 10.0.0.5``, ``rdzv_endpoint : localhost:29500``).
_ADDRESS = re.compile(r"(?:\bMASTER_ADDR|\bmaster_addr|\brdzv_endpoint|--master[_-]addr|--rdzv[_-]endpoint)"
                      r"(?:\s*[=:]\s*|\s+)['\"]?\[?([\w.:-]+?)\]?(?::\d+)?['\",]?(?=\s|$)")
#: A port stated beside the address (``MASTER_PORT=41733``, ``master_port=29500``, ``--master-port 29500``).
_PORT = re.compile(r"(?:\bMASTER_PORT|\bmaster_port|--master[_-]port)(?:\s*[=:]\s*|\s+)(\d+)\b")
#: An endpoint's own port (``rdzv_endpoint : localhost:29500``).
_ENDPOINT_PORT = re.compile(r"\brdzv[_-]endpoint(?:\s*[=:]\s*|\s+)\S+?:(\d+)\b")
#: How close in time the launch lines of one start are (seconds): the ranks start together.
TOGETHER_SECONDS = 60.0
#: A static rendezvous address (``MASTER_ADDR=10.0.0.5``, ``--master_addr 10.0.0.5``), not an endpoint.
_MASTER_ADDRESS = re.compile(r"(?:\bMASTER_ADDR|\bmaster_addr|--master[_-]addr)(?:\s*[=:]\s*|\s+)['\"]?\[?([\w.:-]+?)\]?['\",]?(?=\s|$)")
#: A launch that names a dynamic rendezvous (its store is hosted by the endpoint's agent, not node rank 0).
_DYNAMIC = re.compile(r"\brdzv[_-](?:endpoint|backend)\b")
#: A node rank as the launch states it (``NODE_RANK=1``, ``node_rank=1``, ``--node-rank 1``).
NODE_RANK = re.compile(r"(?:\bNODE_RANK|\bnode_rank|--node[_-]rank)(?:\s*[=:]\s*|\s+)(\d+)\b")
SOURCE = ("PyTorch docs, torch.distributed 'Environment variable initialization' (MASTER_ADDR: address of rank 0 "
          "node); torch/distributed/run.py (--master-addr: 'Address of the master node (rank 0)', 127.0.0.1 for a "
          "single node; --rdzv-endpoint); RFC 1122 3.2.1.3 and RFC 4291 2.5.3 (loopback names the host itself)")
MEANING = ("before any progress, a node of rank 1 or more was told to rendezvous at a loopback address: it reaches "
           "only itself, never rank 0's node, so the nodes never meet; the launch's address (MASTER_ADDR, "
           "--rdzv-endpoint) is its configuration, which a restart repeats")


def loopback_rendezvous(f: Finding, evidence: Iterable[Finding]) -> str | None:
    """Why ``f`` is the launch's configuration (the module docstring), or None.

    Args:
        f: a job hang (kind ``hang``) or a rendezvous store connect that timed out (the caller
            checks the rule and that no progress came before it).
        evidence: the incident's findings; ``rendezvous.config_line`` findings before ``f`` are read.

    Returns:
        A sentence naming the instance, its node rank and its loopback address; None when no
        instance states both a node rank of 1 or more and a loopback rendezvous address.
    """
    ranks: dict[str, int] = {}
    loops: dict[str, str] = {}
    for g in evidence:
        if g.rule_id != CONFIG_RULE or (g.time, g.seq) >= (f.time, f.seq):
            continue
        who = g.origin.instance
        for m in NODE_RANK.finditer(g.line):
            ranks[who] = max(ranks.get(who, 0), int(m.group(1)))
        for m in _ADDRESS.finditer(g.line):
            if is_loopback(m.group(1)):
                loops[who] = m.group(1)
    for who in sorted(set(ranks) & set(loops)):
        if ranks[who] >= 1:
            return f"{who} is node rank {ranks[who]} yet rendezvouses at {loops[who]}: {MEANING}"
    return None


def split_rendezvous(f: Finding, evidence: Iterable[Finding]) -> str | None:
    """Why ``f`` is the launch's configuration when its ranks were given different rendezvous ports
    for one address (the module docstring), or None.

    Args:
        f: a job hang or a store connect that timed out, with no progress before it (the caller's).
        evidence: the incident's findings; ``rendezvous.config_line`` findings before ``f`` are read.

    Returns:
        A sentence naming the address and its ports; None when no two launch lines printed within
        :data:`TOGETHER_SECONDS` of each other name one address with different ports.
    """
    seen: list[tuple[float, str, str]] = []     # (time, address, port)
    for g in sorted(evidence, key=lambda g: (g.time, g.seq)):
        if g.rule_id != CONFIG_RULE or (g.time, g.seq) >= (f.time, f.seq):
            continue
        address = _ADDRESS.search(g.line)
        port = _PORT.search(g.line) or _ENDPOINT_PORT.search(g.line)
        if address is None or port is None:
            continue
        host = "loopback" if is_loopback(address.group(1)) else address.group(1)
        seen.append((g.time, host, port.group(1)))
    for i, (t, host, port) in enumerate(seen):
        others = sorted({p for u, h, p in seen[i + 1:] if h == host and p != port and u - t <= TOGETHER_SECONDS})
        if others:
            return (f"the ranks were told to meet at {host} on different ports ({port}, {', '.join(others[:4])}) "
                    "within one start: each waits at its own store for peers that never come; the port the launch "
                    "gives each rank (MASTER_PORT, one port on rank 0's machine for all) is its configuration, which "
                    "a restart repeats")
    return None


def own_store_unreachable(f: Finding, target: str, evidence: Iterable[Finding]) -> str | None:
    """Why ``f`` is the launch's configuration when the node of rank 0, the static store's host, timed
    out connecting to its own master address (the module docstring), or None.

    Args:
        f: a rendezvous store connect that timed out, with no progress before it (the caller's).
        target: the host ``f`` connected to, as its line names it.
        evidence: the incident's findings; ``rendezvous.config_line`` findings of ``f``'s instance
            before ``f`` are read.

    Returns:
        A sentence naming the address; None unless ``f``'s instance stated node rank 0 (and no
        other), a static master address equal to ``target`` that is no loopback one, and no dynamic
        rendezvous (``--rdzv-endpoint``, ``--rdzv-backend``).
    """
    ranks: set[int] = set()
    masters: set[str] = set()
    for g in evidence:
        if (g.rule_id != CONFIG_RULE or g.origin.instance != f.origin.instance
                or (g.time, g.seq) >= (f.time, f.seq)):
            continue
        if _DYNAMIC.search(g.line):
            return None
        ranks.update(int(m.group(1)) for m in NODE_RANK.finditer(g.line))
        masters.update(m.group(1).removeprefix("::ffff:") for m in _MASTER_ADDRESS.finditer(g.line))
    host = target.removeprefix("::ffff:")
    if ranks != {0} or host not in masters or is_loopback(host):
        return None
    return (f"{f.origin.instance} is node rank 0, the host of the static rendezvous store, yet its own connect to "
            f"the master address {host} it was given timed out: the address does not lead to the host that "
            "listens, which no late or lost peer explains; the launch's address (MASTER_ADDR, --master-addr) is its "
            "configuration, which a restart repeats")
