"""Where a watched job runs again after a launcher finished it cleanly (``watch``, shipped logs).

Shipped logs carry no process exits, so a job's clean end is a launcher's torchelastic "worker
group successfully finished" line (``IncidentDesk.finished``). A job that runs again under its
name (a PyTorchJob applied again within ``limits.job_idle_seconds``, the same pod names or new
ones) is told by a torchelastic agent starting (``torchelastic.AGENT_STARTS``) in a pod whose
agent finished, or in any pod once none of the job's runs: an agent that logged its finish has
returned, so its start later in that pod's output is a new agent. Anything else a finished pod
prints (its agent's "Done waiting for other agents", a script run after torchrun) is the
finished run's. :func:`next_cut` says where ``watch`` cuts a job's chunks of one batch
(:func:`finishes_first`: each pod's finish before any start after it): the lines before go to
the finished run, the rest to a new one (``Watcher._run_again``).
"""

from __future__ import annotations

from typing import Sequence

from ftwatch.events import Origin
from ftwatch.parsers.torchelastic import agent_start_at, finish_end
from ftwatch.pipeline.incidents import IncidentDesk

__all__ = ["finishes_first", "next_cut", "runs_again"]


def runs_again(desk: IncidentDesk, origin: Origin) -> bool:
    """Whether a torchelastic agent starting in ``origin``'s output is ``desk``'s job running again:
    a launcher finished the job (``desk.finished_at``), no incident is open, and ``origin``'s
    pod finished (met, no longer timed as running) or none of the job's pods runs."""
    if desk.finished_at is None or desk.open is not None:
        return False
    running = {o.instance for o in desk.tracker.running}
    return not running or (origin.instance in desk.instances and origin.instance not in running)


def finishes_first(parts: list[tuple[Origin, bytes, float, object]]) -> list[tuple[Origin, bytes, float, object]]:
    """``parts`` (a job's chunks of one batch, ``(origin, data, time, hits)``) with every chunk in
    which an agent starts after a clean finish cut after that finish, the chunks up to the
    finishes first, then the rest (a batch keeps each stream's order, not the order between
    streams): every pod's finish in the batch is taken before any start after it is judged. A
    chunk cut so is scanned again (its halves' ``hits`` None)."""
    heads, tails = [], []
    for origin, data, t, hits in parts:
        end = finish_end(data)
        if 0 <= end < len(data) and agent_start_at(data, end) >= 0:
            heads.append((origin, data[:end], t, None))
            tails.append((origin, data[end:], t, None))
        else:
            heads.append((origin, data, t, hits))
    return heads + tails if tails else parts


def next_cut(desk: IncidentDesk, parts: Sequence[tuple[Origin, bytes, float, object]],
             clean: bool) -> tuple[int, int, bool] | None:
    """The first place the chunks ``parts`` (:func:`finishes_first`'s) of ``desk``'s job must be
    cut: ``(k, offset, again)``, the chunk ``parts[k]`` at ``offset``. ``again``: the job runs
    again from there (an agent's start line, :func:`runs_again`); else ``parts[k]`` is the last
    chunk holding a clean finish and a later one holds an agent's start (the desk takes the
    batch's finishes before that start is judged). None: no cut (``clean`` false: no chunk of the
    batch holds a finish). One pass over ``parts``."""
    last = max((k for k, part in enumerate(parts) if finish_end(part[1]) >= 0), default=-1) if clean else -1
    for k, (origin, data, _, _) in enumerate(parts):
        start = agent_start_at(data)
        if start >= 0 and runs_again(desk, origin):
            return k, start, True
        if k == last:
            return (k, len(data), False) if any(agent_start_at(p[1]) >= 0 for p in parts[k + 1:]) else None
    return None
