"""The GPU driver's own recovery verdict outranks the error it follows (Xid 154).

Recent NVIDIA drivers print Xid 154, "GPU recovery action changed from 0x0 (None) to
0x1 (GPU Reset Required)", after the Xid whose recovery it grades (NVIDIA Xid catalog: Xid 154
"refers to another Xid" and carries the action the driver now requires; NVML
``nvmlDeviceGpuRecoveryAction_t``). NVIDIA's GPU memory error management guide ("Error Recovery
and Response Flags") says what a reset or reboot action means: terminate every GPU process and reset
the GPU (or reboot the node) before the GPU is used again. So whatever the incident's earliest error
was (an application Xid 13/31 graded restart-in-place, a ``CUDA error: unspecified launch failure``),
a restart on that GPU fails until the reset: :func:`required_reset` makes the driver's verdict
(``gpu.xid154_reset_required``, kernel_vocab.tsv) the root cause when it concerns the root
cause's node and, where the root cause names a GPU (an Xid's ``pci``), that GPU.
"""

from __future__ import annotations

from typing import Sequence

from ftwatch.events import Action, Finding

#: The rules for an Xid 154 that requires a reset or reboot (kernel_vocab.tsv).
RESET_RULES = frozenset({"gpu.xid154_reset_required"})


def required_reset(head: Finding, real: Sequence[Finding]) -> Finding | None:
    """The driver's required reset of ``head``'s GPU, when the incident holds one.

    Args:
        head: the incident's earliest real error (R7).
        real: all its real errors, earliest first.

    Returns:
        The first ``gpu.xid154_reset_required`` finding on ``head``'s node (and on its GPU when
        ``head`` carries a ``pci`` field), when ``head`` itself asks for less than isolating the
        node; else None.
    """
    if head.action >= Action.ISOLATE_NODE or head.rule_id in RESET_RULES:
        return None
    pci = head.fields.get("pci")
    return next((f for f in real if f.rule_id in RESET_RULES and f.origin.node == head.origin.node
                 and (not pci or f"PCI:{pci}" in f.line)), None)
