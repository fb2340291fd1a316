"""The bounded map and the list trims of ``ftwatch.bounded``: caps hold, the newest stays, drops count."""

from __future__ import annotations

import copy

import pytest

from ftwatch.bounded import EVICTIONS, BoundedDict, cap_two_tiers, drop_oldest, trim_oldest


def test_bounded_dict_evicts_the_least_recently_set_and_counts_it():
    before = EVICTIONS.get("test_lru")
    gone = []
    d = BoundedDict(3, "test_lru", on_evict=lambda k, v: gone.append((k, v)))
    for k in "abc":
        d[k] = k.upper()
    d["a"] = "A2"                 # set again: a is now the newest
    d.touch("b")                  # b newer still; c is the oldest
    d["d"] = "D"
    d["e"] = "E"
    assert list(d) == ["b", "d", "e"] and len(d) == 3
    assert gone == [("c", "C"), ("a", "A2")]
    assert EVICTIONS.get("test_lru") - before == 2
    assert d.oldest() == "b"


def test_bounded_dict_in_insertion_order_and_uncounted():
    before = EVICTIONS.snapshot()
    d = BoundedDict(2, lru=False)
    d["a"], d["b"] = 1, 2
    d["a"] = 3                    # not lru: a stays the oldest
    d["c"] = 4
    assert list(d) == ["b", "c"]
    assert EVICTIONS.snapshot() == before
    assert copy.copy(d) == {"b": 2, "c": 4}
    with pytest.raises(ValueError):
        BoundedDict(0)


def test_trim_keeps_the_protected_and_the_newest_in_order():
    before = EVICTIONS.get("test_trim")
    items = [("err", 0)] + [("info", i) for i in range(1, 20)] + [("err", 20)]
    dropped = trim_oldest(items, 8, "test_trim", keep=lambda x: x[0] == "err")
    assert len(items) == 6 and dropped == 15          # cut to 3/4 of the cap
    assert items == [("err", 0), ("info", 16), ("info", 17), ("info", 18), ("info", 19), ("err", 20)]
    assert EVICTIONS.get("test_trim") - before == 15
    assert trim_oldest(items, 8, "test_trim") == 0    # within the cap: untouched


def test_trim_drops_the_oldest_protected_when_they_alone_are_too_many():
    items = [("err", i) for i in range(10)] + [("info", 10)]
    trim_oldest(items, 8, "test_trim", keep=lambda x: x[0] == "err")
    assert items == [("err", i) for i in range(4, 10)]          # the info one first, then the oldest errors


def test_drop_oldest_of_one_sort():
    items = list(range(10))
    assert drop_oldest(items, 3, "test_drop", lambda x: x % 2 == 0) == 3
    assert items == [1, 3, 5, 6, 7, 8, 9]
    assert drop_oldest(items, 5, "test_drop", lambda x: x > 7) == 2
    assert items == [1, 3, 5, 6, 7]


def test_two_tiers_cap_the_unprotected_by_themselves_and_everything_together():
    items, free = [], 0
    for i in range(30):
        new = [("info", i)] if i % 3 else [("err", i)]
        items += new
        free = cap_two_tiers(items, new, free, 8, 12, "test_two", keep=lambda x: x[0] == "err")
        assert free == sum(1 for x in items if x[0] == "info") and free <= 8 and len(items) <= 12
    assert items[-1] == ("info", 29) and ("err", 27) in items
