"""A store-based barrier that timed out with more arrivals than ranks: a member restarted alone.

PyTorch's ``init_process_group`` ends in ``_store_based_barrier`` (pytorch/pytorch
``torch/distributed/distributed_c10d.py``): each process adds 1 to the group's key
``store_based_barrier_key:<n>`` in the rendezvous store and waits until the count reaches the
world size (1.x: ``while worker_count != world_size``; 2.x: the process whose add makes the count
equal to the world size sets ``<key>:last_worker``, which the others wait for). When the timeout
passes it raises ``Timed out initializing process group in store based barrier on rank: R, for key:
K (world_size=N, worker_count=M, timeout=T)`` (2.x: ``DistStoreError`` with ``num_workers_joined=M``).

``M < N`` is the usual case: some ranks never arrived (a wrong address, a missing node, a launch
that started too few processes); the message alone does not say whose fault that is, and this
module leaves it alone. ``M > N`` is another thing: more processes arrived at this group's key than
the group has ranks, so a rank that had already passed the barrier arrived again. That is a member
that was restarted on its own (its pod rescheduled, a worker relaunched by its platform) and ran
``init_process_group`` again against the store of the group that had already formed. Such a group
never re-forms: the count can no longer equal the world size, and the old members are inside
collectives that wait for the process that is gone (plain DDP cannot take back a single restarted
member). Only a restart of every member gives a new store and a new group: the job hangs until
then (``hang``, ``restart_job``), whatever the restarted rank's own timeout says.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, is_error

#: The rule id of the regraded finding.
REJOINED_RULE = "c10d.barrier_rejoined"
_SOURCE = ("pytorch/pytorch torch/distributed/distributed_c10d.py _store_based_barrier (each process adds 1 to the "
           "group's barrier key and waits for the count to reach world_size; the timeout message reports world_size "
           "and worker_count / num_workers_joined): more arrivals than ranks is a rank arriving again, a member "
           "restarted alone into a group that had formed")
_COUNTS = re.compile(r"Timed out initializing process group in store based barrier\b.*?"
                     r"\(world_size=(\d+), (?:worker_count|num_workers_joined)=(\d+)")


#: Words every :data:`_COUNTS` match holds
_GATE = "store based barrier"


def counts(line: str) -> tuple[int, int] | None:
    """(world size, arrivals) of a store-based barrier's timeout message, or None."""
    m = _COUNTS.search(line)
    return (int(m[1]), int(m[2])) if m else None


def rejoined(f: Finding) -> bool:
    """True when ``f`` is a store-based barrier's timeout with more arrivals than ranks (an error the
    catalog did not already file as another failure's fallout)."""
    if not is_error(f) or f.failure_class in (FailureClass.FALLOUT, FailureClass.INFO):
        return False
    if _GATE not in f.line and not (f.evidence and _GATE in "\n".join(f.evidence)):
        return False                    # (root cause asks every finding of an incident: a substring test first)
    got = counts(f.line) or next((c for c in map(counts, f.evidence) if c), None)
    return got is not None and got[1] > got[0]


def restarted_alone(order: Sequence[Finding]) -> list[Finding]:
    """``order`` with each barrier timeout that counted more arrivals than ranks regraded as the job's hang."""
    return [dataclasses.replace(f, rule_id=REJOINED_RULE, failure_class=FailureClass.HANG,
                                action=Action.RESTART_JOB, source=_SOURCE) if rejoined(f) else f
            for f in order]
