"""Every node of a job timed out connecting to its c10d rendezvous endpoint: no node hosts the store
(issue 12: a launch configuration that never worked against a transient fault).

The knowledge: torchrun's ``c10d`` rendezvous backend keeps its state in a TCPStore at
``--rdzv-endpoint``; the agent whose host the endpoint names starts the store's server, every other
agent connects to it as a client. torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py,
``_create_tcp_store``: ``is_host = _matches_machine_hostname(host)`` (the endpoint's host compared
with the machine's own names and addresses, rendezvous/utils.py), then ``TCPStore(host, port,
is_master=is_server, ...)``; a client whose connect runs out of its read timeout raises
``RendezvousConnectionError`` ("The connection to the C10d store has failed"). torchrun docs:
``--rdzv-endpoint`` is "<host>[:<port>]" of the rendezvous backend, for c10d a node of the job.

So a node that starts late, or dies, leaves the *other* nodes timing out, never itself: the
endpoint's own agent serves the store and its own connect reaches it. When every node the launch
names (``--nnodes``; of an elastic ``MIN:MAX``, MAX: a node beyond the MIN that joined may be the
late endpoint) timed out connecting to the same endpoint before any
progress, the endpoint's node was among them and did not serve: the endpoint names no node of the
job as that node knows itself (an address it does not hold, a service or pod IP in front of it, a
name other nodes cannot resolve), which a restart repeats (user_code, fail_job). Fewer nodes than
that timing out keeps the retryable grade (the endpoint's node may be late: metaseq's blips at
scale; kubeflow's worker that starts before its master).

The reading: :func:`every_node_unreachable`; ``ftwatch.policy.initphase.at_init`` calls it only
before any progress.
"""

from __future__ import annotations

import re
from typing import Iterable

from ftwatch.events import Finding

CONFIG_RULE = "rendezvous.config_line"
#: the store connects that ran out of time (as ``initphase.STORE_CONNECT_TIMEOUTS``)
TIMEOUTS = frozenset({"torch.store_client_timeout", "torch.dist_network_error", "c10d.store_connect_timed_out"})
#: a c10d rendezvous (``--rdzv_backend=c10d``, ``rdzv_backend : c10d``) and its endpoint
_C10D = re.compile(r"rdzv[_-]backend['\"]?(?:\s*[=:]\s*|\s+)['\"]?c10d\b")
#: the node count a launch states (``--nnodes=2``, ``--nnodes 2:4``, ``'--nnodes=2'``); the last group the most
_NNODES = re.compile(r"--nnodes['\"]?(?:\s*[=:]\s*|\s+)['\"]?(\d+)(?::(\d+))?")
#: the host a timed-out store connect went to: ``connect to (10.244.3.17, 2222)``, ``to host trainbox-01:29400``
_TARGET = re.compile(r"timed out.*?(?:connect to \(|to host )\[?([\w.:%-]+?)\]?(?:, ?|:)\d+")

SOURCE = ("pytorch/pytorch torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py (_create_tcp_store: "
          "is_host = _matches_machine_hostname(host); TCPStore(host, port, is_master=is_server); a client that "
          "cannot connect raises RendezvousConnectionError 'The connection to the C10d store has failed'); torchrun "
          "docs (--rdzv-endpoint: the rendezvous backend's <host>[:<port>], for c10d a node of the job)")


def every_node_unreachable(f: Finding, evidence: Iterable[Finding]) -> str | None:
    """Why ``f`` is the launch's configuration (the module docstring), or None.

    Args:
        f: the incident's root cause, read when it is a store connect that timed out
            (:data:`TIMEOUTS`); the caller checks that no progress came before it.
        evidence: the incident's findings (every instance): the launch lines (``rendezvous.config_line``)
            and the store connects that timed out before or with ``f``.

    Returns:
        A sentence naming the endpoint and the node count; None unless a launch line before ``f``
        names a c10d rendezvous and a node count of 2 or more, and as many instances as that count
        timed out connecting to the same host as ``f``.
    """
    if f.rule_id not in TIMEOUTS or (target := _TARGET.search(f.line)) is None:
        return None
    seen = list(evidence)
    launch = [g.line for g in seen if g.rule_id == CONFIG_RULE and (g.time, g.seq) < (f.time, f.seq)]
    counts = [int(m.group(2) or m.group(1)) for line in launch for m in _NNODES.finditer(line)]
    if not counts or not any(_C10D.search(line) for line in launch):
        return None
    nodes = max(counts)
    if nodes < 2:
        return None
    host = target.group(1)
    reporters = {g.origin.instance for g in seen if g.rule_id in TIMEOUTS
                 and (m := _TARGET.search(g.line)) is not None and m.group(1) == host}
    if len(reporters) < nodes:
        return None
    return (f"before any progress, all {len(reporters)} nodes of the job (--nnodes {nodes}) timed out connecting to the "
            f"c10d rendezvous endpoint {host}, the node it names among them, which would have served the store "
            "itself: the endpoint names no node of the job as that node knows itself, the launch's configuration "
            "(--rdzv-endpoint), which a restart repeats")
