"""replay keeps the objects alive before it out of the collector's scans while it runs (issue 16:
full collections during a 4,096-rank replay rescanned config, rules and engine), and undoes it."""

from __future__ import annotations

import gc

from ftwatch.config.model import Config
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Policy
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules


def test_objects_older_than_the_replay_are_frozen_while_it_runs(tmp_path):
    rules = load_rules([], builtin=True)
    path = tmp_path / "rank0.log"
    path.write_bytes(b"step 1 loss 0.5\n" * 100)
    policy = Policy(Config().policy, BudgetStore(tmp_path / "b.json", "job"), "job")
    frozen: list[int] = []
    assert gc.get_freeze_count() == 0
    replay([path], Engine(rules), policy, "job", progress=lambda _n: frozen.append(gc.get_freeze_count()))
    assert frozen and all(n > 0 for n in frozen)
    assert gc.get_freeze_count() == 0                       # undone after


def test_a_freeze_made_by_the_caller_is_left_as_it_is(tmp_path):
    rules = load_rules([], builtin=True)
    path = tmp_path / "rank0.log"
    path.write_bytes(b"step 1 loss 0.5\n")
    policy = Policy(Config().policy, BudgetStore(tmp_path / "b.json", "job"), "job")
    sentinel = [object()]               # the caller's object: frozen by the caller's freeze
    gc.freeze()
    try:
        assert not any(o is sentinel for o in gc.get_objects())     # frozen: in no generation
        replay([path], Engine(rules), policy, "job")
        # still frozen (the count itself may drop: frozen objects freed during the replay, such as
        # compiled patterns the re module's cache evicts, leave the permanent generation)
        assert not any(o is sentinel for o in gc.get_objects())
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert any(o is sentinel for o in gc.get_objects())             # the check above can fail


def test_the_youngest_threshold_is_raised_while_it_runs_and_put_back(tmp_path):
    from ftwatch.pipeline.replay import REPLAY_GC_THRESHOLD
    rules = load_rules([], builtin=True)
    path = tmp_path / "rank0.log"
    path.write_bytes(b"step 1 loss 0.5\n" * 100)
    policy = Policy(Config().policy, BudgetStore(tmp_path / "b.json", "job"), "job")
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    try:
        gc.set_threshold(700, before[1], before[2])
        replay([path], Engine(rules), policy, "job", progress=lambda _n: seen.append(gc.get_threshold()))
        assert seen and all(t == (REPLAY_GC_THRESHOLD, before[1], before[2]) for t in seen)
        assert gc.get_threshold() == (700, before[1], before[2])          # put back
        gc.set_threshold(REPLAY_GC_THRESHOLD * 4, before[1], before[2])   # higher (watch's): left as it is
        seen.clear()
        replay([path], Engine(rules), policy, "job", progress=lambda _n: seen.append(gc.get_threshold()))
        assert seen and all(t[0] == REPLAY_GC_THRESHOLD * 4 for t in seen)
    finally:
        gc.set_threshold(*before)
