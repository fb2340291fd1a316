"""The node check (SPEC H2; DLRover's ``--network-check``, seed 003), planning and verdicts.

Each node (on one machine: each worker group) runs a timed matrix multiply plus an allgather and
an all-reduce together with a partner. Round 1 pairs neighbours (0-1, 2-3, ...); round 2 orders
the nodes by their round-1 time, failed ones last, and pairs the fastest with the slowest, so a
node that failed gets a partner that is known to work. An odd node out is paired with the first
(fastest) node in a second wave of the same round, never left unchecked.

Verdicts, per node, from the rounds' times (a node's time is its GEMM time plus its own
collective time, measured after a barrier, so a fast partner of a slow node is not blamed):

* ``faulty``: its own check process died (the runner says ``down``: it ended, an exit code or a
  signal, rather than reporting a failed collective), or it failed every round it was in and at
  least one of its partners succeeded in another pair: the failure follows the node ("The node is
  down.", DLRover's message).
* ``ok`` with no time: it failed only in pairs whose partner's process died: the crash is the
  evidence, the survivor is not blamed (with 2 nodes this is what tells the sides apart).
* ``suspect``: it failed every round, but so did every partner it had, and no process died:
  with 2 nodes (or when all fail) the check cannot say which side is at fault, so nobody is called
  faulty. DLRover needs at least 4 nodes and otherwise fails the job; here the report says what
  is known instead.
* ``straggler``: its best time is above ``factor`` x the median of the nodes' best times
  (DLRover: 2x); "The node is a straggler and exits." when stragglers are excluded. With 2 nodes
  the median is the pair's mean and 2x the mean can never be exceeded, so the slower node is a
  ``suspect_straggler`` when it is ``factor`` x slower than its only peer (reported, not excluded).
* ``ok`` otherwise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ftwatch.config.supervisor import parse_elastic_range

Group = tuple[int, ...]
DOWN = "The node is down."
NOISE_FLOOR_S = 0.02   # seconds: a node is never a straggler for being slower by less than this
STRAGGLER_EXITS = "The node is a straggler and exits."


def parse_range(text: str | int, name: str = "--nnodes") -> tuple[int, int]:
    """``"3"`` -> (3, 3); ``"2:4"`` -> (2, 4) (torchrun's / dlrover-run's elastic MIN:MAX), by
    :func:`ftwatch.config.supervisor.parse_elastic_range`, the one parser of such ranges.

    Raises:
        ValueError: not ``N`` or ``MIN:MAX`` with 1 <= MIN <= MAX (the message names ``name``).
    """
    try:
        r = parse_elastic_range(text)
    except ValueError as exc:
        raise ValueError(f"{name}={text}: {exc}") from None
    return r.min, r.max


def waves(groups: Sequence[Group]) -> list[list[Group]]:
    """Split a round's groups into waves that run at once: no node is in two groups of a wave."""
    out: list[list[Group]] = []
    for group in groups:
        for wave in out:
            if not any(set(group) & set(g) for g in wave):
                wave.append(group)
                break
        else:
            out.append([group])
    return out


def pair_neighbours(nodes: Sequence[int]) -> list[Group]:
    """Round 1: (0, 1), (2, 3), ...; an odd last node is paired with the first node."""
    nodes = list(nodes)
    groups: list[Group] = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 and len(nodes) > 1:
        groups.append((nodes[-1], nodes[0]))
    return groups


def pair_fastest_slowest(times: Mapping[int, float | None]) -> list[Group]:
    """Round 2: the fastest with the slowest, the 2nd fastest with the 2nd slowest ...; failed
    nodes (time None) count as the slowest. An odd middle node is paired with the fastest."""
    order = sorted(times, key=lambda n: (times[n] is None, times[n] or 0.0, n))
    groups: list[Group] = []
    i, j = 0, len(order) - 1
    while i < j:
        groups.append((order[i], order[j]))
        i, j = i + 1, j - 1
    if i == j and len(order) > 1:
        groups.append((order[i], order[0]))
    return groups


@dataclass
class RoundResult:
    """One round: its groups and each node's time (seconds) or None when its check failed.

    A node in two groups of a round (the odd one out's partner) keeps its best time in ``times``;
    ``by_group`` keeps each group's own times (the round's report line). ``down``: the nodes whose
    check process died in this round.
    """

    number: int
    groups: list[Group]
    times: dict[int, float | None] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    down: set[int] = field(default_factory=set)
    by_group: dict[Group, dict[int, float | None]] = field(default_factory=dict)

    def record(self, node: int, time: float | None, error: str = "", down: bool = False,
               group: Group | None = None) -> None:
        """Take one node's result (seconds or None, the error, whether its process died) in ``group``."""
        if group is not None:
            self.by_group.setdefault(group, {})[node] = time
        if down:
            self.down.add(node)
        old = self.times.get(node)
        if time is not None and (old is None or time < old):
            self.times[node] = time
            self.errors.pop(node, None)
        elif node not in self.times:
            self.times[node] = None
            self.errors[node] = error


@dataclass(frozen=True)
class NodeVerdict:
    """What the check says about one node: ``status`` is ``ok``, ``faulty``, ``suspect``,
    ``straggler`` or ``suspect_straggler``; ``best`` its best time (s); ``slowdown`` its best time
    over the median (or over its only peer's, with 2 nodes); ``message`` for people."""

    node: int
    status: str
    best: float | None
    slowdown: float | None
    message: str


def best_of(node: int, rounds: Sequence[RoundResult]) -> float | None:
    """The node's best time (s) over the rounds, None when it has none."""
    return min((r.times[node] for r in rounds if r.times.get(node) is not None), default=None)


def verdicts(nodes: Sequence[int], rounds: Sequence[RoundResult], factor: float = 2.0) -> tuple[list[NodeVerdict], list[str]]:
    """Judge each node from the rounds (see the module docstring). Returns (verdicts, notes), the
    notes saying what could not be concluded."""
    notes: list[str] = []
    died = {n for r in rounds for n in r.down}
    ok_any = {n: n not in died and any(r.times.get(n) is not None for r in rounds) for n in nodes}
    partners: dict[int, set[int]] = {n: set() for n in nodes}
    excused: dict[int, bool] = {n: True for n in nodes}   # every failed pair of it had a partner that died
    for r in rounds:
        for g in r.groups:
            times = r.by_group.get(g, r.times)
            if any(times.get(n) is None for n in g):
                for n in g:
                    partners[n] |= set(g) - {n}
                    if times.get(n) is None and not (set(g) - {n}) & r.down:
                        excused[n] = False
    best = {n: None if n in died else best_of(n, rounds) for n in nodes}
    timed = {n: t for n, t in best.items() if t is not None}
    median = statistics.median(timed.values()) if timed else None
    out: list[NodeVerdict] = []
    for n in nodes:
        if not ok_any[n]:
            errs = "; ".join(sorted({r.errors.get(n, "") for r in rounds if r.errors.get(n)}))
            if n not in died and excused[n] and best_of(n, rounds) is None:
                gone = sorted(p for p in partners[n] if p in died)
                out.append(NodeVerdict(n, "ok", None, None, f"no time: it failed only with partners whose check "
                                                            f"process died {gone}; not blamed"))
                continue
            if n in died or any(ok_any[p] for p in partners[n]):
                out.append(NodeVerdict(n, "faulty", None, None, f"{DOWN} ({errs})" if errs else DOWN))
            else:
                others = sorted(partners[n])
                out.append(NodeVerdict(n, "suspect", None, None,
                                       f"failed every round, and so did its partners {others}: the check cannot "
                                       f"tell whether node {n}, a partner or the link between them is at fault"))
                note = (f"with {len(nodes)} nodes a failed pair has no third node to tell which side is faulty"
                        if len(nodes) < 3 else "every pair this node was in failed")
                if note not in notes:
                    notes.append(note)
            continue
        t = best[n]
        assert t is not None and median is not None
        if len(timed) >= 3:
            slow = t / median if median > 0 else 1.0
            if slow > factor and t - median > NOISE_FLOOR_S:
                out.append(NodeVerdict(n, "straggler", t, slow, f"{slow:.1f}x the median time ({t:.3f} s vs "
                                                                  f"{median:.3f} s)"))
                continue
            out.append(NodeVerdict(n, "ok", t, slow, f"{t:.3f} s ({slow:.2f}x the median)"))
        elif len(timed) == 2:
            peer = next(v for m, v in timed.items() if m != n)
            slow = t / peer if peer > 0 else 1.0
            if slow > factor and t - peer > NOISE_FLOOR_S:
                out.append(NodeVerdict(n, "suspect_straggler", t, slow,
                                       f"{slow:.1f}x slower than its only peer; with 2 timed nodes the "
                                       f"{factor:g}x-median rule cannot fire, so it is reported, not excluded"))
                continue
            out.append(NodeVerdict(n, "ok", t, slow, f"{t:.3f} s"))
        else:
            out.append(NodeVerdict(n, "ok", t, None, f"{t:.3f} s (the only timed node: no straggler check)"))
    if len(timed) == 2:
        notes.append("2 timed nodes: the median is their mean, so stragglers are only suspected, never excluded")
    return out, notes


#: group -> {node: (seconds or None, error)} or (seconds or None, error, its process died)
Runner = Callable[[Group], Mapping[int, tuple]]


def check(nodes: Sequence[int], run: Runner, factor: float = 2.0) -> tuple[list[RoundResult], list[NodeVerdict], list[str]]:
    """Run both rounds with ``run`` (group -> {node: (time or None, error)}) and judge.

    ``run`` is called wave by wave (groups of a wave could run at once; this calls them one by
    one, the caller may batch). Returns (rounds, verdicts, notes).
    """
    rounds: list[RoundResult] = []
    for number, groups in ((1, pair_neighbours(nodes)), (2, None)):
        if groups is None:
            groups = pair_fastest_slowest(rounds[0].times)
        result = RoundResult(number, groups)
        for wave in waves(groups):
            for group in wave:
                for node, answer in run(group).items():
                    time, error, *down = answer
                    result.record(node, time, error, bool(down and down[0]), group)
        rounds.append(result)
    if len(nodes) < 2:
        return rounds, [NodeVerdict(n, "ok", None, None, "a single node: nothing to pair with") for n in nodes], [
            "a single node cannot be checked against a peer"]
    found, notes = verdicts(nodes, rounds, factor)
    return rounds, found, notes
