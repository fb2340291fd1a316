"""A collective timeout configured too short to tell a hang from work (issue 12: configuration read as a hang).

A watchdog timeout says only that a rank waited longer than the process group's timeout for its
peers. With the defaults that wait is minutes (PyTorch's ``init_process_group``: 10 minutes for
NCCL, 30 for the other backends, pytorch/pytorch PR #110947 "30 minutes (or 10 minutes) should
provide ample headroom for edge cases"; Hugging Face Trainer's ``ddp_timeout`` 1800 s), and a
wait that long means a rank did not come: a hang. A timeout of milliseconds or seconds is passed by
a healthy job's ordinary work between two collectives (a step's compute on a slower rank, a trace
export, a checkpoint write, the first collective's communicator set-up): pytorch/torchtitan PR #189
raised its training-phase default from 5 s to 100 s because a profiling step alone outlasts 5 s
and the watchdog fired with no fault at all; instructlab/training PR #520 set 1 ms to prove the
setting reaches the process group, and the first all-reduce timed out on every rank. The same
setting fires again after a restart, so the reading is the job's configuration (user_code,
fail_job), not a hang to restart.

:func:`too_short`: when an incident holds only collective timeouts and their fallout (no rank's
own error; the caller checks) and the watchdog lines give the configured timeout
(the watchdog's ``Timeout(ms)=N``, ``ftwatch.parsers.collective``; gloo's ``Timed out waiting
<N>ms``), every one of them under
:data:`SHORTEST_PLAUSIBLE_MS`, the root cause is a finding ``collective.timeout_too_short`` on the
first reporter. A timeout of a minute or more keeps the hang reading (and the readings of
``ftwatch.policy.collectives``): it is a choice a job can make for a fast hang detection.
"""

from __future__ import annotations

import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity
from ftwatch.policy.collectives import TIMEOUT_RULES

RULE = "collective.timeout_too_short"
#: Below a minute: an order of magnitude under PyTorch's NCCL default (10 min) and the timeouts
#: frameworks set (torchtitan's training default 100 s after 5 s proved too tight).
SHORTEST_PLAUSIBLE_MS = 60_000
#: gloo's wait (pytorch/gloo gloo/transport/tcp/unbound_buffer.cc): the same process-group timeout
_GLOO_WAIT = re.compile(r"Timed out waiting (\d+) ?ms for (?:recv|send) operation")
SOURCE = ("pytorch/pytorch torch/distributed/distributed_c10d.py init_process_group (timeout default: 10 minutes "
          "for NCCL, 30 minutes otherwise) and PR #110947; pytorch/torchtitan PR #189 (a 5 s training timeout "
          "fired on a profiling step: raised to 100 s); ProcessGroupNCCL.cpp WorkNCCL(... Timeout(ms)=N)")


def configured_ms(f: Finding) -> int | None:
    """The collective timeout a timeout line gives, in ms: the watchdog's ``Timeout(ms)=N``
    (``fields["timeout_ms"]``), gloo's ``Timed out waiting <N>ms for recv|send operation``; else None."""
    if isinstance(f.fields.get("timeout_ms"), int):
        return f.fields["timeout_ms"]
    m = _GLOO_WAIT.search(f.line)
    return int(m.group(1)) if m else None


def too_short(fallout: Sequence[Finding]) -> Finding | None:
    """The ``collective.timeout_too_short`` root cause, or None.

    Args:
        fallout: an incident's fallout findings when nothing else is a real error (the caller
            checks that every rank only waited: ``collectives.timeouts_only``).

    Returns:
        A Finding (kind ``collective``, user_code, fail_job) on the earliest timeout line, its
        ``fields`` holding ``timeout_ms`` (the largest configured timeout read) and ``reporters``;
        None when no timeout line gives its configured timeout or one of them is a minute or more.
    """
    timed = sorted((f for f in fallout if f.rule_id in TIMEOUT_RULES and configured_ms(f) is not None),
                   key=lambda f: (f.time, f.seq))
    if not timed:
        return None
    longest = max(configured_ms(f) or 0 for f in timed)
    if longest >= SHORTEST_PLAUSIBLE_MS:
        return None
    first = timed[0]
    reporters = sorted({f.rank for f in timed if f.rank is not None})
    line = (f"the collective timeout is {longest} ms (Timeout(ms) of the watchdog lines), far below the minutes "
            f"a collective's wait is given by default: ordinary work between collectives outlasts it, and the "
            f"same setting fires again after a restart ({first.line[:160]})")
    return Finding(RULE, "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR, first.origin,
                   line, first.time, first.seq, (first.line,),
                   {"timeout_ms": longest, "reporters": reporters, "op": first.fields.get("op"),
                    "seq": first.fields.get("seq")}, SOURCE)
