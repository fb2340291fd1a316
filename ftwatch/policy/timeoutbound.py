"""A collective timeout the program set tighter than any framework ships (SPEC R7, issue 12 item 3).

ProcessGroupNCCL's watchdog line states the bound it enforced: ``WorkNCCL(SeqNum=1411,
OpType=_ALLGATHER_BASE, ..., Timeout(ms)=5000) ran for 5070 milliseconds before timing out``
(``ftwatch.parsers.collective``: field ``timeout_ms``). That bound is the process group's
``timeout``, which the program passes to ``init_process_group`` / ``new_group`` (or a launcher or
trainer flag passes for it). What the frameworks ship:

* PyTorch: "Default value is 10 minutes for NCCL and 30 minutes for other backends"
  (``torch.distributed.init_process_group``, ``timeout``); DeepSpeed ``default_pg_timeout`` 30 min
  (deepspeed/constants.py); transformers ``TrainingArguments.ddp_timeout`` 1800 s.
* torchtitan, the tightest: ``comm.train_timeout_seconds = 100``, "Timeout for communication
  operations after the first train step -- usually a tighter bound than during initialization"
  (torchtitan/config/job_config.py, ``Comm``). Its maintainers set it to 100 s after a 5 s bound
  fired "without any real fault" on a profiling step (pytorch/torchtitan#189): a collective waits
  for the slowest rank to *arrive*, so the bound must cover the ranks' skew (a trace export, a
  log write, the first step's compilation), not only the transfer.

A watchdog that fired at a bound below :data:`TIGHTEST_DEFAULT_MS` measured the program's own
choice, not the network or a node: a restart runs under the same bound and the same skew, and
times out again (instructlab/training#520 set the bound to 1 ms on purpose and every attempt
failed on its first all-reduce). :func:`tight_bound` reads it: when every error to explain is a
wait (a collective timeout, its follow-on lines, a job hang, an exit nothing of its own
explains) and every bound the timed-out collectives state is below :data:`TIGHTEST_DEFAULT_MS`,
the root cause is ``collective.timeout_below_default`` (user_code, fail_job) on the first
timeout. A rank's own error (a crash, an OOM, a hardware fault) is no wait and keeps its reading;
a bound at or above the tightest default keeps the hang readings (``ftwatch.policy.collectives``).
"""

from __future__ import annotations

import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity
from ftwatch.policy.busy import died_on_its_own
from ftwatch.policy.collectives import FOLLOW_ON_RULES, TIMEOUT_RULES

#: torchtitan's ``comm.train_timeout_seconds`` (ms): the tightest collective timeout a framework ships.
TIGHTEST_DEFAULT_MS = 100_000
#: gloo's wait (pytorch/gloo gloo/transport/tcp/unbound_buffer.cc) states the same process-group timeout
_GLOO_WAIT = re.compile(r"Timed out waiting (\d+) ?ms for (?:recv|send) operation")
SOURCE = ("torch.distributed.init_process_group (timeout: 10 min for NCCL by default); torchtitan "
          "config/job_config.py Comm.train_timeout_seconds = 100 ('usually a tighter bound') and "
          "pytorch/torchtitan#189 (5 s fired on a profiling step without a fault); ProcessGroupNCCL.cpp "
          "watchdog line (WorkNCCL ... Timeout(ms)=N)")


def bound_ms(f: Finding) -> int | None:
    """The collective timeout a timeout line states, in ms: the watchdog's ``Timeout(ms)=N``
    (``fields["timeout_ms"]``, ``ftwatch.parsers.collective``) or gloo's ``Timed out waiting <N>ms
    for recv|send operation``; None when the line states none."""
    if isinstance(f.fields.get("timeout_ms"), int):
        return f.fields["timeout_ms"]
    m = _GLOO_WAIT.search(f.line)
    return int(m.group(1)) if m else None


def _wait(f: Finding) -> bool:
    """``f`` only says the job waited: a job hang, a collective timeout or its follow-on line,
    fallout, or an exit that says nothing of its own (``busy.died_on_its_own`` false)."""
    if f.kind == "hang" or f.rule_id in TIMEOUT_RULES or f.rule_id in FOLLOW_ON_RULES:
        return True
    if f.kind == "exit_code":
        return not died_on_its_own(f)
    return f.failure_class is FailureClass.FALLOUT


def tight_bound(order: Sequence[Finding], errors: Sequence[Finding]) -> Finding | None:
    """``collective.timeout_below_default`` (the module docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        errors: the errors to explain (the real ones, or the fallout when there is none).

    Returns:
        A Finding on the first timed-out collective's origin and (time, seq), or None when an
        error is no wait, no timeout states its bound, or a bound is at least
        :data:`TIGHTEST_DEFAULT_MS`.
    """
    if not errors or not all(_wait(f) for f in errors):
        return None
    timeouts = [f for f in order if f.rule_id in TIMEOUT_RULES and bound_ms(f) is not None]
    if not timeouts:
        return None
    bound = max(bound_ms(f) or 0 for f in timeouts)
    if bound >= TIGHTEST_DEFAULT_MS:
        return None
    first = timeouts[0]
    line = (f"the collective timed out at a bound of {bound} ms ({first.rule_id}: {first.line.strip()[:160]}), "
            f"below the tightest timeout a framework ships ({TIGHTEST_DEFAULT_MS // 1000} s, torchtitan's "
            "train_timeout_seconds; PyTorch's default is 10 min): the watchdog measured the program's own "
            "setting against its ranks' normal skew, which a restart under the same timeout meets again")
    return Finding("collective.timeout_below_default", "collective", FailureClass.USER_CODE, Action.FAIL_JOB,
                   Severity.ERROR, first.origin, line, first.time, first.seq, (first.line,),
                   {"timeout_ms": bound, "tightest_default_ms": TIGHTEST_DEFAULT_MS}, SOURCE)
