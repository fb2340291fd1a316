"""A job's output into its :class:`~ftwatch.pipeline.incidents.IncidentDesk`: one stream's chunk
(:func:`output`) or one batch of many streams' chunks (:func:`output_many`, ``watch``), each chunk's
findings taken into the desk (:func:`take`). ``IncidentDesk.output`` and ``output_many`` call
these. Split from ``ftwatch.pipeline.incidents`` (this module's one job: the output path), which
keeps opening, settling and deciding the incident.

A chunk meets its instance (a desk without exits meets instances by their output), feeds the hang
tracker, is counted, keeps its stream's last non-empty line (for the exit reader), and is read:

- for progress before the error (SPEC R6, ``ftwatch.policy.initphase.FirstProgress``): each
  stream's chunks are read for progress lines until it shows ``progress.MARKS`` of them (then it
  costs a dict lookup); the earliest such time of the attempt is the incident's ``progress_at``,
  by which the policy tells an error of a job that never trained (configuration at
  initialisation) from the same error after progress;
- by the engine (its findings) and, where the desk reads them, for torchelastic summaries;
- for the progress of an instance whose error waits (``ftwatch.pipeline.notices``).

What it keeps is the desk's: its instances, each stream's last line (``_tails``), the hang
re-arm flag, and the held incident's ``_alive`` (its instance printed after its error).

Host evidence (``ftwatch.pipeline.sources.hostlog``: a node's kernel / driver lines, the driver
hands them in with that job in their origin) is output like any other and counts by its time, but
its origin is never an instance: it starts no hang timer, counts in no world size and fails no
instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ftwatch.events import Finding, Origin
from ftwatch.parsers import chunks
from ftwatch.parsers import fields as line_fields
from ftwatch.parsers.torchelastic import holding_summary, may_hold_summary
from ftwatch.pipeline.notices import notice
from ftwatch.pipeline.sources.hostlog import is_host

if TYPE_CHECKING:
    from ftwatch.pipeline.incidents import IncidentDesk


def output(desk: IncidentDesk, origin: Origin, data: bytes, time: float, mono: float = 0.0, *,
           final: bool = False, sim_step: float = 0.0, hits: list[tuple[int, int]] | None = None,
           defer: list | None = None) -> Finding | None:
    """A chunk of complete lines from ``origin``.

    Args:
        origin: the stream.
        data: ``b"\\n"``-separated lines (the last may lack its newline).
        time: epoch seconds it was read at (replay: its first line's time).
        mono: monotonic seconds now.
        final: the stream ended (a replayed file): its open blocks close.
        sim_step: replay's seconds per untimed line (``Engine.feed``).
        hits: ``data``'s hits when the caller scanned many chunks at once (``Engine.scan_many``).
        defer: the batch's step-line parts (``Engine.feed``'s ``defer``; :func:`output_many`).

    Returns:
        The finding that opened an incident, or a failing exit a summary reported; else None.
    """
    if not is_host(origin):                     # a node's kernel log: evidence, never an instance
        if origin.instance not in desk.instances and not desk.exits:
            desk.started(origin, time)
        else:
            desk.instances.touch(origin.instance)
        desk.tracker.output(origin.instance, time)
        if desk._hang_notified:
            desk._hang_notified = False
            desk.tracker.rearm()
    lines = chunks.newlines(data) + (1 if data and not data.endswith(b"\n") else 0)
    desk.recorder.output(origin, lines, len(data), time)
    end = len(data)
    while end and data[end - 1] in b" \t\r\n":     # the last non-empty line, without copying the chunk
        end -= 1
    if end:
        desk._tails[origin] = data[data.rfind(b"\n", 0, end) + 1:end]
    if desk.progress.wants(origin) and not is_host(origin):
        desk.progress.read(origin, data, time, sim_step, desk.engine.year or line_fields.year_of(time))
    found = desk.engine.feed(origin, data, time, final=final, sim_step=sim_step, hits=hits, defer=defer,
                             counted=lines)
    if desk.summaries is not None and (may_hold_summary(data) or origin in desk._exits.summary_lines):
        found += desk._exits.summary(origin, data, time)
    return take(desk, origin, data, time, mono, found, sim_step)


def take(desk: IncidentDesk, origin: Origin, data: bytes, time: float, mono: float, found: list[Finding],
         sim_step: float = 0.0) -> Finding | None:
    """The findings of ``origin``'s chunk ``data`` join the job (``IncidentDesk.add``); then its instance
    printed after the open incident's error, and the chunk is read for the waiting errors'
    progress. Returns :func:`output`'s trigger."""
    opened = desk.open
    trigger = desk.add(found, mono)
    if desk._held and opened is not None and opened is desk.open and _printed_by(opened, origin.instance):
        desk._alive = True                      # it printed after its error: wait for its progress
    if not is_host(origin) and desk.survival.watches(origin):
        year = desk.engine.year or line_fields.year_of(time)
        for f, at in desk.survival.outlived(origin, data, time, sim_step, year):
            notice(desk, f, at, f"{f.origin.instance} made progress after it: the job outlived it")
    return None if trigger is not None and desk.survival.is_notice(trigger) else trigger


def output_many(desk: IncidentDesk, parts: Sequence[tuple[Origin, bytes, float, list[tuple[int, int]] | None]],
                mono: float = 0.0) -> Finding | None:
    """Chunks of many origins of this job at once (``watch``: one batch's, its origins carried
    beside the chunks): the same as :func:`output` of each in order, but a chunk with no
    summary words or summary under way only meets its instance, keeps its last line, is
    counted (the metrics once per batch, ``Recorder.output_many``) and goes to the engine
    only when a rule or the step tap hit it or its origin carries an open block
    (``Engine.count_if_quiet``); the step lines of every such chunk (those only the step tap
    hit, and those ``Engine.feed`` of a chunk a rule hit defers) go to the tap together after
    the others (``Engine.feed_steps``: one call per job and batch, the ranks' verdicts once for
    the batch, whether or not a rule hit the chunk); only
    findings, and chunks of an instance whose error waits for its progress, go further
    (:func:`take`).

    Args:
        parts: ``(origin, data, time, hits)`` per chunk, in input order, as for :func:`output`
            (``hits`` from ``Engine.scan_many``; None: scanned here).
        mono: monotonic seconds now.

    Returns:
        The first trigger :func:`output` returned for one of them, else None.
    """
    trigger = None
    counts: list[tuple[Origin, int, int, float]] = []
    stepping: list[tuple[Origin, bytes, float, list]] = []     # step lines, for one tap call
    engine, survival, summary_lines = desk.engine, desk.survival, desk._exits.summary_lines
    summaries = holding_summary([p[1] for p in parts]) if desk.summaries is not None else ()
    instances, tails, heard = desk.instances, desk._tails, desk.tracker.output
    touch, exits = instances.move_to_end, desk.exits
    quiet, steps_only = engine.count_if_quiet, engine.steps_only
    for k, (origin, data, time, hits) in enumerate(parts):
        if ((summaries and k in summaries) or is_host(origin)
                or (summary_lines and origin in summary_lines)):
            if counts:                          # counted in input order (the store's buckets)
                desk.recorder.output_many(counts)
                counts = []
            found = output(desk, origin, data, time, mono, hits=hits, defer=stepping)
            trigger = trigger or found
            continue
        instance = origin.instance
        if instance in instances:
            touch(instance)
        elif not exits:
            desk.started(origin, time)
        heard(instance, time)
        if desk._hang_notified:
            desk._hang_notified = False
            desk.tracker.rearm()
        end = len(data)
        counts.append((origin, chunks.newlines(data) + (1 if data and not data.endswith(b"\n") else 0), end, time))
        while end and data[end - 1] in b" \t\r\n":
            end -= 1
        if end:
            tails[origin] = data[data.rfind(b"\n", 0, end) + 1:end]
        if desk.progress.wants(origin):
            desk.progress.read(origin, data, time, 0.0, engine.year or line_fields.year_of(time))
        found = None
        if not quiet(origin, data, hits):
            if steps_only(origin, hits):
                stepping.append((origin, data, time, hits))
            else:                               # its step lines join ``stepping`` (Engine.feed's defer)
                found = engine.feed(origin, data, time, hits=hits, defer=stepping)
        if found or (survival and survival.watches(origin)):   # read for a waiting error's progress
            found = take(desk, origin, data, time, mono, found or [])   # taken even when a trigger is
            trigger = trigger or found
            continue
        opened = desk.open
        if desk._held and opened is not None and _printed_by(opened, instance):
            desk._alive = True
    if counts:
        desk.recorder.output_many(counts)
    if stepping:
        found = desk.add(engine.feed_steps(stepping), mono)
        trigger = trigger or found
    return trigger


def _printed_by(f: Finding, instance: str) -> bool:
    """``f`` came from ``instance`` or one of its processes (``instance/...``)."""
    return f.origin.instance == instance or f.origin.instance.startswith(instance + "/")
