"""Ranks that said they have unequal numbers of batches: the uneven inputs of the program's data split
(SPEC R7, issue 12 item 3).

Every rank of a data-parallel group must issue the same collectives; PyTorch's own words for what
happens when they hold different amounts of data: "if a rank has fewer inputs, then the other ranks
will hang or error (depending on the backend)" (tutorial "Distributed Training with Uneven Inputs
Using the Join Context Manager"; ``torch.distributed.algorithms.Join`` exists for exactly that). Many
programs print, per rank, how many batches (or steps) the rank has for the epoch it starts
(``lifecycle.rank_batches`` in ``rules/packs/lifecycle.yaml``). When the latest such statement of
each rank, all printed together, do not agree, the ranks enter the epoch with unequal inputs: the
ones with fewer leave the loop while the others wait for them in the next step's collective.

:func:`unequal_counts` reads it for :func:`ftwatch.policy.leftpath.left_before_hang`: the count line a
job hang came right after is one of a group of such lines (each no more than :data:`GROUP_SECONDS`
before it), from at least two ranks, whose latest counts per rank differ. Counts that agree (every
rank has 4 batches) say nothing of the hang, which keeps its reading.
"""

from __future__ import annotations

import re
from typing import Sequence

from ftwatch.events import Finding

#: The rule whose line states one rank's batch count (lifecycle.yaml).
RANK_BATCHES = "lifecycle.rank_batches"
#: How far before the count line the job hang came right after the other ranks' statements may be
#: (seconds): the ranks print them as they start the same epoch.
GROUP_SECONDS = 300.0
_RANK = re.compile(r"(?i)\brank[\s:=]*(\d+)\b")
_COUNT = re.compile(r"(?i)\bnumber of (?:batches|steps)[\s:=]*(\d+)|\b(\d+) batches\b")


def _rank_and_count(f: Finding) -> tuple[int, int] | None:
    """(the rank, its count) a count line states; the origin's rank when the line names none."""
    rank = _RANK.search(f.line)
    count = _COUNT.search(f.line)
    who = int(rank.group(1)) if rank else f.rank
    if who is None or count is None:
        return None
    return who, int(count.group(1) or count.group(2))


def unequal_counts(last: Finding, before: Sequence[Finding]) -> dict[int, int] | None:
    """The ranks' batch counts when they disagree, or None.

    Args:
        last: the latest ``lifecycle.rank_batches`` line before the job hang.
        before: the incident's findings up to the hang.

    Returns:
        {rank: count} of each rank's latest count line no more than :data:`GROUP_SECONDS` before
        ``last`` (``last`` included), when two or more ranks stated counts and they are not all equal;
        else None.
    """
    counts: dict[int, int] = {}
    for f in sorted(before, key=lambda g: (g.time, g.seq)):
        if f.rule_id == RANK_BATCHES and last.time - GROUP_SECONDS <= f.time and (f.time, f.seq) <= (last.time, last.seq):
            got = _rank_and_count(f)
            if got is not None:
                counts[got[0]] = got[1]
    return counts if len(counts) >= 2 and len(set(counts.values())) > 1 else None
