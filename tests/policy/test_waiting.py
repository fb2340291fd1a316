"""The waiting errors' bookkeeping (``ftwatch.policy.waiting``, behind ``progress.Survival``): the
same answers as the rule applied to every waiting error on every progress line, with clocks that
jump back (a replayed file whose clock wraps), and a progress line no longer costs a pass over
every error waiting."""

from __future__ import annotations

import random

import pytest

from ftwatch.policy import progress, waiting
from ftwatch.testing import T0, finding


class Reference:
    """The rule, applied eagerly (``Survival.progress`` before the log): each line visits every
    waiting error of its instance."""

    def __init__(self, window: float, needed: int):
        self.window, self.needed = window, needed
        self.waiting: dict[int, list] = {}

    def wait(self, f):
        if len(self.waiting) >= progress.MAX_WAITING:
            del self.waiting[next(iter(self.waiting))]
        self.waiting[id(f)] = [f, 0, {}]

    def progress(self, instance, time, counters):
        out = []
        for key, entry in list(self.waiting.items()):
            f, before = entry[0], entry[2]
            if f.origin.instance != instance:
                continue
            if time <= f.time:
                before.update(counters)
                continue
            if time > f.time + self.window or progress.went_back(before, counters):
                del self.waiting[key]
                continue
            entry[1] += 1
            if entry[1] >= self.needed:
                del self.waiting[key]
                out.append(f)
        return out

    def expire(self, now):
        for key, entry in list(self.waiting.items()):
            if now > entry[0].time + self.window:
                del self.waiting[key]


@pytest.mark.parametrize("seed", range(12))
def test_the_log_answers_as_every_error_visited_on_every_line(monkeypatch, seed):
    monkeypatch.setattr(waiting, "LOG_LINES", 7)             # folded and emptied often
    monkeypatch.setattr(progress, "MAX_WAITING", 9)
    rnd = random.Random(seed)
    fast, slow = progress.Survival(window=60, needed=2), Reference(60, 2)
    instances = [finding(rank=rank).origin.instance for rank in range(3)]
    errors = []
    for _ in range(600):
        op = rnd.random()
        if op < 0.15:
            rank = rnd.randrange(3)
            f = finding(time=T0 + 10 * rnd.randrange(-5, 20), rank=rank, seq=len(errors))   # ties too
            if rnd.random() < 0.1 and errors:
                f = rnd.choice(errors)                        # the same error waits again
            errors.append(f)
            fast.wait(f)
            slow.wait(f)
        elif op < 0.97:
            instance = rnd.choice([f.origin.instance for f in errors[-3:]] + instances) if errors else instances[0]
            time = T0 + 10 * rnd.randrange(-6, 26)            # back and forth: a clock that wraps
            counters = {k: rnd.randrange(0, 20) for k in rnd.sample(["step_plain", "iteration", "epoch"],
                                                                   rnd.randrange(0, 3))}
            assert fast.progress(instance, time, dict(counters)) == slow.progress(instance, time, counters)
        else:
            now = T0 + rnd.randrange(0, 400)
            fast.expire(now)
            slow.expire(now)
        assert len(fast._waiting) == len(slow.waiting)
        assert {f.origin.instance for f, *_ in slow.waiting.values()} == set(fast._waiting.instances())


def test_a_line_before_many_waiting_errors_is_one_log_append(monkeypatch):
    s = progress.Survival(window=60, needed=2)
    errors = [finding(time=T0 + 100 + k, rank=0) for k in range(200)]
    for f in errors:
        s.wait(f)
    instance = errors[0].origin.instance
    folds = []
    real = waiting._fold
    monkeypatch.setattr(waiting, "_fold", lambda entry, log: (folds.append(1), real(entry, log)))
    for k in range(500):                                      # before every error: only logged
        assert s.progress(instance, T0 + k * 0.1, {"step_plain": k}) == []
    assert not folds and len(s._waiting) == 200
    assert s.progress(instance, T0 + 101.5, {"step_plain": 600}) == []     # after errors[0] and [1] only
    assert len(folds) == 2
    assert s.progress(instance, T0 + 101.6, {"step_plain": 601}) == errors[:2]
    assert s.progress(instance, T0 + 101.7, {"step_plain": 3}) == []       # went back: a restart
