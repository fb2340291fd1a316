"""The survival reader's lines before every waiting error of their instance (issue 16): most lines
of a replayed chunk, which only add their counters to what the errors saw before them. Only the
last such line holding each counter is read (``progress.Survival._log_before``), and what the
errors then decide equals reading every line (``progress.DEFER_BEFORE`` off)."""

from __future__ import annotations

import random

import pytest

from ftwatch.events import Origin
from ftwatch.policy import progress, waiting
from ftwatch.testing import T0, finding

ORIGIN = Origin("corpus", None, "j", "n", "stderr", "replay")

#: progress lines with their own stamps (deferrable), untimed ones, vetoed ones and others, for ranks 0-3
LINES = [
    "[rank{r}]: [{ts}] iteration {n:>8}/ 1000 | consumed samples: 9 | elapsed time per iteration (ms): 12.5 |",
    "[rank{r}]: [{ts}] Epoch {e}: step {n} loss 0.5",
    "[rank{r}]: [{ts}] epoch {e} iter {n}",
    "[rank{r}]: [{ts}] step {n} failed, retrying",
    "[rank{r}]: step {n} loss 0.5",
    "[rank{r}]: [{ts}] loss 0.5",
    "{ts} INFO epoch {e} step {n}",
    "nothing at all {n}",
    "[rank{r}]: [{ts}] iteration",
    "[rank{r}]: [{ts}] global_step={n}",
]


def stamp(seconds: int) -> str:
    return f"2026-11-21 09:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def chunks(seed: int, count: int = 6, size: int = 300) -> list[bytes]:
    """Chunks of a log whose clock runs forward, with its counters going on or starting over."""
    rng = random.Random(seed)
    out, clock, n, e = [], 0, 1, 0
    for _ in range(count):
        lines = []
        for _ in range(size):
            clock += rng.choice((0, 0, 1))
            n += 1
            if rng.random() < 0.01:
                n, e = 1, e + rng.choice((-1, 1))          # a restart, or a new epoch
            lines.append(rng.choice(LINES).format(r=rng.randrange(4), ts=stamp(clock), n=n, e=max(0, e)))
        out.append(("\n".join(lines) + "\n").encode())
    return out


def survival(seed: int) -> progress.Survival:
    """Errors of ranks 0-3 and of the combined log waiting, at times across the chunks."""
    rng = random.Random(seed + 100)
    s = progress.Survival(window=600, needed=2)
    for k in range(12):
        instance = rng.choice(("rank0", "rank1", "rank2", "rank3", "corpus"))
        at = progress.fields.parse_timestamp(stamp(rng.randrange(0, 600)), 2026)
        s.wait(finding("python.exception", time=at, at=Origin(instance, None, "j", "n", "stderr", "replay")))
    return s


def state(s: progress.Survival) -> list:
    """What the waiting errors will decide by: each one's lines after it and, folded, its counters before it."""
    table = s._waiting
    for order in list(table._by.values()):
        for _, _, key in order:
            log = table._logs.get(table._entries[key][0].origin.instance)
            if log is not None:
                waiting._fold(table._entries[key], log)
    return [(entry[0].origin.instance, entry[0].time, entry[1], entry[2]) for entry in table._entries.values()]


@pytest.mark.parametrize("seed", range(10))
def test_reading_only_the_last_line_of_each_counter_decides_as_reading_every_line(seed, monkeypatch):
    fast, slow = survival(seed), survival(seed)
    start = progress.fields.parse_timestamp(stamp(0), 2026)
    for data in chunks(seed):
        monkeypatch.setattr(progress, "DEFER_BEFORE", False)
        want = slow.outlived(ORIGIN, data, start, 0.001, 2026)
        monkeypatch.setattr(progress, "DEFER_BEFORE", True)
        got = fast.outlived(ORIGIN, data, start, 0.001, 2026)
        assert [(f.origin.instance, f.time, at) for f, at in got] == [(f.origin.instance, f.time, at) for f, at in want]
        assert state(fast) == state(slow)
    assert [f.time for f in fast.notices] == [f.time for f in slow.notices]


def test_lines_before_the_error_read_one_line_per_counter(monkeypatch):
    calls = []
    real = progress._counters
    monkeypatch.setattr(progress, "_counters", lambda line: calls.append(line) or real(line))
    s = progress.Survival(window=600, needed=2)
    error = finding("python.exception", time=T0 + 3600, at=Origin("rank3", None, "j", "n", "stderr", "replay"))
    s.wait(error)
    data = b"".join(b"[rank%d]: [2026-11-21 00:00:%02d] iteration %d/ 100 | elapsed time per iteration (ms): 1.0 |\n"
                    % (i % 4, i % 60, i) for i in range(4000))
    assert s.outlived(ORIGIN, data, T0, 0.001, 2026) == []
    assert calls == [data.split(b"\n")[3999]]              # rank 3's last line: it holds both counters
    later = b"[rank3]: [2026-11-21 02:00:00] iteration 5/ 100 | elapsed time per iteration (ms): 1.0 |\n"
    assert s.outlived(ORIGIN, later * 2, T0, 0.001, 2026) == []
    assert s.notices == [] and not s          # iteration 5 after 3999 before it: it started over
