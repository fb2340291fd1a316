"""Collective fields from c10d watchdog and work lines (SPEC P3; issue 12 items 2 and 3).

PyTorch's ProcessGroupNCCL (and torch_npu's ProcessGroupHCCL) name the collective a watchdog gave
up on and where each rank stands in the sequence of collectives::

    Watchdog caught collective operation timeout: WorkNCCL(SeqNum=611, OpType=ALLREDUCE,
        NumelIn=1168, NumelOut=1168, Timeout(ms)=600000) ran for 600064 milliseconds before timing out.
    Timeout at NCCL work: 4213, last enqueued NCCL work: 4213, last completed NCCL work: 4212.
    Exception (either an error or timeout) detected by watchdog at work: 4213, last enqueued NCCL
        work: 4213, last completed NCCL work: 4212.

(pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ``WorkNCCL`` printing and the
watchdog's messages.) :func:`fields` returns them for a Finding's ``fields`` so the reasoning
across ranks can tell the rank that is behind (a lower last enqueued work) from those that wait.
"""

from __future__ import annotations

import re
from typing import Any

_WORK = re.compile(r"Work(?:NCCL|HCCL)\((?P<body>[^()]*(?:\([^()]*\)[^()]*)*)\)")
_KEY = re.compile(r"(?P<key>SeqNum|OpType|Timeout\(ms\)|NumelIn|NumelOut)=(?P<value>[^,)\s]+)")
_RAN = re.compile(r"ran for (?P<ms>\d+) milliseconds before timing out")
_PROGRESS = re.compile(r"(?:Timeout at (?:NCCL|HCCL) work|detected by watchdog at work): (?P<seq>-?\d+), "
                       r"last enqueued (?:NCCL|HCCL) work: (?P<enq>-?\d+), "
                       r"last completed (?:NCCL|HCCL) work: (?P<done>-?\d+)")
# the flight recorder's dump line (HeartbeatMonitor::getNCCLWatchdogTimeoutErrorMsg): "Received a dump
# signal due to a collective timeout from rank 7 (or: this local rank) ... Last enqueued NCCL work:
# 56118, last completed NCCL work: 56118." (issue 12 item 3: h12-reason)
_DUMP = re.compile(r"Last enqueued (?:NCCL|HCCL) work: (?P<enq>-?\d+), "
                   r"last completed (?:NCCL|HCCL) work: (?P<done>-?\d+)")
_FROM = re.compile(r"collective timeout from\s+(?:rank (?P<rank>\d+)|this local rank)")
_NAMES = {"SeqNum": "seq", "OpType": "op", "Timeout(ms)": "timeout_ms", "NumelIn": "numel_in",
          "NumelOut": "numel_out"}
_MARKERS = ("Work", "work: ")


def fields(text: str) -> dict[str, Any]:
    """Collective fields found in ``text`` (one line or a record's lines), first of each wins.

    Returns:
        Any of ``seq`` (int), ``op`` (str, e.g. ``ALLREDUCE``), ``timeout_ms``, ``ran_ms``,
        ``numel_in``, ``numel_out``, ``last_enqueued``, ``last_completed`` (ints), ``timeout_from``
        (the rank whose timeout a dump line reports, int, or ``"self"``); {} when the text names no
        collective.
    """
    if not any(m in text for m in _MARKERS):
        return {}
    out: dict[str, Any] = {}
    work = _WORK.search(text)
    if work:
        for m in _KEY.finditer(work.group("body")):
            name = _NAMES[m.group("key")]
            value = m.group("value")
            out[name] = value if name == "op" else _int(value)
    ran = _RAN.search(text)
    if ran:
        out["ran_ms"] = int(ran.group("ms"))
    progress = _PROGRESS.search(text)
    if progress:
        out.setdefault("seq", int(progress.group("seq")))
        out["last_enqueued"] = int(progress.group("enq"))
        out["last_completed"] = int(progress.group("done"))
    dump = None if progress else _DUMP.search(text)
    if dump:
        out["last_enqueued"] = int(dump.group("enq"))
        out["last_completed"] = int(dump.group("done"))
        sender = _FROM.search(text)
        if sender:
            out["timeout_from"] = int(sender.group("rank")) if sender.group("rank") else "self"
    return {k: v for k, v in out.items() if v is not None}


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None
