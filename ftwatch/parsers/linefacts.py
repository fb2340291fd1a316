"""Fields that a rule condition may ask of one log line: exit code, signal, NCCL op (SPEC P2, P4).

Run only on lines the matcher already hit (a ``when:`` condition's predicate), so plain stdlib
regexes are fine. Each function returns None when the line says nothing of the kind.

Sources of the forms recognised:
    * exit codes: torchelastic's failure summary and agent log (``exitcode  : -9 (pid: 41)``,
      ``failed (exitcode: 1)``; pytorch/pytorch ``torch/distributed/elastic/multiprocessing/errors``),
      Slurm's ``srun: error: node1: task 0: Exited with exit code 1``, Kubernetes'
      ``Exit Code: 137`` / ``exitCode: 137``, Python's ``returned non-zero exit status 1``, Horovod's
      runner ``Process 2 exit with status code 143.`` (horovod/runner/gloo_run.py ``_exec_command``).
    * signals: a name (``SIGKILL``, ``Signals.SIGTERM``), ``signal 9`` / ``killed by signal 9``,
      and torchelastic's negative exit code (``exitcode: -9``: "killed by signal 9", as its
      ``ProcessFailure`` documents).
    * NCCL op: c10d's ``WorkNCCL(SeqNum=12, OpType=ALLREDUCE, ...)`` (pytorch/pytorch
      ``torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp``, ``operator<<(WorkNCCL)``) and NCCL's
      collective trace ``AllReduce: opCount 2a sendbuff ...`` (NVIDIA/nccl ``src/enqueue.cc``,
      ``NCCL_DEBUG_SUBSYS=COLL``). Names are normalised: upper case, without ``_``
      (``ALLREDUCE``, ``REDUCESCATTER``, ``_ALLGATHER_BASE`` -> ``ALLGATHERBASE``).
"""

from __future__ import annotations

import re
import signal as _signal

__all__ = ["exit_code_of", "signal_of", "nccl_op_of", "signal_number", "normalise_op"]

_EXIT = re.compile(r"(?i)\b(?:exit[ _]?(?:code|status)|exitcode|exited with (?:code|status)|exit with status code)"
                   r"\s*[:=]?\s*(-?\d{1,3})(?!\d)")
_SIG_NAME = re.compile(r"\bSIG([A-Z]{2,6}[12]?)\b")
_SIG_NUMBER = re.compile(r"(?i)\bsignal\s*[:=]?\s*(\d{1,2})\b")
_OP_TYPE = re.compile(r"\bOpType=([A-Za-z_]+)")
_COLL_TRACE = re.compile(r"\b(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|AllToAll|SendRecv|Send|Recv)"
                         r": opCount\b")


def exit_code_of(text: str) -> int | None:
    """The exit code a line reports (``exitcode: -9`` -> -9), or None."""
    m = _EXIT.search(text)
    return int(m.group(1)) if m else None


def signal_number(name: str) -> int | None:
    """``SIGKILL``, ``KILL``, ``sigkill`` or ``9`` -> 9; None for an unknown name."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(_signal.Signals[text])
    except KeyError:
        return None


def signal_of(text: str) -> int | None:
    """The signal number a line reports (a name, ``signal N``, or a negative exit code), or None."""
    for m in _SIG_NAME.finditer(text):
        number = signal_number(m.group(0))
        if number is not None:
            return number
    m = _SIG_NUMBER.search(text)
    if m:
        return int(m.group(1))
    code = exit_code_of(text)
    return -code if code is not None and -64 < code < 0 else None


def normalise_op(name: str) -> str:
    """``all_reduce``, ``AllReduce``, ``ALLREDUCE`` -> ``ALLREDUCE``."""
    return re.sub(r"[^A-Za-z0-9]", "", name).upper()


def nccl_op_of(text: str) -> str | None:
    """The collective a line names (normalised, see the module docstring), or None."""
    m = _OP_TYPE.search(text) or _COLL_TRACE.search(text)
    return normalise_op(m.group(1)) if m else None
