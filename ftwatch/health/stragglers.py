"""Runtime stragglers from step lines, with no change to the training code (SPEC H3).

A :class:`StepTracker` is a tap of the rule engine: its patterns join the engine's one
multi-pattern database, so the chunk scan finds step lines together with everything else, and
Python runs here only for the lines that hit a step pattern (DESIGN.md "Speed on the hot path").
Per rank it keeps the last ``window`` step times: the duration the trainer printed (Megatron's
``elapsed time per iteration (ms)``, tqdm's ``it/s`` / ``s/it``), else the time between two
step lines divided by the steps between them.

A rank is a straggler when it has at least ``min_steps`` step times and its median step time is
``factor`` x the median of the other ranks' medians, and, with 3 ranks or more, also more than 3
scaled MADs (1.4826 x the median absolute deviation of the ranks' medians) above their median:
robust to a few slow steps (a checkpoint save) and to one noisy rank. One ``straggler`` finding
per rank per attempt (``notify``: a slow rank does not block, seed 001), with its slowdown factor.

What step lines can show: in synchronous data parallel training every rank waits for the slowest
in each step's collective, so the time *between* step lines is the same on every rank; a
straggler shows where ranks print their own compute time, or where they do not meet every step
(local SGD, asynchronous / parameter-server training, pipeline stages printing their own work).
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from typing import Sequence

from ftwatch.confighealth import STEP_PATTERNS, StragglerConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity

MAD_SCALE = 1.4826            # MAD -> standard deviation for normal data
MAD_LIMIT = 3.0               # scaled MADs above the median
RULE_ID = "straggler.step_time"
SOURCE = "SPEC H3: per-rank step times from step lines (median / MAD)"
_NAMED = re.compile(r"\(\?P<\w+>")


def scan_form(regex: str) -> str:
    """The pattern for the engine's matcher: named groups made non-capturing (``(?P<x>`` -> ``(?:``)."""
    return _NAMED.sub("(?:", regex)


def step_seconds(match: re.Match) -> float | None:
    """The step duration a line states (``ms``, ``s``, ``its`` or ``sit`` group), else None."""
    groups = match.groupdict()
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


def is_straggler(mine: float, others: Sequence[float], factor: float) -> tuple[bool, float]:
    """(is it a straggler, slowdown) for a rank with median step time ``mine`` against the other
    ranks' medians (see the module docstring). Times in seconds; needs at least one other rank."""
    if not others:
        return False, 1.0
    ref = statistics.median(others)
    slowdown = mine / ref if ref > 0 else float("inf") if mine > 0 else 1.0
    if slowdown < factor:
        return False, slowdown
    if len(others) >= 2:
        everyone = [mine, *others]
        med = statistics.median(everyone)
        mad = statistics.median(abs(x - med) for x in everyone) * MAD_SCALE
        if mad > 0 and (mine - med) / mad <= MAD_LIMIT:
            return False, slowdown
    return True, slowdown


class StepTracker:
    """Per-rank step times and straggler findings; an engine tap (``Engine(..., steps=tracker)``).

    Args:
        config: ``health.straggler`` (patterns, min_steps, window, factor).

    Attributes:
        patterns: the scan forms of the step patterns, for the engine's matcher.
    """

    def __init__(self, config: StragglerConfig):
        self.config = config
        self.names = list(config.patterns)
        self.regexes = [re.compile(STEP_PATTERNS.get(p, p)) for p in config.patterns]
        self.patterns: tuple[str, ...] = tuple(scan_form(rx.pattern) for rx in self.regexes)
        self.reset()

    def reset(self) -> None:
        """Forget every rank's steps (a new attempt: the ranks restart)."""
        self.samples: dict[tuple[str, str], deque[float]] = {}
        self.medians: dict[tuple[str, str], float] = {}
        self.last: dict[tuple[str, str], tuple[int, float]] = {}
        self.reported: set[tuple[str, str]] = set()

    def observe(self, origin: Origin, index: int, text: str, time: float, seq: int = 0) -> Finding | None:
        """Take one step line that hit pattern ``index`` (rank prefix removed; ``origin`` carries
        the rank); ``time`` is the line's time (epoch s). Returns a straggler finding or None."""
        match = None
        for i in [index] + [j for j in range(len(self.regexes)) if j != index]:
            found = list(self.regexes[i].finditer(text))
            if found:
                match, index = found[-1], i       # a tqdm line holds many updates: the last counts
                break
        if match is None:
            return None
        key = (origin.job, origin.instance)
        seconds = step_seconds(match)
        step = match.groupdict().get("step")
        if step is not None:
            step_no = int(step)
            prev = self.last.get(key)
            self.last[key] = (step_no, time)
            if seconds is None and prev is not None and step_no > prev[0] and time >= prev[1]:
                seconds = (time - prev[1]) / (step_no - prev[0])
        if seconds is None:
            return None
        window = self.samples.setdefault(key, deque(maxlen=self.config.window))
        window.append(seconds)
        if len(window) < self.config.min_steps:
            return None
        self.medians[key] = statistics.median(window)
        if key in self.reported:
            return None
        others = [m for k, m in self.medians.items() if k != key and k[0] == key[0]]
        slow, slowdown = is_straggler(self.medians[key], others, self.config.factor)
        if not slow:
            return None
        self.reported.add(key)
        mine, ref = self.medians[key], statistics.median(others)
        who = f"rank {origin.rank}" if origin.rank is not None else origin.instance
        line = (f"{who} is a straggler: median step time {mine:.3f} s over its last {len(window)} steps, "
                f"{slowdown:.1f}x the other ranks' {ref:.3f} s")
        return Finding(RULE_ID, "straggler", FailureClass.STRAGGLER, Action.NOTIFY, Severity.WARNING, origin,
                       line, time, seq, (text,),
                       {"slowdown": round(slowdown, 2), "step_time_s": round(mine, 4),
                        "others_step_time_s": round(ref, 4), "steps": len(window),
                        "ranks_compared": len(others) + 1, "pattern": self.names[index]}, SOURCE)
