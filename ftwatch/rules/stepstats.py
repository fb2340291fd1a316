"""The statistics of the step tap (``ftwatch.rules.stragglers``): the straggler test on medians,
and medians kept on sorted lists so that a step line updates them in O(log n).

``is_straggler`` is the test (``factor`` x the others' median, and more than ``MAD_LIMIT`` scaled
MADs above it); the rest answer exactly what ``statistics.median`` answers over the same numbers,
without sorting or scanning: a sorted list's median, its median with one value left out, and an
in-place replace of one value.
"""

from __future__ import annotations

import bisect
import statistics
from typing import Sequence

MAD_SCALE = 1.4826            # MAD -> standard deviation for normal data
MAD_LIMIT = 3.0               # scaled MADs above the median


def is_straggler(mine: float, others: Sequence[float], factor: float) -> tuple[bool, float]:
    """(is it a straggler, slowdown) for a rank with median step time ``mine`` against the other
    ranks' medians: ``factor`` x their median, and with 2+ others more than 3 scaled MADs of the
    others above their median (see the module docstring). Times in seconds; needs one other rank."""
    if not others:
        return False, 1.0
    ref = statistics.median(others)
    slowdown = mine / ref if ref > 0 else float("inf") if mine > 0 else 1.0
    if slowdown < factor:
        return False, slowdown
    if len(others) >= 2:
        mad = statistics.median(abs(x - ref) for x in others) * MAD_SCALE
        if mad > 0 and (mine - ref) / mad <= MAD_LIMIT:
            return False, slowdown
    return True, slowdown


def rearm_level(factor: float) -> float:
    """The slowdown below which a reported rank counts as recovered (half way back to 1x)."""
    return 1.0 + (factor - 1.0) / 2.0


def sorted_median(values: list[float]) -> float:
    """``statistics.median`` of an already sorted, non-empty list, in O(1)."""
    n = len(values)
    i = n // 2
    return values[i] if n % 2 else (values[i - 1] + values[i]) / 2


def median_without(values: list[float], value: float) -> float | None:
    """The median of sorted ``values`` with one occurrence of ``value`` (which it holds) left out,
    in O(log n); None when nothing is left."""
    n = len(values) - 1
    if n <= 0:
        return None
    skip = bisect.bisect_left(values, value)      # element k of the rest: values[k + (k >= skip)]
    i = n // 2
    high = values[i] if i < skip else values[i + 1]
    if n % 2:
        return high
    return ((values[i - 1] if i - 1 < skip else values[i]) + high) / 2


def replace_sorted(values: list[float], old: float | None, new: float | None) -> None:
    """In sorted ``values``: take out one ``old`` (when not None), put in ``new`` (when not None)."""
    if old is not None:
        del values[bisect.bisect_left(values, old)]
    if new is not None:
        bisect.insort(values, new)


def without(values: list[float], value: float) -> list[float]:
    """Sorted ``values`` less one occurrence of ``value`` (a copy; the rare path's explicit list)."""
    i = bisect.bisect_left(values, value)
    return values[:i] + values[i + 1:]
