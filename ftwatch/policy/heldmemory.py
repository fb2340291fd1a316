"""A GPU whose memory was taken before the job used it: the node's state, not the job's need.

PyTorch's caching allocator reports an out-of-memory error with the device's figures
(pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp``, ``NativeCachingAllocator::malloc``'s
OOM message): before 2.1 ``(GPU g; T total capacity; A already allocated; F free; R reserved in
total by PyTorch)``, since 2.1 ``GPU g has a total capacity of T of which F is free. ... Of the
allocated memory A is allocated by PyTorch, and U is reserved by PyTorch but unallocated``. ``T``
and ``F`` are the driver's ``cudaMemGetInfo``; ``R`` (or ``A + U``) is everything this process's
allocator holds. So ``T - F - R`` is memory the allocator does not hold: the CUDA context (a few
hundred MiB) and memory other processes or leaked contexts hold on the device (PyTorch's "CUDA
semantics" notes, "Memory management": memory reserved by PyTorch is what its caching allocator
holds; "other GPU applications" use the rest). NVIDIA's nvidia-smi(1) documents the clean-up
this state needs on the node: the processes holding the device are ended, or the GPU is reset
(``--gpu-reset``: "Resets the GPU state", it requires that no process uses the GPU).

When a process's allocator holds almost nothing (``OWN_SHARE`` of the capacity) and the device
is almost full (``FULL_SHARE`` free at most), the memory was taken before the job used the
device: the job's need did not exhaust it, and a relaunch on that GPU meets the same held memory
until someone cleans the node. :func:`held_elsewhere` regrades such an OOM ``hardware_node`` /
``isolate_node`` (take the node out of the job's placement; a person frees it). Only when the
incident has one instance (of those with a rank, where any has one: a launcher's own lines, such
as torchrun's summary, are no process on the GPU): in a job of several processes a misplaced peer on the same GPU (every
rank on ``cuda:0``) takes memory the same way, and that is the program's. An OOM after the
process had used a real share of the device is its own need, whatever else shares the GPU (a
co-located inference engine of the same job, the PID lines of PyTorch 2.1+ that a container
prints for the process itself).

The same holds, with no figures, for the CUDA runtime's own ``CUDA error: out of memory``
(``cudaErrorMemoryAllocation``) raised while the process makes its CUDA context: the traceback's
innermost frame is ``torch._C._cuda_setDevice`` (``torch.cuda.set_device``) or
``torch._C._cuda_init`` (the lazy initialisation of the first CUDA call). The runtime initialises
a device's primary context there (CUDA Runtime API, "Interactions with the CUDA Driver API":
``cudaSetDevice`` makes the primary context current, the first call that needs a context
initialises it), before the process allocated anything of its own, so the device had no room
even for a context. Recorded on an H200 (``tools/gpu_capture.sh gpu_held``): a process holding
139 of the GPU's 140 GiB made a one-rank job's ``torch.cuda.set_device`` fail this way, on every
start on that node.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding

#: The rule id of the regraded finding.
HELD_RULE = "cuda.memory_held_elsewhere"
#: At most this share of the capacity held by the process's own allocator: it had used nothing.
OWN_SHARE = 0.05
#: At most this share of the capacity free: the device was full.
FULL_SHARE = 0.05
_SOURCE = ("pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (OOM message: total capacity and free from "
           "cudaMemGetInfo, reserved = what this process's allocator holds); PyTorch 'CUDA semantics: Memory "
           "management'; nvidia-smi(1) --gpu-reset (a GPU held outside the job is freed on the node)")
_CONTEXT_SOURCE = ("CUDA Runtime API, 'Interactions with the CUDA Driver API' (cudaSetDevice makes the device's "
                   "primary context current; the first call that needs a context initialises it); pytorch/pytorch "
                   "torch/cuda/__init__.py (set_device -> torch._C._cuda_setDevice, _lazy_init -> "
                   "torch._C._cuda_init); recorded on an H200 with another process holding the GPU's memory "
                   "(tools/gpu_capture.sh gpu_held)")
#: The CUDA runtime's out-of-memory error as PyTorch raises it (not the caching allocator's message).
_RUNTIME_OOM = "CUDA error: out of memory"
#: The frames of a process making its CUDA context: ``torch.cuda.set_device``, the lazy init.
_CONTEXT_FRAME = re.compile(r"\btorch\._C\._cuda_(?:setDevice|init)\(")
_UNITS = {"B": 2 ** -30, "bytes": 2 ** -30, "KiB": 2 ** -20, "MiB": 2 ** -10, "GiB": 1.0, "TiB": 2 ** 10}
_NUM = r"([\d.]+) (B|bytes|KiB|MiB|GiB|TiB)"
_OLD = re.compile(rf"\(GPU \d+; {_NUM} total capacity; .*?{_NUM} free; {_NUM} reserved in total by PyTorch\)")
_NEW = re.compile(rf"GPU \d* ?has a total capac(?:i)?ty of {_NUM} of which {_NUM} is free\..*?"
                  rf"Of the allocated memory {_NUM} is allocated by PyTorch, and {_NUM} is reserved")


def _gib(number: str, unit: str) -> float:
    return float(number) * _UNITS[unit]


def figures(line: str) -> tuple[float, float, float] | None:
    """The device's figures in an OOM message of PyTorch's caching allocator.

    Args:
        line: a log line (or a finding's evidence joined).

    Returns:
        ``(total, free, own)`` in GiB, ``own`` being what this process's allocator holds; None
        when the line carries neither format.
    """
    m = _OLD.search(line)
    if m:
        return _gib(m[1], m[2]), _gib(m[3], m[4]), _gib(m[5], m[6])
    m = _NEW.search(line)
    if m:
        return _gib(m[1], m[2]), _gib(m[3], m[4]), _gib(m[5], m[6]) + _gib(m[7], m[8])
    return None


def held_elsewhere(head: Finding, order: Sequence[Finding]) -> Finding | None:
    """``head`` regraded as a device held outside the job, when its figures say so.

    Args:
        head: the incident's earliest real error.
        order: all the incident's findings (to count its instances).

    Returns:
        A copy of ``head`` with rule ``cuda.memory_held_elsewhere``, ``hardware_node`` /
        ``isolate_node``, when ``head`` is an out-of-memory error whose own figures show a full
        device that its process's allocator holds (almost) none of, or the CUDA runtime's
        out-of-memory error raised while its process made its CUDA context, in a one-instance
        incident; else None.
    """
    if head.failure_class is not FailureClass.OOM:
        return None
    ranked = {f.origin.instance for f in order if f.origin.rank is not None}
    if len(ranked or {f.origin.instance for f in order}) > 1:   # a launcher's own lines are no process of the job
        return None
    got = figures(" ".join((head.line, *head.evidence)))
    if got is None:
        if _RUNTIME_OOM not in head.line or not any(map(_CONTEXT_FRAME.search, head.evidence)):
            return None
        fields, source = {"at": "context creation"}, _CONTEXT_SOURCE
    else:
        total, free, own = got
        if total <= 0 or own > OWN_SHARE * total or free > FULL_SHARE * total:
            return None
        fields, source = {"total_gib": round(total, 2), "own_gib": round(own, 3)}, _SOURCE
    return dataclasses.replace(head, rule_id=HELD_RULE, failure_class=FailureClass.HARDWARE_NODE,
                               action=Action.ISOLATE_NODE, fields={**head.fields, **fields}, source=source)
