"""Which findings open an incident by themselves (SPEC R8, R3; seeds/000 C4D配置说明).

A failing exit or a hang always opens one (the runner and the hang tracker see to that). A log
finding opens one when the policy has something to say about it while the workers still run:

* a C4D record graded at or above ``--c4d-log-level`` (an Error isolates at once when C4D hang
  detection is on: AIMaster isolates the node named in the record directly; a Warn or Info asks a
  person: notify);
* a finding whose rule recommends ``notify`` (e.g. an NPU ``PreSeparateNPU`` code) or
  ``isolate_node`` (a chip or node that must go), unless its class is ``info``.

``ftwatch run``, ``ftwatch watch`` and ``ftwatch replay`` use the same test, so the three agree on
when a notify decision is made. A notify decision stops nothing.
"""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding
from ftwatch.policy.c4d import LEVELS, C4DSettings, grade, is_c4d, parse_line


def opens_incident(f: Finding, c4d: C4DSettings) -> bool:
    """True when the log finding ``f`` opens an incident without a failing exit (see the module
    docstring). ``c4d`` gives ``--c4d-log-level`` and the C4D arithmetic (a Warn whose ``times``
    reaches C4D_HANG_TIMES counts as an Error)."""
    if is_c4d(f):
        rec = parse_line(f.line)
        if rec is None:
            return False
        level, _ = grade(rec, c4d)
        return LEVELS.index(level) >= LEVELS.index(c4d.log_level)
    if f.failure_class is FailureClass.INFO:
        return False
    return f.action in (Action.NOTIFY, Action.ISOLATE_NODE)
