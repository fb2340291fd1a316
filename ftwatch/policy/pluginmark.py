"""A GPU the Kubernetes device plugin marked unhealthy is graded by the Xid it marked it for.

NVIDIA's k8s-device-plugin watches NVML events per GPU (internal/rm/health.go): on an
``XidCriticalError`` whose Xid is not in its skip list it logs ``XidCriticalError: Xid=N on
Device=<uuid>, the device will go unhealthy.`` (``..., All devices will go unhealthy.`` when the
event names no GPU) and sends the device to its unhealthy channel, and ListAndWatch
(internal/plugin/server.go) then logs ``'nvidia.com/gpu' device marked unhealthy: <uuid>``. The
mark therefore says nothing of its own about the GPU: it is the plugin's reaction to the Xid it
logged just before, and the plugin marks on every Xid outside its short skip list, whatever the Xid
means. The maintainers' reading in NVIDIA/k8s-device-plugin#234: a GPU is marked, and stays marked
until the plugin restarts, after transient and harmless Xids. ``rules/packs/kernel_vocab.tsv``
(``gpu.device_plugin_unhealthy``) states the same: "The Xid it names decides".

So :func:`explained_marks` regrades a mark whose GPU's ``XidCriticalError`` (same uuid, or an event
for all devices, logged by the same plugin before the mark) is an Xid NVIDIA's catalog grades
IGNORE (``gpu_xid.tsv``: Xid 63, a row remap recorded, "ignore now, reset GPU when idle"; the
finding's action ``none``) to a notice with action none: the Xid's grade decides, and a job that
runs on needs nothing. A mark with no such line, or after an Xid graded anything else, keeps its
own grade (notify: a GPU left the node's pool), and the Xid's finding decides the job by its own
grade as always.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from ftwatch.events import Action, Finding, Severity, precedes

#: the plugin's mark, and the rule ids of an Xid finding (``ftwatch.rules.faultcodes``: ``xid.<n>``)
MARK = "gpu.device_plugin_unhealthy"
_XID = "xid."
_UUID = re.compile(r"device marked unhealthy: (\S+)")
SOURCE = ("NVIDIA/k8s-device-plugin internal/rm/health.go (XidCriticalError -> unhealthy channel) and "
          "internal/plugin/server.go ListAndWatch; NVIDIA/k8s-device-plugin#234")


def _cause(mark: Finding, order: Sequence[Finding]) -> Finding | None:
    """The plugin's last ``XidCriticalError`` finding for ``mark``'s GPU before it, or None."""
    m = _UUID.search(mark.line)
    uuid = m.group(1) if m else None
    cause = None
    for f in order:
        if (f.rule_id.startswith(_XID) and "xid" in f.fields and f.origin.instance == mark.origin.instance
                and "XidCriticalError" in f.line and f.fields.get("uuid") in (uuid, None)
                and not precedes(mark, f)):
            cause = f
    return cause


def explained_marks(order: Sequence[Finding]) -> list[Finding]:
    """The findings, a plugin's mark after an ignorable Xid regraded to a notice (module docstring).

    Args:
        order: one incident's findings, any order.

    Returns:
        The same findings in the same order; each ``gpu.device_plugin_unhealthy`` whose cause
        (:func:`_cause`) is graded action none replaced by a warning with action none.
    """
    out = list(order)
    for i, f in enumerate(out):
        if f.rule_id != MARK or f.action is Action.NONE:
            continue
        cause = _cause(f, order)
        if cause is not None and cause.action is Action.NONE:
            out[i] = replace(f, action=Action.NONE, severity=min(f.severity, Severity.WARNING),
                             source=f"{f.source}; graded by {cause.rule_id}: {SOURCE}")
    return out
