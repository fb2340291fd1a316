"""Runtime stragglers from step lines (H3): statistics, and the tap inside the real engine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ftwatch.confighealth import StragglerConfig
from ftwatch.events import FailureClass, Origin
from ftwatch.health.stragglers import StepTracker, is_straggler, scan_form
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules


@pytest.fixture(scope="module")
def rules():
    return load_rules([], builtin=True)


def engine_with(rules, **cfg) -> Engine:
    tracker = StepTracker(StragglerConfig(**{"min_steps": 5, **cfg}))
    return Engine(rules, steps=tracker)


def feed_steps(engine: Engine, step_times: dict[int, float], steps: int, line="step {n}/100 loss 0.5",
               t0: float = 1000.0, slow_steps: dict[int, set[int]] | None = None):
    """Each rank prints ``line`` per step, ``step_times[rank]`` seconds apart; chunks per rank per step."""
    found = []
    clock = {r: t0 for r in step_times}
    for n in range(1, steps + 1):
        for rank, dt in step_times.items():
            extra = 5.0 if slow_steps and n in slow_steps.get(rank, set()) else 0.0
            clock[rank] += dt + extra
            origin = Origin(f"worker-{rank}", rank, "job1", "node-a", "stdout")
            found += engine.feed(origin, (line.format(n=n) + "\n").encode(), clock[rank])
    return found


def test_statistics_need_the_factor_and_with_three_ranks_the_mad():
    assert is_straggler(3.0, [1.0, 1.0, 1.1], 1.5) == (True, pytest.approx(3.0))
    assert is_straggler(1.4, [1.0, 1.0], 1.5)[0] is False
    assert is_straggler(2.0, [1.0], 1.5) == (True, 2.0)                 # two ranks: the factor alone
    # the others disagree wildly: 1.6x their median is inside 3 scaled MADs -> not a straggler
    assert is_straggler(1.6, [0.2, 1.0, 3.0], 1.5)[0] is False
    assert is_straggler(5.0, [], 1.5)[0] is False


def test_a_slow_rank_becomes_one_straggler_finding_with_its_slowdown(rules):
    engine = engine_with(rules)
    found = feed_steps(engine, {0: 0.1, 1: 0.1, 2: 0.3, 3: 0.1}, steps=12)
    stragglers = [f for f in found if f.failure_class is FailureClass.STRAGGLER]
    assert len(stragglers) == 1
    f = stragglers[0]
    assert f.rank == 2 and f.rule_id == "straggler.step_time" and f.action.label == "notify"
    assert f.fields["slowdown"] == pytest.approx(3.0, rel=0.01)
    assert f.fields["pattern"] == "plain" and f.fields["steps"] >= 5
    assert "rank 2 is a straggler" in f.line


def test_a_few_slow_steps_are_not_a_straggler(rules):
    engine = engine_with(rules)
    found = feed_steps(engine, {0: 0.1, 1: 0.1, 2: 0.1}, steps=15, slow_steps={1: {5, 10}})
    assert [f for f in found if f.failure_class is FailureClass.STRAGGLER] == []


def test_no_finding_before_min_steps(rules):
    engine = engine_with(rules, min_steps=20)
    found = feed_steps(engine, {0: 0.1, 1: 0.5}, steps=15)
    assert found == []


def test_megatron_lines_give_their_own_elapsed_time(rules):
    engine = engine_with(rules)
    line = (" iteration {n}/     100 | consumed samples: 64 | elapsed time per iteration (ms): {ms} | "
            "learning rate: 1.0E-04 | lm loss: 7.1E+00 |")
    found = []
    for n in range(1, 9):
        for rank, ms in ((0, 1000.0), (1, 1010.0), (2, 2600.0)):
            origin = Origin(f"w{rank}", rank, "job1", "n", "stdout")
            # all lines arrive at the same time: only the printed duration can tell the ranks apart
            found += engine.feed(origin, (line.format(n=n, ms=ms) + "\n").encode(), 5000.0)
    stragglers = [f for f in found if f.kind == "straggler"]
    assert [f.rank for f in stragglers] == [2]
    assert stragglers[0].fields["pattern"] == "megatron"
    assert stragglers[0].fields["step_time_s"] == pytest.approx(2.6)


def test_tqdm_rates_and_a_rank_prefix_from_a_combined_stream(rules):
    engine = engine_with(rules)
    found = []
    for n in range(1, 9):
        chunk = "".join(f"[rank{r}]: {n}/100 [00:05<00:45,  {rate}it/s, loss=0.5]\n"
                        for r, rate in ((0, 2.0), (1, 2.1), (2, 0.5)))
        found += engine.feed(Origin("pod-0", None, "job1", "n", "stderr"), chunk.encode(), 10.0 + n)
    stragglers = [f for f in found if f.kind == "straggler"]
    assert [f.rank for f in stragglers] == [2]
    assert stragglers[0].fields["slowdown"] == pytest.approx(2.05 / 0.5, rel=0.01)


def test_step_lines_still_reach_the_rules(rules):
    """A line that is a step line and an error line gives both findings (the tap takes nothing away)."""
    engine = engine_with(rules)
    origin = Origin("w0", 0, "job1", "n", "stdout")
    found = engine.feed(origin, b"step 3 RuntimeError: CUDA error: an illegal memory access was encountered\n", 1.0)
    assert any(f.kind != "straggler" for f in found)


def test_reset_forgets_the_previous_attempt(rules):
    tracker = StepTracker(StragglerConfig(min_steps=5))
    engine = Engine(rules, steps=tracker)
    feed_steps(engine, {0: 0.1, 1: 0.4}, steps=10)
    assert tracker.reported
    tracker.reset()
    assert not tracker.samples and not tracker.reported


def test_engine_without_a_tap_sees_no_step_lines(rules):
    engine = Engine(rules)
    assert feed_steps(engine, {0: 0.1, 1: 0.9}, steps=12) == []


def test_custom_pattern_and_bad_patterns():
    cfg = StragglerConfig(patterns=[r"it=(?P<step>\d+) took (?P<s>[0-9.]+)s"], min_steps=3)
    tracker = StepTracker(cfg)
    assert tracker.patterns == (r"it=(?:\d+) took (?:[0-9.]+)s",)
    with pytest.raises(ValidationError, match="needs a"):
        StragglerConfig(patterns=[r"iteration \d+"])
    with pytest.raises(ValidationError, match="neither a built-in"):
        StragglerConfig(patterns=["megatorn("])
    assert scan_form(r"(?P<a>x)(?P<b>y)") == "(?:x)(?:y)"
