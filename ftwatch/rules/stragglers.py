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

Cost per step line (DESIGN.md "Speed on the hot path"): the line is matched once (its pattern's
groups read once), and the statistics are kept sorted as they change: each rank's window, the
job's ranks' medians and, per node, its ranks' medians and the nodes' medians live in sorted lists
updated by bisection, so a rank's median and the median of the *other* ranks are read in O(1)
and a step line costs O(log ranks), never a median over a window or a scan over all ranks. Only a
rank already past ``factor`` (rare) builds the other ranks' list for the MAD test. The answers are
exactly those of ``statistics.median`` over the same numbers (``ftwatch.rules.stepstats``).

What step lines can show: in synchronous data parallel training every rank waits for the slowest
in each step's collective, so the time *between* step lines is the same on every rank; a
straggler shows where ranks print their own compute time (Megatron's straggler detector), or where
they do not meet every step (local SGD, asynchronous training, pipeline stages printing their own
work).
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import deque
from dataclasses import dataclass, field

from ftwatch.bounded import BoundedDict
from ftwatch.clock import Clock, SystemClock
from ftwatch.config.health import STEP_PATTERNS, StragglerConfig
from ftwatch.config.limits import MAX_INSTANCES_PER_JOB
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.rules.stepstats import (is_straggler, median_without, rearm_level, replace_sorted, sorted_median,
                                     without)

RULE_ID = "straggler.step_time"
DETECTOR_RULE_ID = "straggler.megatron_detector"
SLOWDOWN_RULE_ID = "straggler.job_slowdown"
SOURCE = "SPEC H3: per-rank step times from step lines (median / MAD)"
DETECTOR_SOURCE = "Megatron-LM megatron/core/utils.py StragglerDetector.report (--log-straggler)"
SWEEP_EVERY = 60.0            # seconds between sweeps for forgotten jobs
_NAMED = re.compile(r"\(\?P<\w+>")
#: tqdm descriptions of a training bar: none (HF Trainer) or Lightning's "Epoch N".
_TRAIN_DESC = re.compile(r"(?:Epoch \d+:?)?")
#: "plain" hits that are not a training step (a checkpoint, the scheduler, evaluation, warm-up).
#: Looked for before the match only: "step 100 loss 2.3 eval_loss 2.1" is a step line.
_NOT_A_STEP = re.compile(r"(?i)checkpoint|\bsav(?:e|ed|ing)\b|schedul|\beval|valid|warm.?up|\bresum|\bload")


#: A pattern's last group when it is one repeated character class (``(?:[0-9.]+)`` at the end).
_TRAILING_REPEAT = re.compile(r"(\(\?:(?:\[[^\]\\]*\]|\\[dw]))\+\)$")


_SPACE = re.compile(r"(?<!\\)\\s")


def scan_form(regex: str, builtin: bool = False) -> str:
    """The pattern for the engine's matcher: named groups made non-capturing (``(?P<x>`` -> ``(?:``),
    and a last group of one repeated class matched once (``(?:[0-9.]+)$`` -> ``(?:[0-9.])``): a line
    matches either both or neither, and the matcher, which reports every end of a match, calls
    back once per step line instead of once per digit (Megatron's ``... (ms): 1234.5``).

    ``builtin`` (the ``STEP_PATTERNS``, whose ``\\s`` all stand outside classes): ``\\s`` becomes
    ``[^\\S\\n]``, the same on one line but never a newline, so the matcher needs no per-hit RE2
    re-check of a match spanning two lines (``ftwatch.rules.matcher``)."""
    form = _TRAILING_REPEAT.sub(r"\1)", _NAMED.sub("(?:", regex))
    return _SPACE.sub(r"[^\\S\\n]", form) if builtin else form


def step_seconds(match: re.Match | dict) -> float | None:
    """The step duration a line states (``ms``, ``s``, ``its`` or ``sit`` group), else None;
    takes the match or its ``groupdict()``."""
    groups = match if isinstance(match, dict) else match.groupdict()
    try:
        if groups.get("ms"):
            return float(groups["ms"]) / 1000.0
        if groups.get("s"):
            return float(groups["s"])
        if groups.get("sit"):
            return float(groups["sit"])
        if groups.get("its"):
            rate = float(groups["its"])
            return 1.0 / rate if rate > 0 else None
    except ValueError:
        return None
    return None


@dataclass
class _Rank:
    samples: deque
    ordered: list[float] = field(default_factory=list)    # ``samples``, sorted
    recent: deque = field(default_factory=deque)          # the last ``min_steps`` samples
    recent_ordered: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    base_median: float | None = None        # of ``baseline``, once it is full
    seen: int = 0                           # step times taken
    last: tuple[int, float] | None = None   # (step number, time)
    total: str | None = None                # the length of the rank's (first) progress bar
    median: float | None = None
    reported: bool = False
    node: str = ""


@dataclass
class _Job:
    ranks: dict[str, _Rank] = field(default_factory=dict)
    touched: float = 0.0
    slowdown_reported: bool = False
    detector: list[tuple[int, float]] = field(default_factory=list)   # (slowest rank, max/min) run
    detector_reported: set[int] = field(default_factory=set)
    nodes_reported: set[str] = field(default_factory=set)
    medians: list[float] = field(default_factory=list)                # every rank's median, sorted
    node_ranks: dict[str, list[float]] = field(default_factory=dict)  # node -> its ranks' medians, sorted
    node_median: dict[str, float] = field(default_factory=dict)       # node -> median of node_ranks
    node_medians: list[float] = field(default_factory=list)           # node_median's values, sorted

    def set_median(self, rank: _Rank, median: float | None) -> None:
        """A rank's median changed (None: the rank is forgotten, ``limits``): keep the sorted lists
        of ranks' and nodes' medians (a node without ranks left leaves them)."""
        old, rank.median = rank.median, median
        replace_sorted(self.medians, old, median)
        if not rank.node:
            return
        mine = self.node_ranks.setdefault(rank.node, [])
        replace_sorted(mine, old, median)
        node_old, node_new = self.node_median.pop(rank.node, None), sorted_median(mine) if mine else None
        if node_new is None:
            del self.node_ranks[rank.node]
        else:
            self.node_median[rank.node] = node_new
        replace_sorted(self.node_medians, node_old, node_new)


class StepTracker:
    """Per-rank step times and straggler / slowdown findings; an engine tap (``Engine(..., steps=tracker)``).

    Args:
        config: ``health.straggler`` (patterns, min_steps, window, factor, slowdown_factor,
            detector_reports, forget_after).
        clock: when jobs were last seen (``forget_after``); the system clock by default.
        max_ranks: ranks kept per job (``limits.max_instances_per_job``): one more forgets the stalest.

    Attributes:
        patterns: the scan forms of the step patterns, for the engine's matcher.
    """

    def __init__(self, config: StragglerConfig, clock: Clock | None = None, max_ranks: int = MAX_INSTANCES_PER_JOB):
        self.config = config
        self.max_ranks = max_ranks
        self.clock = clock or SystemClock()
        self.names = list(config.patterns)
        self.regexes = [re.compile(STEP_PATTERNS.get(p, p)) for p in config.patterns]
        self.patterns: tuple[str, ...] = tuple(scan_form(rx.pattern, builtin=name in STEP_PATTERNS)
                                               for name, rx in zip(self.names, self.regexes))
        self._vetoed = [name in ("tqdm_its", "tqdm_sit", "plain") for name in self.names]
        self._recent_len = min(config.min_steps, config.window)   # the slowdown's recent window
        self.reset()

    def reset(self) -> None:
        """Forget every job's steps (a new attempt: the ranks restart)."""
        self.jobs: dict[str, _Job] = {}
        self._swept = self.clock.time()

    @property
    def reported(self) -> set[tuple[str, str]]:
        """(job, instance) of the ranks reported and not yet recovered."""
        return {(j, i) for j, job in self.jobs.items() for i, r in job.ranks.items() if r.reported}

    def observe(self, origin: Origin, index: int, text: str, time: float, seq: int = 0) -> Finding | None:
        """Take one step line that hit pattern ``index`` (rank prefix removed; ``origin`` carries
        the rank); ``time`` is the line's time (epoch s). A line may hold several ``\\r``-separated
        progress-bar updates: the last one counts. Returns a finding or None."""
        now = self.clock.time()
        if now - self._swept >= SWEEP_EVERY:
            self._sweep(now)
        match = self._last_match(index, text)     # the pattern that hit first, then each in order
        if match is None:
            for i in range(len(self.regexes)):
                match = None if i == index else self._last_match(i, text)
                if match is not None:
                    index = i
                    break
        if match is None:
            return None
        job = self.jobs.get(origin.job)
        if job is None:
            job = self.jobs[origin.job] = _Job()
            job.ranks = BoundedDict(self.max_ranks, "straggler_rank", on_evict=lambda _, r: job.set_median(r, None))
        job.touched = now
        groups = match.groupdict()
        if groups.get("max_rank") is not None:
            return self._detector(job, origin, match, text, time, seq)
        return self._step(job, origin, index, groups, text, time, seq)

    # -- per-rank step times ------------------------------------------------------------------

    def _last_match(self, i: int, text: str) -> re.Match | None:
        """The last match of pattern ``i`` in ``text`` that its veto lets pass, or None."""
        found = list(self.regexes[i].finditer(text))
        if found and self._vetoed[i]:
            found = [m for m in found if self._accepts(self.names[i], text, m)]
        return found[-1] if found else None

    def _accepts(self, name: str, text: str, match: re.Match) -> bool:
        if name in ("tqdm_its", "tqdm_sit"):
            segment = text[: match.start()].rsplit("\r", 1)[-1].rsplit("\n", 1)[-1]
            return _TRAIN_DESC.fullmatch(segment.strip()) is not None
        if name == "plain":
            return _NOT_A_STEP.search(text, 0, match.start()) is None
        return True

    def _step(self, job: _Job, origin: Origin, index: int, groups: dict, text: str, time: float,
              seq: int) -> Finding | None:
        cfg = self.config
        rank = job.ranks.get(origin.instance)
        if rank is None:
            rank = job.ranks[origin.instance] = _Rank(deque(maxlen=cfg.window), node=origin.node or "")
        else:
            job.ranks.touch(origin.instance)
        total = groups.get("total")
        if total is not None:
            if rank.total is None:
                rank.total = total
            elif total != rank.total:          # another bar (HF's evaluation bar): not a training step
                return None
        seconds = step_seconds(groups)
        if groups.get("step") is not None:
            step_no = int(groups["step"])
            prev = rank.last
            rank.last = (step_no, time)
            if seconds is None and prev is not None and step_no > prev[0] and time >= prev[1]:
                seconds = (time - prev[1]) / (step_no - prev[0])
        if seconds is None:
            return None
        self._take(rank, seconds)
        if len(rank.samples) < cfg.min_steps:
            return None
        job.set_median(rank, sorted_median(rank.ordered))
        ref = median_without(job.medians, rank.median)
        if ref is None:
            return self._slowdown(job, origin, rank, text, time, seq, index)
        slowdown = rank.median / ref if ref > 0 else float("inf") if rank.median > 0 else 1.0
        others: list[float] | None = None
        slow = False
        if slowdown >= cfg.factor:                 # rare: the full test, MAD included, on the list
            others = without(job.medians, rank.median)
            slow, slowdown = is_straggler(rank.median, others, cfg.factor)
        if not slow and not rank.reported:
            found = self._node(job, origin, rank, text, time, seq, index)
            if found is not None:
                return found
        if rank.reported:
            if slowdown < rearm_level(cfg.factor):
                rank.reported = False          # recovered: may be reported again
            return None
        if not slow:
            return None
        rank.reported = True
        who = f"rank {origin.rank}" if origin.rank is not None else origin.instance
        line = (f"{who} is a straggler: median step time {rank.median:.3f} s over its last {len(rank.samples)} "
                f"step lines, {slowdown:.1f}x the other ranks' {ref:.3f} s")
        return Finding(RULE_ID, "straggler", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING, origin,
                       line, time, seq, (text,),
                       {"slowdown": round(slowdown, 2), "step_time_s": round(rank.median, 4),
                        "others_step_time_s": round(ref, 4), "step_lines": len(rank.samples),
                        "ranks_compared": len(others) + 1, "pattern": self.names[index]}, SOURCE)

    def _node(self, job: _Job, origin: Origin, rank: _Rank, text: str, time: float, seq: int,
              index: int) -> Finding | None:
        """Nodes vs nodes (each node's median of its ranks' medians), where ranks come from 2+ nodes:
        finds a slow node that carries most of the job's ranks, which rank vs ranks cannot."""
        cfg = self.config
        per_node = job.node_ranks
        if len(job.node_median) < 2 or rank.node not in job.node_median:
            return None
        medians = job.node_median
        mine = medians[rank.node]
        ref = median_without(job.node_medians, mine)
        slowdown = mine / ref if ref > 0 else float("inf") if mine > 0 else 1.0
        slow = False
        if slowdown >= cfg.factor:                 # rare: the full test on the other nodes' list
            others = without(job.node_medians, mine)
            slow, slowdown = is_straggler(mine, others, cfg.factor)
        if rank.node in job.nodes_reported:
            if slowdown < rearm_level(cfg.factor):
                job.nodes_reported.discard(rank.node)
            return None
        if not slow:
            return None
        job.nodes_reported.add(rank.node)
        line = (f"node {rank.node} is a straggler: the median step time of its {len(per_node[rank.node])} ranks "
                f"is {medians[rank.node]:.3f} s, {slowdown:.1f}x the other nodes' {ref:.3f} s")
        return Finding(RULE_ID, "straggler", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING,
                       Origin(f"node {rank.node}", None, origin.job, rank.node, origin.stream, origin.source),
                       line, time, seq, (text,),
                       {"slowdown": round(slowdown, 2), "step_time_s": round(medians[rank.node], 4),
                        "others_step_time_s": round(ref, 4), "node_ranks": len(per_node[rank.node]),
                        "nodes_compared": len(per_node), "pattern": self.names[index]}, SOURCE)

    def _slowdown(self, job: _Job, origin: Origin, rank: _Rank, text: str, time: float, seq: int,
                  index: int) -> Finding | None:
        """The one reporting rank against its own baseline (module docstring, ``slowdown``)."""
        cfg = self.config
        if rank.seen < 2 * cfg.min_steps:
            return None
        base = rank.base_median
        recent = sorted_median(rank.recent_ordered)
        rise = recent / base if base > 0 else 1.0
        if job.slowdown_reported:
            if rise < rearm_level(cfg.slowdown_factor):
                job.slowdown_reported = False
            return None
        if rise < cfg.slowdown_factor:
            return None
        job.slowdown_reported = True
        line = (f"job {origin.job} step time rose {rise:.1f}x: median {recent:.3f} s over the last "
                f"{cfg.min_steps} step lines vs {base:.3f} s over the first {cfg.min_steps} (one rank prints "
                f"step times, so this is the job's pace, not a rank straggler)")
        return Finding(SLOWDOWN_RULE_ID, "slowdown", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING,
                       Origin(origin.instance, None, origin.job, origin.node, origin.stream, origin.source),
                       line, time, seq, (text,),
                       {"slowdown": round(rise, 2), "step_time_s": round(recent, 4),
                        "baseline_step_time_s": round(base, 4), "step_lines": cfg.min_steps,
                        "reporting_rank": origin.rank, "pattern": self.names[index]}, SOURCE)

    def _take(self, rank: _Rank, seconds: float) -> None:
        """One step time into the rank's window, its recent window and, while it fills, its
        baseline; the sorted copies follow (O(log window) search, O(window) memmove)."""
        cfg = self.config
        samples = rank.samples
        if len(samples) == samples.maxlen:
            del rank.ordered[bisect.bisect_left(rank.ordered, samples[0])]
        samples.append(seconds)
        bisect.insort(rank.ordered, seconds)
        recent = rank.recent
        if len(recent) == self._recent_len:
            del rank.recent_ordered[bisect.bisect_left(rank.recent_ordered, recent.popleft())]
        recent.append(seconds)
        bisect.insort(rank.recent_ordered, seconds)
        rank.seen += 1
        if len(rank.baseline) < cfg.min_steps:
            rank.baseline.append(seconds)
            if len(rank.baseline) == cfg.min_steps:
                rank.base_median = statistics.median(rank.baseline)

    # -- Megatron's straggler detector -------------------------------------------------------

    def _detector(self, job: _Job, origin: Origin, match: re.Match, text: str, time: float,
                  seq: int) -> Finding | None:
        cfg = self.config
        low, high = float(match.group("min_ms")), float(match.group("max_ms"))
        slowest = int(match.group("max_rank"))
        ratio = high / low if low > 0 else float("inf")
        if ratio < rearm_level(cfg.factor):
            job.detector_reported.clear()      # every rank back in line: each may be reported again
        if ratio < cfg.factor:
            job.detector.clear()
            return None
        if job.detector and job.detector[-1][0] != slowest:
            job.detector.clear()
        job.detector.append((slowest, ratio))
        if len(job.detector) < cfg.detector_reports or slowest in job.detector_reported:
            return None
        job.detector_reported.add(slowest)
        slowdown = statistics.median(r for _, r in job.detector)
        line = (f"rank {slowest} is a straggler: Megatron's straggler detector shows it slowest in "
                f"{len(job.detector)} reports in a row, {slowdown:.1f}x the fastest rank's round-trip time "
                f"({high:.1f} ms vs {low:.1f} ms, rank {match.group('min_rank')})")
        # the slowest rank's own instance and node are not in the line: it is named by its rank
        who = Origin(f"rank{slowest}", slowest, origin.job, "", origin.stream, origin.source)
        return Finding(DETECTOR_RULE_ID, "straggler", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING,
                       who, line, time, seq, (text,),
                       {"slowdown": round(slowdown, 2), "step_time_s": round(high / 1000.0, 4),
                        "others_step_time_s": round(low / 1000.0, 4), "reports": len(job.detector),
                        "reported_by": origin.rank, "pattern": "megatron_straggler"}, DETECTOR_SOURCE)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for name in [n for n, j in self.jobs.items() if now - j.touched >= self.config.forget_after]:
            del self.jobs[name]
