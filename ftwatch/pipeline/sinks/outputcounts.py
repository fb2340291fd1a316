"""Output volume per instance over time: lines and bytes counted in fixed time buckets.

The runner and the watcher count what every instance printed (``Recorder.output``); closed
buckets go to the store's ``output`` table, which ``ftwatch report`` plots as each instance's
output timeline. Counting is a dict update per chunk, cheap enough for ``ftwatch watch``'s
ingest path.
"""

from __future__ import annotations

import math

Row = tuple[str, str, "int | None", float, float, int, int]


class OutputCounts:
    """Lines and bytes per (job, instance) per ``seconds`` long bucket.

    Buckets start at multiples of ``seconds`` (epoch s), so counts from several processes or
    runs of one job line up. A bucket is handed out by :meth:`closed` once a chunk of a later
    bucket arrived (from any instance), and by :meth:`drain` at the end.

    Args:
        seconds: the bucket length in seconds, > 0.

    Raises:
        ValueError: ``seconds`` is not a positive finite number.
    """

    def __init__(self, seconds: float = 5.0):
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"bucket length must be positive seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self._counts: dict[tuple[str, str, float], list] = {}
        self._newest = -math.inf       # start of the newest bucket seen

    def bucket(self, time: float) -> float:
        """The start (epoch s) of the bucket that holds ``time``."""
        return math.floor(time / self.seconds) * self.seconds

    def add(self, job: str, instance: str, rank: int | None, time: float, lines: int,
            nbytes: int) -> bool:
        """Count ``lines`` lines of ``nbytes`` bytes read from ``instance`` at ``time`` (epoch s).

        Returns:
            True when ``time`` opened a newer bucket than any before, i.e. older buckets are
            now closed (take them with :meth:`closed`).
        """
        if not math.isfinite(time):
            return False
        start = self.bucket(time)
        slot = self._counts.get((job, instance, start))
        if slot is None:
            slot = self._counts[(job, instance, start)] = [rank, 0, 0]
        slot[1] += lines
        slot[2] += nbytes
        if start > self._newest:
            opened = self._newest != -math.inf
            self._newest = start
            return opened
        return False

    def closed(self) -> list[Row]:
        """Remove and return the buckets older than the newest one, as store rows
        ``(job, instance, rank, bucket, seconds, lines, bytes)``."""
        keys = [k for k in self._counts if k[2] < self._newest]
        return [self._row(k) for k in keys]

    def drain(self) -> list[Row]:
        """Remove and return every bucket, the open ones included."""
        return [self._row(k) for k in list(self._counts)]

    def _row(self, key: tuple[str, str, float]) -> Row:
        rank, lines, nbytes = self._counts.pop(key)
        return (key[0], key[1], rank, key[2], self.seconds, lines, nbytes)
