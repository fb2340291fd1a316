"""How long a replay's chunks are: ``CHUNK_BYTES``, or, where one file holds thousands of ranks'
step lines, as long as the step tap needs to find a few of each rank's (``Engine.chunk_bytes``), up
to ``MAX_CHUNK_BYTES`` (issue 16: the tap's work once per rank and chunk, shared by a rank's few
lines). The sizes are scaled down here (a few hundred ranks against 16 KiB chunks) so the files stay small."""

from __future__ import annotations

import pytest

from ftwatch.config.health import StragglerConfig
from ftwatch.config.model import PolicyConfig
from ftwatch.events import Origin
from ftwatch.pipeline import replay as replay_module
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Policy
from ftwatch.rules import stragglers
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.rules.stragglers import StepTracker

MEGATRON = ("[rank{r}]: [2026-11-21 09:{m:02d}:{s:02d}] iteration {n:8d}/     100 | consumed samples: 64 | "
            "elapsed time per iteration (ms): {ms:.1f} | lm loss: 7.1E+00 |\n")
SLOW = 7                                          # the straggler: twice the others' step time
LINE = 200                                        # at most a line's bytes: a read's last line, cut, joins the next


@pytest.fixture(scope="module")
def rules():
    return load_rules([], builtin=True)


def training_log(ranks: int, steps: int) -> bytes:
    """``steps`` steps of ``ranks`` ranks' Megatron lines, interleaved as one file of a job holds them."""
    return "".join(MEGATRON.format(r=r, m=n // 60, s=n % 60, n=n, ms=2000.0 if r == SLOW else 1000.0)
                   for n in range(1, steps + 1) for r in range(ranks)).encode()


def replayed(tmp_path, rules, data: bytes, monkeypatch) -> tuple[list[int], list]:
    """The lengths of the chunks a replay of ``data`` handed to its desk, and its findings."""
    path = tmp_path / "train.log"
    path.write_bytes(data)
    sizes: list[int] = []
    real = IncidentDesk.output
    monkeypatch.setattr(IncidentDesk, "output", lambda self, origin, chunk, *a, **k:
                        sizes.append(len(chunk)) or real(self, origin, chunk, *a, **k))
    engine = Engine(rules, steps=StepTracker(StragglerConfig(min_steps=3, window=10)))
    policy = Policy(PolicyConfig(), BudgetStore(tmp_path / f"budgets{len(list(tmp_path.iterdir()))}.json", "j"), "j")
    result = replay([path], engine, policy, "j")
    return [s for s in sizes if s], result.findings


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 16 KiB, 64 KiB at most: a few hundred ranks stand for thousands."""
    monkeypatch.setattr(replay_module, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(replay_module, "MAX_CHUNK_BYTES", 64 << 10)


def test_a_file_of_a_few_ranks_is_read_in_chunks_of_chunk_bytes(tmp_path, rules, monkeypatch, small_chunks):
    sizes, _ = replayed(tmp_path, rules, training_log(ranks=8, steps=200), monkeypatch)
    assert len(sizes) > 10 and max(sizes) <= (16 << 10) + LINE


def test_a_file_of_many_ranks_is_read_in_longer_chunks_up_to_the_most(tmp_path, rules, monkeypatch, small_chunks):
    """400 ranks' lines of ~150 bytes: 16 KiB hold about a third of a step; the tap asks for four
    lines of each rank with half again to spare (~360 KiB), so every chunk after the first is the
    most, 64 KiB."""
    sizes, _ = replayed(tmp_path, rules, training_log(ranks=400, steps=12), monkeypatch)
    assert sizes[0] <= 16 << 10                       # no rank known before the first chunk
    assert all((60 << 10) < size <= (64 << 10) + LINE for size in sizes[1:-1])


def test_longer_chunks_find_the_same_straggler(tmp_path, rules, monkeypatch, small_chunks):
    """The tap reads the same lines either way (every step line of a chunk that holds a few of
    each rank's): the same straggler, and no other rank, as with chunks of ``CHUNK_BYTES`` only."""
    data = training_log(ranks=400, steps=12)
    _, longer = replayed(tmp_path, rules, data, monkeypatch)
    monkeypatch.setattr(replay_module, "MAX_CHUNK_BYTES", 16 << 10)
    _, short = replayed(tmp_path, rules, data, monkeypatch)

    def stragglers_of(findings):
        return sorted({(f.rule_id, f.rank) for f in findings if f.rule_id.startswith("straggler.")})
    assert stragglers_of(longer) == stragglers_of(short) == [("straggler.step_time", SLOW)]


def test_the_tap_asks_for_chunks_by_the_ranks_it_knows_on_the_stream(rules):
    """``StepTracker.chunk_bytes``: nothing before a stream's first step lines; then about four
    lines of each known rank with half again to spare (the last chunk's bytes per step line)."""
    tracker = StepTracker(StragglerConfig(min_steps=3), tails=True)
    engine = Engine(rules, steps=tracker)
    few, many = (Origin("train", None, "j", "n", "stdout", f"replay-{k}") for k in ("few", "many"))
    assert engine.chunk_bytes(few) == 0
    for origin, ranks in ((few, 10), (many, 100)):
        data = training_log(ranks=ranks, steps=2)
        engine.feed(origin, data, 100.0, sim_step=0.001)
        per_line = len(data) / (2 * ranks)
        assert engine.chunk_bytes(origin) == pytest.approx(per_line * 4 * ranks * 1.5, rel=0.05)
    assert Engine(rules).chunk_bytes(few) == 0        # no tap: no wish


def test_held_chunks_stay_within_held_bytes_and_keep_the_latest(rules, monkeypatch):
    """Chunks whose ranks' last line's time is unread are held, at most ``HELD_CHUNKS`` of them
    and ``HELD_BYTES`` bytes, the latest always: long chunks are held fewer at a time."""
    monkeypatch.setattr(stragglers, "HELD_BYTES", 40 << 10)
    tracker = StepTracker(StragglerConfig(min_steps=3))
    engine = Engine(rules, steps=tracker)
    origin = Origin("train", None, "j", "n", "stdout", "replay")
    for n in range(1, 9):     # chunks of ~30 KiB: one held at a time, not four
        data = "".join(MEGATRON.format(r=r, m=0, s=n, n=n, ms=1000.0) for r in range(200)).encode()
        assert 25 << 10 < len(data) < 40 << 10
        engine.feed(origin, data, 100.0, sim_step=0.001)
        assert len(tracker._held) == 1 and tracker._held_bytes == len(data)
