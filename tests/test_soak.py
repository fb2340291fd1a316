"""`make soak`'s building blocks at a tiny scale (the soak itself is not part of `make test`).

The listeners part runs for real (a `watch` subprocess, a few hundred valid lines beside 12 fuzz
exchanges, about 5 s); the judging of the RSS series and the table are checked on made-up numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))       # bench/ is beside the package, not in it

from bench.soak import listeners, rss  # noqa: E402
from bench.soak.__main__ import table  # noqa: E402
from bench.soak.common import Figure, zero  # noqa: E402


def test_fuzzed_listeners_count_every_valid_line_and_survive(tmp_path):
    figures = {f.name: f for f in listeners.run(tmp_path, lines_forward=400, lines_http=200, clients=2, fuzzers=2,
                                                       exchanges=12)}
    assert figures["fuzz: watch crashes"].value == 0, figures["fuzz: watch crashes"].note
    assert "truncated" in figures["fuzz: watch crashes"].note or "random" in figures["fuzz: watch crashes"].note
    for name in ("Forward", "HTTP"):
        assert figures[f"fuzz: {name} lines lost"].value == 0, figures[f"fuzz: {name} lines lost"].note
        assert figures[f"fuzz: {name} lines duplicated"].value == 0
    assert all(f.ok for f in figures.values())


def test_rss_flat_compares_the_last_third_with_the_middle_one():
    flat = [(3.0 * i, 70_000 + (500 if i % 2 else 0)) for i in range(9)]
    growing = [(3.0 * i, 70_000 + 4_000 * i) for i in range(9)]
    assert rss.judge(flat)[2] < 0.10
    middle, last, growth = rss.judge(growing)
    assert (middle, last) == (86_000, 98_000) and growth > 0.10
    assert rss.slope_mib_per_min(growing) == 4_000 / 1024 / 3 * 60
    assert rss.slope_mib_per_min(flat[:1]) == 0.0


def test_rss_slope_is_fitted_from_when_the_findings_cap_is_full():
    # 40 samples, 3 s apart: RSS rises while the cap fills (to sample 24), then stays flat
    filling = [(3.0 * i, 70_000 + 1_000 * min(i, 24)) for i in range(40)]
    start = rss.steady_from(len(filling), full=24)
    assert start == 24 and rss.slope_mib_per_min(filling[start:]) == 0.0
    assert rss.slope_mib_per_min(filling[len(filling) // 3:]) > 1.0    # from the first third: the filling
    assert rss.steady_from(40, None) == 20                  # the cap never full: the first half
    assert rss.steady_from(40, 4) == 20                     # full early: still past the first half
    assert rss.steady_from(40, 37) == 40 - rss.MIN_STEADY   # full late: at least MIN_STEADY samples
    assert rss.steady_from(6, 5) == 0                       # fewer than that: all of them


def test_rss_reads_which_caps_dropped_state_from_metrics():
    text = ('# TYPE ftwatch_state_evicted_total counter\nftwatch_state_evicted_total{kind="finding"} 1250.0\n'
            'ftwatch_state_evicted_total{kind="job"} 0.0\nftwatch_lines_total{job_id="a"} 5.0\n')
    assert rss.evictions(text) == {"finding": 1250.0}
    assert rss.evictions("") == {}


def test_table_marks_a_missed_goal():
    text = table([zero("a: lost", 0), zero("b: duplicated", 3, "3 of 10"), Figure("c: growth (%)", 12.5, "<= 10", False)])
    rows = text.splitlines()
    assert rows[2].split()[-1] == "ok" and rows[3].split()[-1] == "MISSED" and rows[5].split()[-1] == "MISSED"
    assert "(3 of 10)" in rows[4]
