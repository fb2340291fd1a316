"""A network port that went down and came back: a link flap, not a broken node (R7).

NCCL's IB transport prints the HCA's asynchronous events as they come (NVIDIA/nccl
``src/transport/net_ib``: ``NET/IB : <dev>:<port> Got async error event: port error`` for
``IBV_EVENT_PORT_ERR``, ``... port active`` for ``IBV_EVENT_PORT_ACTIVE``; rdma-core
``ibv_get_async_event(3)``: PORT_ERR "link became unavailable on a port", PORT_ACTIVE "link became
active on a port"). Alone, a port error is read as the node's link failing (``nccl.ib_async_port_error``,
isolate_node): the link may stay down (a cloud provider's ``HW_IB_LINK_DOWN`` after three minutes
down), and a node whose ranks keep reporting it has a bad NIC, cable or switch port (the NCCL
maintainer's reading of repeated port errors: check that node's cables and IB counters).

A port error that the same port's ``port active`` follows is a flap: the link came back. Huawei's
MindCluster grades one RoCE link down (fault code 81078603) ``NotHandleFault`` and separates the chip
only when the link went down 5 times in 24 hours (its fault-frequency rule, /work/shared/data/
fault-tables README "frequency"); a job that a flap broke fails on its collectives' errors (NCCL does not
retry a work request past ``NCCL_IB_RETRY_CNT``), which are retryable, and a job that went on needs
nothing (NCCL's NIC failover kept its traffic on another port). So :func:`recovered_flaps` regrades the
port errors of a port that later reported ``port active``, while that port went down fewer than
``FLAP_LIMIT`` times, to a notice (warning, retryable_infra, action none: MindCluster's
NotHandleFault): no root cause of its own; the job's own errors decide, and a job that has none runs on
(``ftwatch.policy.policy`` reads the incident's trigger by its own grade: none, the workers run on, as a
C4D record below the log level).

Counterexamples: a port error with no ``port active`` after it (the link stayed down, or the log ends);
``port active`` of another port or another process; a port that went down ``FLAP_LIMIT`` times or more
(MindCluster: separate).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity

#: the rule of a port error, and of the non-fatal events among which ``port active`` is
PORT_ERROR = "nccl.ib_async_port_error"
PORT_EVENT = "nccl.ib_async_info"
#: port-down events of one port from which the flapping port is the node's fault (MindCluster: 5 in 24 h)
FLAP_LIMIT = 5
#: ``mlx5_1:1`` before ``Got async``: NCCL 2.19+ names the device and port; older NCCL names neither
_PORT = re.compile(r"NET/IB ?: ?(?:(?P<port>\S+:\d+) )?(?:Got )?(?:non-fatal )?async")
_ACTIVE = re.compile(r":\s*port active\b")
#: the ``host:pid:tid`` prefix NCCL prints on its WARN lines: the process that saw the event
_PROCESS = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\]")
SOURCE = ("rdma-core ibv_get_async_event(3) (IBV_EVENT_PORT_ERR / IBV_EVENT_PORT_ACTIVE); NVIDIA/nccl "
          "src/transport/net_ib (async events); Ascend/mind-cluster fault frequency (81078603 RoCE link down: "
          "NotHandleFault, 5 times in 24 h -> ManuallySeparateNPU)")


def _port(f: Finding) -> tuple[str, str, str | None, str | None]:
    """The port ``f`` is about: node, instance, the ``dev:port`` NCCL names, and the process."""
    m, p = _PORT.search(f.line), _PROCESS.search(f.line)
    return (f.origin.node, f.origin.instance, m.group("port") if m else None,
            f"{p.group('host')}:{p.group('pid')}" if p else None)


def recovered_flaps(order: Sequence[Finding]) -> list[Finding]:
    """The findings, a recovered port's errors regraded to notices (module docstring).

    Args:
        order: one incident's findings by (time, seq).

    Returns:
        The same findings in the same order; the port errors of a port that reported ``port active``
        after one of them (it came back: a flapping, not a dead link), and went down fewer than
        ``FLAP_LIMIT`` times, replaced by warnings graded retryable_infra / none.
    """
    downs: dict[tuple, list[int]] = {}
    back: set[tuple] = set()
    for i, f in enumerate(order):
        if f.rule_id == PORT_ERROR:
            downs.setdefault(_port(f), []).append(i)
        elif f.rule_id == PORT_EVENT and _ACTIVE.search(f.line) and _port(f) in downs:
            back.add(_port(f))
    flapped = {i for key in back if len(downs[key]) < FLAP_LIMIT for i in downs[key]}
    return [replace(f, failure_class=FailureClass.RETRYABLE_INFRA, action=Action.NONE,
                    severity=Severity.WARNING, source=f"{f.source}; flap: {SOURCE}")
            if i in flapped else f for i, f in enumerate(order)]
