"""The straggler verdicts of ``ftwatch.rules.stragglers`` (SPEC H3) on one rank, its node, or the
job, from the statistics ``ftwatch.rules.stepranks`` keeps: rank vs the other ranks (median, then
the scaled MAD of the others), node vs the other nodes, the one printing rank against its own
baseline (``slowdown``), and Megatron's ``--log-straggler`` report. Each returns a ``notify``
finding or None and keeps the hysteresis state on the rank / job (reported, re-armed below
``rearm_level``). The thresholds and their sources are in the stragglers module's docstring.
"""

from __future__ import annotations

import re
import statistics
from typing import Callable

from ftwatch.config.health import StragglerConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.rules.stepranks import Job, Rank
from ftwatch.rules.stepstats import is_straggler, median_without, rearm_level, without

RULE_ID = "straggler.step_time"
DETECTOR_RULE_ID = "straggler.megatron_detector"
SLOWDOWN_RULE_ID = "straggler.job_slowdown"
SOURCE = "SPEC H3: per-rank step times from step lines (median / MAD)"
DETECTOR_SOURCE = "Megatron-LM megatron/core/utils.py StragglerDetector.report (--log-straggler)"

#: Where a finding's line is: () -> (its text, rank prefix removed; its time, epoch s; a sequence number).
LineOf = Callable[[], tuple[str, float, int]]


def judge(cfg: StragglerConfig, names: list[str], job: Job, origin: Origin, rank: Rank, line: LineOf
          ) -> Finding | None:
    """Rank vs the other ranks (then its node vs the other nodes, or, alone, the job vs its own
    baseline): a finding, or None; ``names``: the step patterns by index (for the finding)."""
    ref = median_without(job.medians, rank.median)
    if ref is None:
        return slowdown_verdict(cfg, names, job, origin, rank, line)
    slowdown = rank.median / ref if ref > 0 else float("inf") if rank.median > 0 else 1.0
    others: list[float] | None = None
    slow = False
    if slowdown >= cfg.factor:                 # rare: the full test, MAD included, on the list
        others = without(job.medians, rank.median)
        slow, slowdown = is_straggler(rank.median, others, cfg.factor)
    if not slow and not rank.reported:
        found = node_verdict(cfg, names, job, origin, rank, line)
        if found is not None:
            return found
    if rank.reported:
        if slowdown < rearm_level(cfg.factor):
            rank.reported = False          # recovered: may be reported again
        return None
    if not slow:
        return None
    rank.reported = True
    text, time, seq = line()
    who = f"rank {origin.rank}" if origin.rank is not None else origin.instance
    msg = (f"{who} is a straggler: median step time {rank.median:.3f} s over its last {len(rank.samples)} "
           f"step lines, {slowdown:.1f}x the other ranks' {ref:.3f} s")
    return Finding(RULE_ID, "straggler", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING, origin,
                   msg, time, seq, (text,),
                   {"slowdown": round(slowdown, 2), "step_time_s": round(rank.median, 4),
                    "others_step_time_s": round(ref, 4), "step_lines": len(rank.samples),
                    "ranks_compared": len(others) + 1, "pattern": names[rank.index]}, SOURCE)


def node_verdict(cfg: StragglerConfig, names: list[str], job: Job, origin: Origin, rank: Rank, line: LineOf
                 ) -> Finding | None:
    """Nodes vs nodes (each node's median of its ranks' medians), where ranks come from 2+ nodes:
    finds a slow node that carries most of the job's ranks, which rank vs ranks cannot."""
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
    text, time, seq = line()
    msg = (f"node {rank.node} is a straggler: the median step time of its {len(per_node[rank.node])} ranks "
           f"is {medians[rank.node]:.3f} s, {slowdown:.1f}x the other nodes' {ref:.3f} s")
    return Finding(RULE_ID, "straggler", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING,
                   Origin(f"node {rank.node}", None, origin.job, rank.node, origin.stream, origin.source),
                   msg, time, seq, (text,),
                   {"slowdown": round(slowdown, 2), "step_time_s": round(medians[rank.node], 4),
                    "others_step_time_s": round(ref, 4), "node_ranks": len(per_node[rank.node]),
                    "nodes_compared": len(per_node), "pattern": names[rank.index]}, SOURCE)


def slowdown_verdict(cfg: StragglerConfig, names: list[str], job: Job, origin: Origin, rank: Rank, line: LineOf
                     ) -> Finding | None:
    """The one reporting rank against its own baseline (module docstring, ``slowdown``)."""
    if rank.seen < 2 * cfg.min_steps:
        return None
    base = rank.base_median
    recent = statistics.median(rank.recent)
    rise = recent / base if base > 0 else 1.0
    if job.slowdown_reported:
        if rise < rearm_level(cfg.slowdown_factor):
            job.slowdown_reported = False
        return None
    if rise < cfg.slowdown_factor:
        return None
    job.slowdown_reported = True
    text, time, seq = line()
    msg = (f"job {origin.job} step time rose {rise:.1f}x: median {recent:.3f} s over the last "
           f"{cfg.min_steps} step lines vs {base:.3f} s over the first {cfg.min_steps} (one rank prints "
           f"step times, so this is the job's pace, not a rank straggler)")
    return Finding(SLOWDOWN_RULE_ID, "slowdown", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING,
                   Origin(origin.instance, None, origin.job, origin.node, origin.stream, origin.source),
                   msg, time, seq, (text,),
                   {"slowdown": round(rise, 2), "step_time_s": round(recent, 4),
                    "baseline_step_time_s": round(base, 4), "step_lines": cfg.min_steps,
                    "reporting_rank": origin.rank, "pattern": names[rank.index]}, SOURCE)



def detector(cfg: StragglerConfig, job: Job, origin: Origin, match: re.Match, text: str, time: float,
             seq: int) -> Finding | None:
    """Megatron's ``--log-straggler`` report (rank 0 prints the min / max round-trip time of all
    ranks): ``detector_reports`` reports in a row past ``factor`` naming the same slowest rank make
    it a straggler (a finding named by that rank), or None."""
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
