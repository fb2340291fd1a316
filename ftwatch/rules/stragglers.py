"""Runtime stragglers from step lines, with no change to the training code (SPEC H3).

A :class:`StepTracker` is a tap of the rule engine: its patterns join the engine's one
multi-pattern database, so the chunk scan finds step lines together with everything else, and
Python runs here only for the lines that hit a step pattern (DESIGN.md "Speed on the hot path").
Per job and rank it keeps the last ``window`` step times: the duration the trainer printed
(Megatron's ``elapsed time per iteration (ms)``, tqdm's ``it/s`` / ``s/it``), else the time between
two step lines divided by the steps between them (DeepSpeed prints every ``steps_per_print`` steps).

Three findings:

* ``straggler`` (rank vs ranks): a rank with at least ``min_steps`` step times whose median step
  time is ``factor`` x the median of the other ranks' medians, and, with 3 ranks or more, also more
  than 3 scaled MADs *of the other ranks* (1.4826 x their median absolute deviation) above their
  median. The spread is measured without the rank under test, so a slow node that carries half the
  ranks (2 of 4, 4 of 8) is still found, while one noisy rank among noisy ranks is not. Where the
  ranks come from 2+ nodes (``Origin.node``), nodes are also compared the same way (each node's
  median of its ranks' medians): a slow node that carries most of the ranks is a ``straggler``
  finding about the node.
* ``straggler`` from Megatron's ``--log-straggler`` report (rank 0 prints the min / max round-trip
  time of all ranks with their ranks): ``detector_reports`` consecutive reports whose max/min
  exceeds ``factor`` with the same slowest rank make that rank a straggler.
* ``slowdown`` (the job against its own past): most trainers print on one rank only (Megatron's
  print_rank_last, DeepSpeed's log_dist(ranks=[0]), the HF Trainer's and Lightning's bars on rank
  0), so there is no second rank to compare with. While only one rank of a job reports step
  times, its median over the last ``min_steps`` step times against its baseline (the median of
  its first ``min_steps``) rising ``slowdown_factor`` x is a ``slowdown`` finding about the job
  (not a rank: every rank waits for the slowest, so one rank's step time is the job's).

All are ``notify`` (a slow rank does not block, seed 001). Hysteresis: once reported, a rank (or
the job's slowdown) is reported again only after its slowdown fell below half way back
(``1 + (factor - 1) / 2``) and rose past the factor again. The state of a job that printed no step
line for ``forget_after`` seconds (the tracker's clock) is dropped.

Which step lines: once a stream's ranks are known, only a chunk's tail (each rank's last few
step lines, ``ftwatch.rules.steptail``, with a full pass for a new rank, the head and end of a
stream's first chunk, and a refresh every few chunks): the verdicts read each rank's latest step times, not every line; its
docstring says what that means for ranks that print less often than others.

Cost per step line (DESIGN.md "Speed on the hot path"): the engine hands over whole chunks
(``take_chunk``); ``ftwatch.rules.steplines`` finds their step lines in one compiled pass per
pattern (its hits built in C, each with its match's groups, not the ``re.Match``: thousands of
kept matches a chunk set off full collections of the process), and ``ftwatch.rules.stepranks``
takes each rank's lines in one tight loop (or, for a run of Megatron lines, ``map`` in C): a
step line costs its share of that pass, its rank prefix's match and two deque appends (O(1)). Its time is read only where it
is needed: for a pattern without a duration (the time between step lines; the chunk's times of
day are found once, ``chunks.Stamps``), and for the line a finding names. The verdict runs once
per chunk, for the ranks that printed in it: each rank's median over its window (sorted once),
the job's ranks' medians and, per node, its ranks' medians and the nodes' medians kept in
sorted lists by bisection, so the median of the *other* ranks is read in O(1) and never a scan
over all ranks. Only a rank already past ``factor`` (rare) builds the other ranks' list for the
MAD test. The answers are exactly those of ``statistics.median`` over the same numbers
(``ftwatch.rules.stepstats``). With thousands of ranks a chunk holds about one step line per
rank (issue 16), so nothing per rank and chunk may cost more than a line: a rank that cannot be
slow (not reported, no node to compare, its median under ``factor`` x a lower bound of the
others' median) is passed over without a verdict; a rank's Origin is made once; its last step
line's time is read only if a duration-less line needs it (``LineClock.later``), or, where the
next ``HELD_CHUNKS`` chunks (``HELD_BYTES`` at most) do not replace it, then (no more are kept; live,
where it holds only its line, ``keeps_chunk``, only if ever needed). A finding comes at the end
of the chunk that made the statistics cross (``observe``, one line, is a chunk of one). The per-rank state and its intake live in
``ftwatch.rules.stepranks``, finding step lines in ``ftwatch.rules.steplines``, the three
verdicts on one rank (or node, or the job) in ``ftwatch.rules.stepverdicts``.

What step lines can show: in synchronous data parallel training every rank waits for the slowest
in each step's collective, so the time *between* step lines is the same on every rank; a
straggler shows where ranks print their own compute time (Megatron's straggler detector), or where
they do not meet every step (local SGD, asynchronous training, pipeline stages printing their own
work).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections import deque
from typing import Callable, Container

from ftwatch.bounded import BoundedDict
from ftwatch.clock import Clock, SystemClock
from ftwatch.config.health import STEP_PATTERNS, StragglerConfig
from ftwatch.config.limits import MAX_INSTANCES_PER_JOB
from ftwatch.events import Finding, Origin
from ftwatch.parsers import chunks, fields
from ftwatch.rules.stepranks import Job, Rank, Reader, by_rank, reader, take, take_lines
from ftwatch.rules.steplines import StepHit, StepLines, accepts, scan_form
from ftwatch.rules.steptail import Tails
from ftwatch.rules.stepstats import is_straggler, median_without, sorted_median, without  # noqa: F401  (re-exported)
from ftwatch.rules.stepverdicts import LineOf, detector, judge, node_verdict

SWEEP_EVERY = 60.0            # seconds between sweeps for forgotten jobs
#: replay: the latest chunks whose ranks' last step line's time may stay unread, held by
#: their ``LineClock.later`` (module doc); the latest chunk is always held. With more ranks than a
#: chunk has step lines a rank prints in every second or third chunk, not every one: read as soon
#: as the next chunk missed it, every such line's stamp was parsed (8,192 ranks of Megatron lines
#: in ``make bench``: 158,469 parses, 1.2 s of a 5 s replay), for a pattern that states its own
#: duration and never needs it. At most ``HELD_CHUNKS`` chunks and ``HELD_BYTES`` bytes: 4 MiB
#: hold a line of each of 16,384 ranks (``limits.max_instances_per_job``) of 260-byte lines, four
#: of replay's 1 MiB chunks, one of its longest (``StepTracker.chunk_bytes``).
HELD_CHUNKS = 4
HELD_BYTES = 4 << 20
_GROUPS = operator.itemgetter(2)


def _text_at(data: bytes, start: int) -> str:
    """The text of the line of ``data`` starting at ``start``, cleaned, rank prefix removed."""
    stop = data.find(b"\n", start)
    return fields.split_rank_prefix(fields.clean(data[start:] if stop < 0 else data[start:stop]))[1]


class StepTracker:
    """Per-rank step times and straggler / slowdown findings; an engine tap (``Engine(..., steps=tracker)``).

    Args:
        config: ``health.straggler`` (patterns, min_steps, window, factor, slowdown_factor,
            detector_reports, forget_after).
        clock: when jobs were last seen (``forget_after``); the system clock by default.
        max_ranks: ranks kept per job (``limits.max_instances_per_job``): one more forgets the stalest.
        tails: read only a chunk's tail where the stream's ranks are known (``ftwatch.rules.steptail``;
            False: every step line, the intake as it was). Off where a pattern is a custom regex.

    Attributes:
        patterns: the scan forms of the step patterns (what ``ftwatch check`` validates).
        lines: the chunk pass that finds step lines (``ftwatch.rules.steplines``).
    """

    def __init__(self, config: StragglerConfig, clock: Clock | None = None, max_ranks: int = MAX_INSTANCES_PER_JOB,
                 tails: bool = True):
        self.config = config
        self.max_ranks = max_ranks
        self.clock = clock or SystemClock()
        self.names = list(config.patterns)
        self.regexes = [re.compile(STEP_PATTERNS.get(p, p)) for p in config.patterns]
        self.patterns: tuple[str, ...] = tuple(scan_form(rx.pattern, builtin=name in STEP_PATTERNS)
                                               for name, rx in zip(self.names, self.regexes))
        self.lines = StepLines(self.names)
        #: the step lines of a chunk the tap reads: its tail (``ftwatch.rules.steptail``)
        self.tails = Tails(self.lines, enabled=tails and all(name in STEP_PATTERNS for name in self.names),
                           window=config.window, head=config.min_steps)
        self._readers = [reader(rx) for rx in self.regexes]            # for the text of a line
        self._byte_readers = [reader(rx) for rx in self.lines.regexes]  # for a match in a chunk
        self._vetoed = [name in ("tqdm_its", "tqdm_sit", "plain") for name in self.names]
        self._recent_len = min(config.min_steps, config.window)   # the slowdown's recent window
        self.reset()

    def reset(self) -> None:
        """Forget every job's steps (a new attempt: the ranks restart)."""
        self.jobs: dict[str, Job] = {}
        self.tails.reset()
        self._swept = self.clock.time()
        #: per chunk that left ranks' last step line's time unread (``time_at.later``: the chunk's one
        #: reader, holding its clock), that reader, those ranks and the chunk's length; past
        #: ``HELD_CHUNKS`` chunks or ``HELD_BYTES`` bytes, the oldest's ranks whose ``last`` still holds
        #: that reader are read (module doc). Only the reader and the ranks are kept, not the replaced
        #: ``last`` tuples: kept 4 chunks, 4,000 a chunk went to the oldest generation and tripled the
        #: full collections' CPU (4,096 ranks)
        self._held: deque[tuple[Callable[[int], float], list[Rank], int]] = deque()
        self._held_bytes = 0
        #: (id(stream Origin), rank) -> (that Origin, the rank's Origin): one ``with_rank`` per rank
        self._who: dict[tuple[int, int | None], tuple[Origin, Origin]] = {}

    @property
    def reported(self) -> set[tuple[str, str]]:
        """(job, instance) of the ranks reported and not yet recovered."""
        return {(j, i) for j, job in self.jobs.items() for i, r in job.ranks.items() if r.reported}

    def said(self, finding: Finding) -> None:
        """Called with each finding as it is made (a hook: ``SayingStepTracker`` prints it)."""

    def observe(self, origin: Origin, index: int, text: str, time: float, seq: int = 0) -> Finding | None:
        """Take one step line that hit pattern ``index`` (rank prefix removed; ``origin`` carries
        the rank); ``time`` is the line's time (epoch s). A line may hold several ``\\r``-separated
        progress-bar updates: the last one counts. A chunk of one line: its verdict follows at once.
        Returns a finding or None."""
        now = self.clock.time()
        if now - self._swept >= SWEEP_EVERY:
            self._sweep(now)
        job = self._job(origin, now)
        line: LineOf = lambda: (text, time, seq)  # noqa: E731
        found, rank, took = self._read(job, origin, index, text, 0, lambda _start: time, line)
        if rank is not None and rank.last is not None and rank.last[1] is None:
            rank.last = (rank.last[0], time, -1)
        if found is None and took:
            found = next(iter(self._verdicts(job, [(origin, rank)], lambda _who: line)), None)
        if found is not None:
            self.said(found)
        return found

    def chunk_bytes(self, origin: Origin) -> int:
        """Bytes of ``origin``'s output a chunk should hold for the tap to find ``TAIL_PER_RANK``
        step lines of each of its known ranks (``Tails.width``; 0: none known). A replay of
        thousands of ranks in one file reads chunks that long (``ftwatch.pipeline.replay``): its
        work once per rank and chunk is then shared by that rank's few lines, as at hundreds of
        ranks, and the lines read are the same."""
        return self.tails.width(origin)

    def find(self, data: bytes) -> list[StepHit]:
        """The step lines of ``data`` (complete lines, ANSI removed), for ``take_chunk``'s ``hits``:
        ``watch`` finds those of a whole batch of origins in one pass."""
        return self.lines.find(data, len(data))

    def take_chunk(self, origin: Origin | Callable[[int], Origin], data: bytes, end: int, skip: Container[int],
                   time_at: Callable[[int], float], next_seq: Callable[[], int],
                   hits: list[StepHit] | None = None) -> list[Finding]:
        """The step lines of one chunk of one origin, and the verdicts for the ranks that printed.

        Args:
            origin: the chunk's stream (a rank prefix in a line gives the line's rank); or, for a
                chunk of many streams' lines (``Engine.feed_steps``: a ``watch`` batch's), the
                stream of the line starting at an offset (its step lines' offsets only).
            data: complete lines, ANSI escapes removed.
            end: the lines to take end here (the rest is carried to the next chunk).
            skip: line starts to leave (lines a block took).
            time_at: the time (epoch s) of the line starting at an offset; called only for lines
                whose pattern states no duration and for the lines findings name. Its optional
                ``later(start)`` gives a reader of that time (called with the start) after the chunk, when needed.
            next_seq: a sequence number for a finding.
            hits: ``find(data)``, where the caller found them already (None: found here).

        Returns:
            The findings: Megatron straggler reports where their lines are, then, once for the
            chunk, the straggler / slowdown verdicts of the ranks that took step times in it.
        """
        groups = None
        if hits is None and isinstance(origin, Origin):
            hits, groups = self.tails.find(origin, data, end, skip)
        elif hits is None:
            hits = self.lines.find(data, end, skip)
        elif skip or end < len(data):
            hits = [h for h in hits if h[0] < end and h[0] not in skip]
        if not hits:
            return []
        now = self.clock.time()
        if now - self._swept >= SWEEP_EVERY:
            self._sweep(now)
        out: list[Finding] = []
        #: (job, instance) -> (its Origin, its rank, its last step time's line): the ranks that took step times
        took: dict[tuple[str, str], tuple[Origin, Rank, int]] = {}
        stepped: dict[int, Rank] = {}                 # ranks that took step lines in this chunk
        readers, min_steps = self._byte_readers, self.config.min_steps
        stream_at = None if isinstance(origin, Origin) else origin    # watch: a batch of many streams
        all_exact = None not in map(_GROUPS, hits)    # (in C) no line to read again: no grouping per line
        ranks_of, job_name, job = self._who, None, None
        if groups is None:
            groups = by_rank(data, hits, stream_at)
        for key, mine in groups.items():   # ranks are independent: each in its lines' order
            base, digits = (origin, key) if stream_at is None else key
            cached = ranks_of.get((id(base), digits))
            if cached is not None and cached[0] is base:
                who = cached[1]
            else:                                      # a rank's Origin, made once per stream and rank
                who = base.with_rank(digits)
                if len(ranks_of) >= self.max_ranks:    # streams come and go (watch): start again
                    ranks_of.clear()
                ranks_of[id(base), digits] = (base, who)
            if who.job != job_name:
                job, job_name = self._job(who, now), who.job
            if all_exact:                              # matched on the chunk's bytes: one tight loop
                rank = job.ranks.get(who.instance)
                if rank is None:
                    rank = self._rank(job, who)
                else:                                  # ``_rank``'s touch, inlined
                    job.ranks.move_to_end(who.instance)
                stepped[id(rank)] = rank
                last = take_lines(rank, min_steps, mine, readers, time_at)
                if last >= 0:
                    took[who.job, who.instance] = who, rank, last
                continue
            for exact, run in itertools.groupby(mine, key=lambda hit: hit[2] is not None):
                if exact:                              # matched on the chunk's bytes: one tight loop
                    rank = self._rank(job, who)
                    stepped[id(rank)] = rank
                    last = take_lines(rank, min_steps, list(run), readers, time_at)
                    if last >= 0:
                        took[who.job, who.instance] = who, rank, last
                    continue
                for start, index, _ in run:            # a custom pattern, Megatron's report: read the text
                    text = _text_at(data, start)
                    found, rank, took_one = self._read(job, who, index, text, start, time_at,
                                                   lambda s=start, t=text: (t, time_at(s), next_seq()))
                    if found is not None:
                        out.append(found)
                        self.said(found)
                    if rank is None:
                        continue
                    if took_one:
                        took[who.job, who.instance] = who, rank, start
                    stepped[id(rank)] = rank
        later = getattr(time_at, "later", None)
        held, keeps = self._held, getattr(time_at, "keeps_chunk", True)
        shared = later(0) if later is not None and keeps else None   # a replay's: one reader for the chunk
        unread: dict[int, Rank] = {}                   # ranks whose last line's time is read later
        for rank in stepped.values():                  # offsets mean nothing after this chunk
            last = rank.last
            if last is not None and last[1] is None:   # read when a later line needs it
                if later is None:
                    rank.last = (last[0], time_at(last[2]), -1)
                elif shared is None:                   # live: a reader holding the line
                    rank.last = (last[0], later(last[2]), -1)
                else:
                    rank.last = (last[0], shared, last[2])
                    unread[id(rank)] = rank
        # only a ``later`` holding its chunk (a replay's) is held: the latest chunks, HELD_CHUNKS and
        # HELD_BYTES at most, the latest always (module doc); live, a replay's left are read at once
        if unread:
            held.append((shared, list(unread.values()), len(data)))
            self._held_bytes += len(data)
        while held and (not keeps or len(held) > HELD_CHUNKS or (len(held) > 1 and self._held_bytes > HELD_BYTES)):
            read, ranks, size = held.popleft()
            self._held_bytes -= size
            for rank in ranks:                         # that chunk's, not replaced since: read now
                last = rank.last
                if last is not None and last[1] is read:
                    rank.last = (last[0], read(last[2]), -1)

        by_job: dict[str, list[tuple[Origin, Rank]]] = {}
        starts: dict[str, int] = {}                    # instance -> the line a finding about it names
        for who, rank, start in took.values():
            members = by_job.get(who.job)
            if members is None:
                by_job[who.job] = [(who, rank)]
            else:
                members.append((who, rank))
            starts[who.instance] = start

        def line_of(who: Origin) -> LineOf:            # made only for a finding
            start = starts[who.instance]
            return lambda: (_text_at(data, start), time_at(start), next_seq())
        for job_name, members in by_job.items():
            job = self.jobs.get(job_name)
            for found in self._verdicts(job, members, line_of) if job is not None else ():
                out.append(found)
                self.said(found)
        return out

    # -- per-rank step times ------------------------------------------------------------------

    def _job(self, origin: Origin, now: float) -> Job:
        job = self.jobs.get(origin.job)
        if job is None:
            job = self.jobs[origin.job] = Job()
            job.ranks = BoundedDict(self.max_ranks, "straggler_rank", on_evict=lambda _, r: job.set_median(r, None))
        job.touched = now
        return job

    def _rank(self, job: Job, origin: Origin) -> Rank:
        """The rank of ``origin`` in ``job`` (made on its first step time; the stalest one past
        ``max_ranks`` is forgotten)."""
        rank = job.ranks.get(origin.instance)
        if rank is None:
            rank = job.ranks[origin.instance] = Rank(deque(maxlen=self.config.window), deque(maxlen=self._recent_len),
                                                      node=origin.node or "")
        else:
            job.ranks.touch(origin.instance)
        return rank

    def _read(self, job: Job, origin: Origin, index: int, text: str, start: int,
              time_at: Callable[[int], float], line: LineOf) -> tuple[Finding | None, Rank | None, bool]:
        """One step line's text read by the patterns themselves (the first that hit, then each in
        order): a Megatron straggler report is judged at once; a step time is taken (no verdict).
        Returns (a finding, the rank the line is about, whether it took a step time)."""
        match = self._last_match(index, text)
        if match is None:
            for i in range(len(self.regexes)):
                match = None if i == index else self._last_match(i, text)
                if match is not None:
                    index = i
                    break
        if match is None:
            return None, None, False
        if "max_rank" in match.re.groupindex and match.group("max_rank") is not None:
            text_, time, seq = line()
            return detector(self.config, job, origin, match, text_, time, seq), None, False
        rank, took = self._take(job, origin, index, match, self._readers[index], start, time_at)
        return None, rank, took

    def _last_match(self, i: int, text: str) -> re.Match | None:
        """The last match of pattern ``i`` in ``text`` that its veto lets pass, or None."""
        found = list(self.regexes[i].finditer(text))
        if found and self._vetoed[i]:
            found = [m for m in found if accepts(self.names[i], text, m)]
        return found[-1] if found else None

    def _accepts(self, name: str, text: str, match: re.Match) -> bool:
        """The veto of pattern ``name`` (``steplines.accepts``)."""
        return accepts(name, text, match)

    def _take(self, job: Job, origin: Origin, index: int, match: re.Match, read: Reader, start: int,
              time_at: Callable[[int], float]) -> tuple[Rank, bool]:
        """A step line's match into its rank's windows (``stepranks.take``): (the rank, whether a
        step time was taken)."""
        rank = self._rank(job, origin)
        return rank, take(rank, self.config.min_steps, index, match, read, start, time_at)

    def _verdicts(self, job: Job, members: list[tuple[Origin, Rank]], line_of: Callable[[Origin], LineOf]
                  ) -> list[Finding]:
        """The verdicts for the ranks of ``job`` that took step times: their medians first, then
        each rank against the others (and its node against the other nodes, or the one printing
        rank against its own baseline). ``line_of(origin)``: the line a finding about it names.

        With one step line per rank per chunk (thousands of ranks) every chunk judges every rank,
        so a rank that cannot be found slow is passed over in this loop, not judged: one not
        reported, without a node to compare (fewer than 2 nodes), whose median is under
        ``factor`` x a lower bound of the other ranks' median (the median of the lowest n - 1 of
        the n medians); ``_judge`` would change nothing and find nothing for it. Of such ranks with
        a node to compare, only each node's first gets its node's verdict (all ``judge`` does for
        them): in one pass a node's second verdict finds and changes nothing."""
        cfg = self.config
        min_steps, ranks = cfg.min_steps, job.ranks
        members = [pair for pair in members                                 # not forgotten, enough steps
                   if len(pair[1].samples) >= min_steps and ranks.get(pair[0].instance) is pair[1]]
        ranks_now = [pair[1] for pair in members]
        for rank in ranks_now:
            if rank.ordered is None:
                rank.ordered = sorted(rank.samples)
        job.set_medians(ranks_now, [sorted_median(rank.ordered) for rank in ranks_now])
        medians, node_median = job.medians, job.node_median
        # below this no rank's slowdown reaches ``factor`` (a margin for the rounding of m / ref)
        bound = cfg.factor * sorted_median(medians[:-1]) * (1.0 - 1e-9) if len(medians) >= 2 else float("-inf")
        nodes = len(node_median) >= 2
        names, found, judged = self.names, [], set()   # judged: nodes with this pass's node verdict
        for who, rank in members:
            if rank.reported or rank.median >= bound:
                f = judge(cfg, names, job, who, rank, line_of(who))
            elif nodes and rank.node in node_median and rank.node not in judged:
                judged.add(rank.node)
                f = node_verdict(cfg, names, job, who, rank, line_of(who))
            else:
                continue
            if f is not None:
                found.append(f)
        return found

    def _sweep(self, now: float) -> None:
        self._swept = now
        for name in [n for n, j in self.jobs.items() if now - j.touched >= self.config.forget_after]:
            del self.jobs[name]
