"""Runtime stragglers from step lines (H3): statistics, and the tap inside the real engine."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ftwatch.clock import FakeClock
from ftwatch.config.health import STEP_PATTERNS, StragglerConfig
from ftwatch.events import FailureClass, Origin
from ftwatch.rules import stepverdicts, stragglers
from ftwatch.rules.stragglers import SWEEP_EVERY, StepTracker, is_straggler, scan_form
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
    assert f.fields["pattern"] == "plain" and f.fields["step_lines"] >= 5
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
        chunk = "".join(f"[rank{r}]: {n:3d}%|#         | {n}/100 [00:05<00:45,  {rate}it/s, loss=0.5]\n"
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
    assert not tracker.jobs and not tracker.reported


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


# -- robust statistics: the spread is the other ranks' (a slow node carrying half the ranks) --------

@pytest.mark.parametrize("slow,ranks", [(1, 2), (2, 4), (4, 8), (3, 8)])
def test_slow_ranks_are_found_even_when_they_are_half_of_the_job(rules, slow, ranks):
    engine = engine_with(rules)
    times = {r: (0.3 if r >= ranks - slow else 0.1) + 0.001 * (r % 3) for r in range(ranks)}
    found = feed_steps(engine, times, steps=12)
    assert sorted(f.rank for f in found if f.kind == "straggler") == list(range(ranks - slow, ranks))


def test_noisy_ranks_without_a_straggler_give_nothing(rules):
    engine = engine_with(rules)
    times = {0: 0.10, 1: 0.13, 2: 0.08, 3: 0.15, 4: 0.11, 5: 0.09, 6: 0.14, 7: 0.12}
    assert [f for f in feed_steps(engine, times, steps=15) if f.kind == "straggler"] == []


def test_the_others_spread_decides_with_half_slow():
    assert is_straggler(3.0, [3.0, 1.0, 1.0], 1.5)[0] is True            # 2 of 4 slow
    assert is_straggler(3.0, [3.0, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0], 1.5)[0] is True   # 4 of 8 slow
    assert is_straggler(1.0, [3.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0], 1.5)[0] is False


# -- findings say step lines; hysteresis; forgetting jobs ------------------------------------------

def test_deepspeed_lines_every_ten_steps_count_as_step_lines(rules):
    engine = engine_with(rules)
    found = []
    for k in range(1, 9):
        for rank, dt in ((0, 0.1), (1, 0.1), (2, 0.4)):
            origin = Origin(f"w{rank}", rank, "job1", "n", "stdout")
            line = f"[Rank {rank}] step={10 * k}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]\n"
            found += engine.feed(origin, line.encode(), 1000.0 + 10 * k * dt)
    f = next(f for f in found if f.kind == "straggler")
    assert f.rank == 2 and f.fields["step_time_s"] == pytest.approx(0.4)
    assert "over its last 5 step lines" in f.line and f.fields["step_lines"] == 5


def test_a_recovered_rank_that_slows_again_is_reported_again(rules):
    engine = engine_with(rules, window=10)
    clock = {0: 0.0, 1: 0.0}
    found = []

    def run(dt1: float, steps: int, first: int):
        for n in range(first, first + steps):
            for rank, dt in ((0, 0.1), (1, dt1)):
                clock[rank] += dt
                origin = Origin(f"w{rank}", rank, "job1", "n", "stdout")
                found.extend(engine.feed(origin, f"step {n}/999\n".encode(), 1000.0 + clock[rank]))
    run(0.3, 10, 1)
    assert [f.rank for f in found if f.kind == "straggler"] == [1]
    run(0.3, 20, 11)                                                  # still slow: no repeat
    assert len([f for f in found if f.kind == "straggler"]) == 1
    run(0.1, 20, 31)                                                  # recovered
    run(0.3, 20, 51)                                                  # slow again: reported again
    assert [f.rank for f in found if f.kind == "straggler"] == [1, 1]


def test_jobs_not_seen_for_forget_after_are_dropped():
    clock = FakeClock()
    tracker = StepTracker(StragglerConfig(min_steps=3, forget_after=600), clock=clock)
    idx = tracker.names.index("plain")
    tracker.observe(Origin("w0", 0, "old"), idx, "step 1", clock.time())
    clock.advance(300)
    tracker.observe(Origin("w0", 0, "new"), idx, "step 1", clock.time())
    clock.advance(max(301, SWEEP_EVERY))
    tracker.observe(Origin("w0", 0, "new"), idx, "step 2", clock.time())
    assert set(tracker.jobs) == {"new"}
    clock.advance(3600)
    tracker.observe(Origin("w0", 0, "third"), idx, "step 1", clock.time())
    assert set(tracker.jobs) == {"third"}


# -- one printing rank: the job's own slowdown; Megatron's straggler detector ---------------------

def test_one_rank_printing_gives_a_job_slowdown_not_a_straggler(rules):
    engine = engine_with(rules, min_steps=5)
    line = (" [2026-11-21 09:00:00] iteration {n:8d}/     100 | consumed samples: 64 | "
            "elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.0E-04 | lm loss: 7.1E+00 |\n")
    origin = Origin("w3", 3, "job1", "n", "stdout")          # print_rank_last: only the last rank prints
    found = []
    for n in range(1, 31):
        ms = 1000.0 if n <= 12 else 2400.0
        found += engine.feed(origin, line.format(n=n, ms=ms).encode(), 5000.0 + n)
    assert [f.kind for f in found] == ["slowdown"]
    f = found[0]
    assert f.rank is None and f.rule_id == "straggler.job_slowdown" and f.action.label == "notify"
    assert f.fields["slowdown"] == pytest.approx(2.4) and f.fields["reporting_rank"] == 3
    assert "job job1 step time rose 2.4x" in f.line and "not a rank straggler" in f.line


def test_a_steady_single_rank_gives_no_slowdown(rules):
    engine = engine_with(rules, min_steps=5)
    origin = Origin("w0", 0, "job1", "n", "stdout")
    found, t = [], 100.0
    for n in range(1, 40):
        t += 1.0 + 0.3 * (n % 2)                      # noisy, but no slower than at the start
        found += engine.feed(origin, f"step {n} loss 0.5\n".encode(), t)
    assert found == []


DETECTOR = ("[2024-03-14 23:07:{s:02d}] | MnRtt/Rnk: {lo:.2f}ms/8 | MxRtt/Rnk: {hi:.2f}ms/{slow} | "
            "MnPwr/Rnk: 601796W/8 | MxPwr/Rnk: 683801W/18 | MnTmp/Rnk: 52C/0 | MxTmp/Rnk: 65C/21\n")


def test_megatron_straggler_detector_names_the_persistently_slowest_rank(rules):
    engine = engine_with(rules)
    origin = Origin("w0", 0, "job1", "n", "stdout")
    found = []
    for s, (hi, slow) in enumerate([(3468.2, 0), (9000.0, 5), (8800.0, 5), (3470.0, 2), (8900.0, 5),
                                    (9100.0, 5), (9050.0, 5), (9000.0, 5)]):
        found += engine.feed(origin, DETECTOR.format(s=s, lo=3453.08, hi=hi, slow=slow).encode(), 100.0 + s)
    assert [(f.kind, f.rank) for f in found] == [("straggler", 5)]
    f = found[0]
    assert f.rule_id == "straggler.megatron_detector" and f.fields["reports"] == 3
    assert f.fields["slowdown"] == pytest.approx(9050.0 / 3453.08, rel=0.01)
    assert "rank 5 is a straggler" in f.line


def test_megatron_detector_within_the_factor_is_quiet(rules):
    engine = engine_with(rules)
    origin = Origin("w0", 0, "job1", "n", "stdout")
    found = []
    for s in range(10):
        found += engine.feed(origin, DETECTOR.format(s=s, lo=3453.08, hi=3468.2, slow=0).encode(), 100.0 + s)
    assert found == []


# -- the built-in patterns on real-looking lines of each trainer -----------------------------------

def pattern_of(line: str) -> str | None:
    """The name of the built-in pattern that takes ``line`` (as the tracker does), else None."""
    tracker = StepTracker(StragglerConfig(min_steps=3))
    for i, name in enumerate(tracker.names):
        found = [m for m in tracker.regexes[i].finditer(line) if tracker._accepts(name, line, m)]
        if found:
            return name
    return None


@pytest.mark.parametrize("line,name", [
    # Megatron-LM training_log (megatron/training/training.py)
    (" [2026-11-21 09:00:01] iteration       10/     100 | consumed samples:          640 | elapsed time per "
     "iteration (ms): 1234.5 | learning rate: 1.000000E-04 | global batch size:    64 | lm loss: 7.1E+00 |",
     "megatron"),
    # Megatron --log-straggler (megatron/core/utils.py StragglerDetector.report)
    ("[2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | MnPwr/Rnk: 601796W/8 |",
     "megatron_straggler"),
    # DeepSpeed engine._report_progress via log_dist
    ("[2026-11-21 09:00:01,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], "
     "mom=[(0.9, 0.999)]", "deepspeed"),
    # HF Trainer training bar (tqdm, no description)
    (" 45%|████▌     | 45/100 [00:10<00:12,  4.50it/s]", "tqdm_its"),
    ("\r  3%|▎         | 3/100 [00:04<02:26,  1.52s/it]", "tqdm_sit"),
    # Lightning TQDMProgressBar training bar
    ("Epoch 0:  45%|████▌     | 45/100 [00:10<00:12,  4.50it/s, v_num=0, train_loss=0.512]", "tqdm_its"),
    # Lightning RichProgressBar training bar
    ("Epoch 0/9  ━━━━━━━━━━━━━━━━━━━━━━━━━ 45/100 0:00:10 • 0:00:12 4.50it/s v_num: 0 train_loss: 0.512",
     "lightning_rich"),
    ("Epoch 3    ━━━━━━━━━━━━━━━━━━━━━━━━━ 7/100 0:00:02 • -:--:-- 3.21it/s", "lightning_rich"),
    # plain trainers
    ("step 12/30 loss 0.43", "plain"),
    ("Step: 12 | loss 0.43", "plain"),
    ("global_step=12 loss=0.43", "plain"),
    ("step 100 | loss 2.3 | lr 0.0001", "plain"),
    ("step 500: train loss 4.0, val loss 4.1, eval_loss 4.2", "plain"),
    ("[2026-11-21 09:00:01] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=101.2, "
     "CurrSamplesPerSec=99.8, MemAllocated=1.2GB", "plain"),
])
def test_builtin_patterns_take_the_step_lines_of_each_trainer(line, name):
    assert pattern_of(line) == name


@pytest.mark.parametrize("line", [
    "Saving checkpoint at step 100",
    "[INFO] saving checkpoint to /ckpt/global_step100",
    "lr scheduler step 3",
    "Loading checkpoint shards:  50%|█████     | 1/2 [00:03<00:03,  3.21s/it]",
    "Validation DataLoader 0:  45%|████▌     | 5/11 [00:01<00:01,  4.50it/s]",
    "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 10.20it/s]",
    "Validation DataLoader 0 ━━━━━━━━━━━━━━━━━━━━━━━ 5/11 0:00:01 • 0:00:01 4.50it/s",
    "Evaluating: 100%|██████████| 13/13 [00:01<00:00, 10.2it/s]",
    "Map: 100%|██████████| 1000/1000 [00:00<00:00, 9914.64 examples/s]",
    "warmup step 3 of 100",
    "stepped into the loop",
])
def test_lines_that_are_not_training_steps_are_not_taken(line):
    assert pattern_of(line) is None


def test_hf_evaluation_bar_of_another_length_does_not_count(rules):
    """HF's evaluation bar has no description either: a bar of another length than the rank's first is ignored."""
    tracker = StepTracker(StragglerConfig(min_steps=3))
    idx = tracker.names.index("tqdm_its")
    origin = Origin("w0", 0, "job1")
    tracker.observe(origin, idx, " 10%|█         | 10/100 [00:02<00:18,  5.00it/s]", 1.0)
    tracker.observe(origin, idx, " 50%|█████     | 5/10 [00:00<00:00, 50.00it/s]", 2.0)
    tracker.observe(origin, idx, " 11%|█         | 11/100 [00:02<00:18,  5.00it/s]", 3.0)
    assert list(tracker.jobs["job1"].ranks["w0"].samples) == [0.2, 0.2]


def test_builtin_patterns_compile_in_the_engines_matcher():
    from ftwatch.rules.matcher import Matcher
    from ftwatch.rules.model import Pattern
    tracker = StepTracker(StragglerConfig())
    assert set(tracker.names) <= set(STEP_PATTERNS)
    for text in tracker.patterns:
        assert Matcher.check(Pattern(text, regex=True)) is None, text


def test_a_slow_node_carrying_most_ranks_is_found_by_comparing_nodes(rules):
    """Node a has 6 slow ranks, node b 2 fast ones: rank vs ranks cannot tell, node vs node can."""
    engine = engine_with(rules)
    found, clock = [], {r: 1000.0 for r in range(8)}
    for n in range(1, 13):
        for rank in range(8):
            node = "node-a" if rank < 6 else "node-b"
            clock[rank] += 0.3 if node == "node-a" else 0.1
            origin = Origin(f"w{rank}", rank, "job1", node, "stdout")
            found += engine.feed(origin, f"step {n}/100\n".encode(), clock[rank])
    stragglers = [f for f in found if f.kind == "straggler"]
    assert [(f.origin.node, f.rank) for f in stragglers] == [("node-a", None)]
    assert stragglers[0].fields["slowdown"] == pytest.approx(3.0, rel=0.01) and "node node-a" in stragglers[0].line


def feed_ranks(engine: Engine, ranks: int, per_node: int, step_time, clock: dict[int, float]) -> list:
    """12 rounds of ``step n/100`` lines from ``ranks`` ranks, ``per_node`` to a node; rank r's
    clock advances ``step_time(r)`` s a step. Returns the findings."""
    found = []
    for n in range(1, 13):
        for rank in range(ranks):
            clock[rank] = clock.get(rank, 1000.0) + step_time(rank)
            found += engine.feed(Origin(f"w{rank}", rank, "job1", f"node-{rank // per_node}", "stdout"),
                                 f"step {n}/100\n".encode(), clock[rank])
    return found


def test_nodes_alike_give_no_node_finding(rules):
    assert feed_ranks(engine_with(rules), 8, 4, lambda rank: 0.1 + 0.01 * (rank % 3), {}) == []


@given(st.lists(st.floats(0.001, 100.0, allow_nan=False), min_size=1, max_size=40), st.data())
@settings(max_examples=200, deadline=None)
def test_sorted_medians_equal_statistics_median(values, data):
    ordered = sorted(values)
    assert stragglers.sorted_median(ordered) == statistics.median(values)
    leave = data.draw(st.sampled_from(values))
    rest = list(values)
    rest.remove(leave)
    expected = statistics.median(rest) if rest else None
    assert stragglers.median_without(ordered, leave) == expected
    assert stragglers.without(ordered, leave) == sorted(rest)


def test_a_step_line_of_a_rank_in_line_with_the_others_scans_no_other_rank(rules, monkeypatch):
    """O(log ranks) per step line: while no rank is past ``factor``, the full test (a list of
    every other rank's median, their MAD) never runs; the statistics still find the straggler."""
    calls = []
    real = stepverdicts.is_straggler           # the verdicts' full test (rules/stepverdicts.py)
    monkeypatch.setattr(stepverdicts, "is_straggler", lambda *a: calls.append(len(a[1])) or real(*a))
    engine, clock = engine_with(rules), {}
    found = feed_ranks(engine, 512, 8, lambda rank: 0.1 + 0.001 * (rank % 7), clock)
    assert found == [] and calls == []
    for n in range(13, 40):
        clock[5] += 1.0                                   # rank 5 becomes 10x slower
        found += engine.feed(Origin("w5", 5, "job1", "node-0", "stdout"), f"step {n}/100\n".encode(), clock[5])
    assert [f.origin.rank for f in found if f.kind == "straggler"] == [5] and calls


def test_builtin_scan_forms_hit_once_per_line_and_need_no_recheck():
    """The built-in step patterns' scan forms cannot span two lines (no RE2 re-check per hit) and
    end on one character (one matcher callback per step line), and hit what the patterns hit."""
    from ftwatch.rules.matcher import Matcher
    from ftwatch.rules.model import Pattern
    from ftwatch.rules.patterns import _translate
    tracker = StepTracker(StragglerConfig())
    lines = [" [2026-11-21 09:36:03] iteration       10/     100 | consumed samples: 640 | elapsed time per "
             "iteration (ms): 1234.5 | lr: 1E-04 |", "[Rank 0] step=10, skipped=0, lr=[0.001]",
             " 45%|####5     | 45/100 [00:10<00:12,  4.50it/s]", "step 12/30 loss 0.43", "Step:\t12",
             "Epoch 0/9  ━━━━━━━━━━━━━━━ 45/100 0:00:10 • 0:00:12 4.50it/s v_num: 0", "nothing here"]
    for name, text, rx in zip(tracker.names, tracker.patterns, tracker.regexes):
        assert not _translate(Pattern(text, regex=True)).may_span, name
        matcher = Matcher([Pattern(text, regex=True)])
        for line in lines:
            assert bool(matcher.scan(line.encode())) == bool(rx.search(line)), (name, line)
    pytest.importorskip("hyperscan")
    megatron = Matcher([Pattern(tracker.patterns[0], regex=True)], backend="hyperscan")
    calls = []
    megatron._db.scan(lines[0].encode(), match_event_handler=lambda *a: calls.append(a), scratch=megatron._scratch)
    assert len(calls) == 1


# -- the batch tap: one pass per chunk, verdicts at the chunk's end (issue 16 item 1) -------------

def _chunk_pattern(line: str) -> str | None:
    """The pattern the chunk pass gives ``line`` (behind a rank prefix, between other lines)."""
    tracker = StepTracker(StragglerConfig(min_steps=3))
    data = f"noise before\n[rank1]: {line}\nnoise after\n".encode()
    hits = tracker.lines.find(data, len(data))
    assert len({start for start, _, _ in hits}) <= 1
    return tracker.names[hits[-1][1]] if hits else None


@pytest.mark.parametrize("line", [
    " [2026-11-21 09:00:01] iteration       10/     100 | consumed samples:          640 | elapsed time per "
    "iteration (ms): 1234.5 | learning rate: 1.000000E-04 |",
    "[2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | MnPwr/Rnk: 601796W/8 |",
    "[2026-11-21 09:00:01,123] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001]",
    " 45%|████▌     | 45/100 [00:10<00:12,  4.50it/s]", "\r  3%|▎         | 3/100 [00:04<02:26,  1.52s/it]",
    "Epoch 0:  45%|████▌     | 45/100 [00:10<00:12,  4.50it/s, v_num=0, train_loss=0.512]",
    "Epoch 0/9  ━━━━━━━━━━━━━━━━━━━━━━━━━ 45/100 0:00:10 • 0:00:12 4.50it/s v_num: 0 train_loss: 0.512",
    "step 12/30 loss 0.43", "Step: 12 | loss 0.43", "global_step=12 loss=0.43", "Step:\t12",
    "step 500: train loss 4.0, val loss 4.1, eval_loss 4.2",
    "[2026-11-21 09:00:01] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=101.2",
    "Saving checkpoint at step 100", "lr scheduler step 3", "warmup step 3 of 100", "stepped into the loop",
    "Loading checkpoint shards:  50%|█████     | 1/2 [00:03<00:03,  3.21s/it]",
    "Validation DataLoader 0:  45%|████▌     | 5/11 [00:01<00:01,  4.50it/s]",
    "Validation DataLoader 0 ━━━━━━━━━━━━━━━━━━━━━━━ 5/11 0:00:01 • 0:00:01 4.50it/s",
    "Map: 100%|██████████| 1000/1000 [00:00<00:00, 9914.64 examples/s]", "nothing here", "xstep=3, skipped=0",
])
def test_the_chunk_pass_takes_what_the_per_line_patterns_take(line):
    """The bytes forms (heads behind their first literal, the vetoes on bytes, a rank prefix before
    the line) give each line the pattern the per-line regexes give it."""
    assert _chunk_pattern(line) == pattern_of(line)


@given(st.text(st.sampled_from("[]:0123 rankdefault_-1x"), max_size=30))
@settings(max_examples=300, deadline=None)
def test_rank_prefix_at_is_split_rank_prefix_on_bytes(text):
    from ftwatch.parsers.fields import rank_prefix_at, split_rank_prefix
    rank, end = rank_prefix_at(text.encode(), 0)
    assert (rank, text[end:]) == split_rank_prefix(text)


MEGATRON = ("[rank{r}]: [2026-11-21 09:00:{s:02d}] iteration {n:8d}/     100 | consumed samples: 64 | "
            "elapsed time per iteration (ms): {ms:.1f} | lm loss: 7.1E+00 |\n")


def test_a_chunk_of_many_ranks_step_lines_gives_the_straggler_by_its_end(rules):
    """One chunk holding every rank's step lines: the verdict runs once, at the chunk's end, and
    names the same rank, ratio and window as line-by-line feeding; the finding's line and time
    are the straggler's last step line of the chunk, after the chunk's other findings."""
    chunk = "".join(MEGATRON.format(r=r, s=n, n=n, ms=3000.0 if r == 2 else 1000.0)
                    for n in range(1, 9) for r in range(4)).encode()
    origin = Origin("combined", None, "job1", "n", "stdout", "replay")
    batch = engine_with(rules).feed(origin, chunk, 100.0)
    single = engine_with(rules)
    by_line = [f for line in chunk.splitlines(keepends=True) for f in single.feed(origin, line, 100.0)]
    assert [(f.rank, f.fields["slowdown"], f.fields["step_lines"]) for f in batch] == [(2, 3.0, 8)]
    assert [(f.rank, f.fields["slowdown"]) for f in by_line] == [(2, 3.0)]
    assert by_line[0].fields["step_lines"] == 5                       # per line: at the 5th (min_steps)
    assert "iteration        8/" in batch[0].evidence[0]             # the rank's last step line in the chunk
    assert batch[0].time == 1795251608.0                                # its own stamp, 2026-11-21 09:00:08


def test_step_lines_that_state_their_duration_parse_no_timestamp(rules, monkeypatch):
    """Timestamps parsed only when needed: Megatron lines carry their step time; with no finding
    to date, the chunk's step lines parse no stamp but the ranks' last lines (one per rank)."""
    from ftwatch.parsers import fields as fields_mod
    calls = []
    real = fields_mod.parse_timestamp
    monkeypatch.setattr(fields_mod, "parse_timestamp", lambda *a: calls.append(a[0]) or real(*a))
    chunk = "".join(MEGATRON.format(r=r, s=n, n=n, ms=1000.0) for n in range(1, 30) for r in range(4)).encode()
    assert engine_with(rules).feed(Origin("combined", None, "job1", "n", "stdout", "replay"), chunk, 100.0) == []
    assert len(calls) <= 4


def test_step_lines_after_an_open_block_are_taken_once(rules):
    """A traceback still open at a chunk's end is carried with the lines after it: another rank's
    step line there is taken with the next chunk, once, at the carried part's time."""
    tracker = StepTracker(StragglerConfig(min_steps=5))
    engine = Engine(rules, steps=tracker)
    origin = Origin("combined", None, "job1", "n", "stdout", "replay")
    engine.feed(origin, b"[rank0]: Traceback (most recent call last):\n[rank1]: step 1 loss 0.5\n", 10.0)
    assert "job1" not in tracker.jobs                          # carried, not taken yet
    engine.feed(origin, b"[rank1]: step 2 loss 0.5\n[rank0]: ValueError: boom\n[rank1]: step 3 loss 0.5\n", 20.0)
    rank = tracker.jobs["job1"].ranks["rank1"]
    assert list(rank.samples) == [5.0] and rank.seen == 1     # 10 s -> 20 s, steps 2 and 3 dated alike


def test_step_lines_dated_alike_make_one_step_time_over_their_steps(rules):
    """Live, every line of a hand-over has its time: of a rank's lines dated alike, the last
    stands for them all, measured from the last line of the hand-over before (no 0 s steps)."""
    tracker = StepTracker(StragglerConfig(min_steps=5))
    engine = Engine(rules, steps=tracker)
    origin = Origin("worker-0", 0, "job1", "n", "stdout", "process")
    for t, steps in [(100.0, (1, 2)), (100.1, (3, 4)), (100.2, (5,)), (100.5, (6, 7, 8))]:
        engine.feed(origin, b"".join(b"step %d/100 loss 0.5\n" % n for n in steps), t)
    rank = tracker.jobs["job1"].ranks["worker-0"]
    assert list(rank.samples) == pytest.approx([0.05, 0.1, 0.1]) and rank.seen == 3
    assert rank.baseline == list(rank.samples) and sorted(rank.samples) == rank.ordered


def handovers(period: float, phase: float, steps: int, linger: float = 0.08) -> list[tuple[float, list[int]]]:
    """(time, step numbers) of each hand-over of a rank printing a step every ``period`` s from
    ``phase`` to a reader like ``sources.process.read_lines``: a line of a quiet stream goes at
    once; lines written during a linger go at its end, dated when it began."""
    prints = [(phase + k * period, k) for k in range(1, steps + 1)]
    out: list[tuple[float, list[int]]] = []
    last, i = None, 0
    while i < len(prints):
        if last is None or prints[i][0] >= last + linger:
            last = prints[i][0]
            out.append((last, [prints[i][1]]))
            i += 1
        else:
            waited = [k for at, k in prints[i:] if at <= last + linger]
            out.append((last, waited))
            last += linger
            i += len(waited)
    return out


@pytest.mark.parametrize("phases", [(0.0, 0.0), (0.0, 0.02), (0.01, 0.04), (0.03, 0.01)])
def test_fast_ranks_read_through_lingering_hand_overs_are_no_stragglers(rules, phases):
    """Two ranks step every 50 ms, a third every 150 ms; ``run``'s reader hands each rank's lines
    over 80 ms apart, dated when the linger began. Only the slow rank is a straggler, whatever
    the phases (line by line, one of the fast ranks was one too, at every phase)."""
    engine = Engine(rules, steps=StepTracker(StragglerConfig(min_steps=8)))
    parts = []
    for rank, (period, phase) in enumerate([(0.05, phases[0]), (0.05, phases[1]), (0.15, 0.0)]):
        origin = Origin(f"worker-{rank}", rank, "job1", "n", "stdout", "process")
        parts += [(t, rank, origin, b"".join(b"step %d/40 loss 0.5\n" % k for k in steps))
                  for t, steps in handovers(period, phase, 40)]
    found = [f for t, _, origin, data in sorted(parts, key=lambda p: p[:2])
             for f in engine.feed(origin, data, 1.8e9 + t)]
    assert [f.rank for f in found if f.kind == "straggler"] == [2]


def test_engines_with_other_taps_share_one_database(rules):
    """The step patterns are not in the engine's database: any tap can share it (``like``)."""
    first = Engine(rules)
    second = Engine(rules, steps=StepTracker(StragglerConfig()), like=first)
    assert second.matcher is first.matcher
    found = feed_steps(second, {0: 0.1, 1: 0.1, 2: 0.3, 3: 0.1}, steps=12)
    assert [f.rank for f in found if f.kind == "straggler"] == [2]


def test_the_saying_tracker_tells_each_finding_of_a_chunk(rules):
    """``ftwatch run``'s tracker prints each straggler it finds, also those found for a whole chunk."""
    from ftwatch.health.runhook import SayingStepTracker
    said: list[str] = []
    engine = Engine(rules, steps=SayingStepTracker(StragglerConfig(min_steps=5), said.append))
    chunk = "".join(MEGATRON.format(r=r, s=n, n=n, ms=3000.0 if r == 2 else 1000.0)
                    for n in range(1, 9) for r in range(4)).encode()
    found = engine.feed(Origin("combined", None, "job1", "n", "stdout", "replay"), chunk, 100.0)
    assert [f.rank for f in found] == [2] and said == [f"ftwatch: straggler: {found[0].line}"]


def test_a_rank_forgotten_within_a_chunk_leaves_no_median_behind(rules):
    """More ranks in one chunk than ``max_ranks``: the stalest is forgotten while the chunk is
    taken, and the chunk's verdicts do not put its median back (the job's lists hold kept ranks only)."""
    tracker = StepTracker(StragglerConfig(min_steps=5), max_ranks=2)
    engine = Engine(rules, steps=tracker)
    chunk = "".join(MEGATRON.format(r=r, s=n, n=n, ms=1000.0 + r) for r in range(3) for n in range(1, 9)).encode()
    engine.feed(Origin("combined", None, "job1", "n", "stdout", "replay"), chunk, 100.0)
    job = tracker.jobs["job1"]
    assert sorted(job.ranks) == ["rank1", "rank2"]
    assert sorted(job.medians) == sorted(r.median for r in job.ranks.values())
