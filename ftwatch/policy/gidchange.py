"""A RoCE GID entry that moved under a job whose NCCL was pinned to its index: that node's NIC state,
not a passing network fault (issue 12: node faults read as transient infrastructure).

The knowledge:

* NCCL prints every asynchronous event of an HCA it uses (src/transport/net_ib ``ncclIbAsyncThreadMain``:
  ``NET/IB : Got async event : %s`` with ``ibv_event_type_str``), ``GID table change`` for
  ``IBV_EVENT_GID_CHANGE``, and only logs it: the GID a connection uses is read once, at connect time,
  from the index ``NCCL_IB_GID_INDEX`` names (``ncclParamIbGidIndex``; ``NCCL_IB_GID_INDEX set by
  environment to N``, src/misc/param.cc), and is never read again (NVIDIA/nccl#2157: the index is
  cached at connect/accept time and the GID-change handler only warns).
* The NCCL maintainer (NVIDIA/nccl#1333, a ConnectX-7 RoCE node whose RoCEv2 GID left index 3 after
  hours of training): when the GID changes the NCCL communication stays broken and errors out, there
  is no automatic reconnect; with the index pinned, every node must hold the RoCEv2 GID at that index,
  so the moved node fails the next run too (the reporter had to reboot it); only NCCL's own GID
  detection (2.21+, no pinned index) would pick the new index on the next run.
* A completion that ran out of transport retries (``status=12``, ``IBV_WC_RETRY_EXC_ERR``) is what a
  connection whose GID no longer answers reports (NVIDIA/nccl#426, the maintainer: error 12 is a timeout,
  the NICs cannot talk over RoCE; NVIDIA/nccl#394 shows the event followed by error 12).

The reading (:func:`pinned_gid_moved`): when the incident's earliest real error is such a
retry-exceeded completion, an HCA of the job reported ``GID table change`` before it, and the job's
NCCL said its GID index was set by the environment, the root cause is the node whose GID table
changed: ``hardware_node`` / ``isolate_node`` (a relaunch onto it meets the moved entry again until
the node is fixed). Without the pinned index, or without the event, the completion error keeps its
retryable grade: NCCL's own detection picks the new index on a restart.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, precedes

#: The rule id of the regraded finding.
MOVED_RULE = "rdma.pinned_gid_moved"
#: A completion that ran out of transport retries (nccl_vocab.tsv)
RETRY_EXCEEDED = frozenset({"rdma.ib_retry_exceeded"})
#: NCCL's report of an HCA's asynchronous event graded info (nccl_vocab.tsv), and the event's name
ASYNC_INFO = "nccl.ib_async_info"
GID_CHANGE = "GID table change"
#: NCCL's word that NCCL_IB_GID_INDEX came from the environment (rules/packs/lifecycle.yaml)
PINNED = "nccl.ib_gid_index_pinned"

SOURCE = ("NVIDIA/nccl src/transport/net_ib (ncclIbAsyncThreadMain: WARN 'NET/IB : Got async event : %s'; the "
          "GID read at connect time from NCCL_IB_GID_INDEX); NVIDIA/nccl#1333 (maintainer: when the GID changes "
          "NCCL communication stays broken, no automatic reconnect; a pinned index must hold on every node, "
          "the reporter rebooted the node); NVIDIA/nccl#2157 (GID index cached at connect time); "
          "NVIDIA/nccl#426 (error 12: a timeout, the NICs cannot talk over RoCE)")


def pinned_gid_moved(head: Finding, order: Sequence[Finding]) -> Finding | None:
    """The node whose RoCE GID table changed under a pinned ``NCCL_IB_GID_INDEX``, as the root cause.

    Args:
        head: the incident's earliest real error.
        order: all the incident's findings, by (time, seq).

    Returns:
        The earliest ``GID table change`` event before ``head``, regraded ``rdma.pinned_gid_moved``
        (``hardware_node`` / ``isolate_node``, on the event's own node and rank), when ``head`` is a
        retry-exceeded completion and the job's NCCL said its GID index was set by the environment;
        else None.
    """
    if head.rule_id not in RETRY_EXCEEDED:
        return None
    if not any(f.rule_id == PINNED for f in order):
        return None
    event = next((f for f in order if f.rule_id == ASYNC_INFO and GID_CHANGE in f.line and precedes(f, head)),
                 None)
    if event is None:
        return None
    line = (f"{event.line} (NCCL_IB_GID_INDEX pinned by the environment), then {head.rule_id}: the RoCE GID "
            "entry NCCL's connections were bound to moved on this node")
    return dataclasses.replace(event, rule_id=MOVED_RULE, failure_class=FailureClass.HARDWARE_NODE,
                               action=Action.ISOLATE_NODE, severity=head.severity, line=line,
                               evidence=(event.line, head.line), fields={**event.fields, "after": head.rule_id},
                               source=SOURCE)
