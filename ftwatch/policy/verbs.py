"""What RDMA work completions say across ranks: a flushed queue pair with no cause in sight.

An InfiniBand / RoCE work completion with status ``IBV_WC_WR_FLUSH_ERR`` (5; NCCL prints
``NET/IB : Got completion from peer ... with status=5 ... vendor err 249``) means only that the
work request was outstanding when its queue pair (QP) went to the error state (rdma-core
``libibverbs/man/ibv_poll_cq.3``: "Work Request Flushed Error: A Work Request was in process or
outstanding when the QP transitioned into the Error State"). The pack files it as fallout
(``rdma.ib_wr_flushed``): the QP's *first* error completion, or the peer whose death broke the QP,
is the cause. When a peer died, or another completion error came first (``status=12``, transport
retry counter exceeded: NVIDIA/nccl#1405 and #1814 show ``status=12 ... vendor err 129`` followed by
``status=5 ... vendor err 249``), those are real errors and the flush stays their fallout.

:func:`flushed_alone` reads the other case: the incident holds flushed completions and no real
error at all (no earlier completion error, no IB port or HCA event, no peer death, no rank that
left first), and *both ends* of one connection report them: one flush line names the GID pair
(local A, remote B), another (local B, remote A) (NCCL prints ``localGid ... remoteGids ...``
with each completion error). Then the peer did not die or vanish (it is alive and flushing too) and
neither end saw a transport error: nothing on the wire failed, yet the QPs went to error: the host
side of the adapters did. A flush reported by one end only says nothing of the peer, which may
have failed out of sight (NCCL's own text: "remote process exited or there was a network error"):
that stays fallout, read as retryable infrastructure. NCCL's developers name the causes of ``status 5 / vendor err 249`` seen alone as PCIe Access
Control Services left enabled and outdated server platform firmware (NVIDIA/nccl#1353,
sjeaugey: "Make sure ACS is disabled; if you are using a Dell server, make sure you have the latest
FW updates"); the NCCL user guide's troubleshooting page ("PCI Access Control Services (ACS)":
ACS redirects PCI peer-to-peer traffic through the root complex, "causing ... a hang or errors")
says the same. Both are properties of the node, which a restart on the same node keeps: the
reading is ``hardware_node`` / ``isolate_node`` on the rank that reported the first flush.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity

#: The rules for a flushed work completion (IBV_WC_WR_FLUSH_ERR, status 5): class ``fallout`` in
#: the packs (tests/rules/test_rootcause.py checks they exist and stay fallout).
FLUSH_RULES = frozenset({"rdma.ib_wr_flushed"})
#: The rule id of the finding :func:`flushed_alone` returns.
FLUSHED_ALONE = "rdma.ib_wr_flushed_alone"
SOURCE = ("rdma-core libibverbs/man/ibv_poll_cq.3 (IBV_WC_WR_FLUSH_ERR); NVIDIA/nccl#1353 (status 5 / vendor "
          "err 249 alone: PCIe ACS or server platform firmware); NCCL user guide, Troubleshooting: PCI Access "
          "Control Services (ACS)")
#: NCCL's endpoint GIDs on a completion error ("localGid ::ffff:10.0.0.2 remoteGids::ffff:10.0.0.1").
_GIDS = re.compile(r"localGid\s*(?P<local>[0-9A-Fa-f:.]+)\s+remoteGids?\s*(?P<remote>[0-9A-Fa-f:.]+)")


def _ends(f: Finding) -> tuple[str, str] | None:
    """(local GID, remote GID) of a flush line, or None when the line carries no GIDs."""
    m = next((m for m in map(_GIDS.search, (f.line, *f.evidence)) if m), None)
    return (m["local"], m["remote"]) if m else None


def flushed_alone(fallout: Sequence[Finding]) -> Finding | None:
    """The first flushed work completion when nothing else explains it.

    Args:
        fallout: an incident's fallout findings by (time, seq), when it has no real error (the
            caller, ``ftwatch.policy.rootcause.analyse``, has already ruled out any earlier
            completion error, port event, peer death or rank that left first).

    Returns:
        A copy of the earliest flush finding, rule ``rdma.ib_wr_flushed_alone``, class
        ``hardware_node``, action ``isolate_node``, severity critical, its line saying why; None
        when the fallout holds no flushed completion, or no two flushes from the two ends of one
        connection.
    """
    flushes = [f for f in fallout if f.rule_id in FLUSH_RULES]
    pairs = {e for e in map(_ends, flushes) if e is not None}
    if not any((remote, local) in pairs for local, remote in pairs if local != remote):
        return None
    first = flushes[0]
    line = (f"{first.line} (flushed work requests at both ends of the connection, with no earlier completion "
            "error, port event or peer failure: the queue pairs failed on the host side; PCIe ACS or "
            "platform firmware)")
    return dataclasses.replace(first, rule_id=FLUSHED_ALONE, failure_class=FailureClass.HARDWARE_NODE,
                               action=Action.ISOLATE_NODE, severity=Severity.CRITICAL, line=line,
                               evidence=first.evidence or (first.line,), source=SOURCE)
