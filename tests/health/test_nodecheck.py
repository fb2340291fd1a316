"""Node check planning and verdicts (H2) with synthetic timings: no processes."""

from __future__ import annotations

import pytest

from ftwatch.health.nodecheck import (DOWN, RoundResult, check, pair_fastest_slowest, pair_neighbours,
                                      parse_range, verdicts, waves)
from ftwatch.health.nodes import outcome, report_lines, results_of


def fake(times: dict[int, float], down: set[int] = frozenset()):
    """A runner: a group fails as a whole when a member is down; else each node gets its time."""
    calls = []

    def run(group):
        calls.append(group)
        if set(group) & set(down):
            return {n: (None, "peer closed") if n not in down else (None, "killed by signal 9") for n in group}
        return {n: (times[n], "") for n in group}
    return run, calls


def by_node(found):
    return {v.node: v for v in found}


def test_round_one_pairs_neighbours_and_an_odd_node_with_the_first():
    assert pair_neighbours([0, 1, 2, 3]) == [(0, 1), (2, 3)]
    assert pair_neighbours([0, 1, 2]) == [(0, 1), (2, 0)]
    assert pair_neighbours([0, 1]) == [(0, 1)]


def test_round_two_pairs_fastest_with_slowest_failed_counting_slowest():
    times = {0: 1.0, 1: None, 2: 0.5, 3: 2.0}
    assert pair_fastest_slowest(times) == [(2, 1), (0, 3)]
    assert pair_fastest_slowest({0: 1.0, 1: 3.0, 2: 2.0}) == [(0, 1), (2, 0)]


def test_waves_never_put_one_node_in_two_groups_at_once():
    assert waves([(0, 1), (2, 3), (4, 0)]) == [[(0, 1), (2, 3)], [(4, 0)]]


def test_four_nodes_one_down_is_faulty_and_the_others_are_cleared():
    run, calls = fake({0: 1.0, 1: 1.1, 2: 0.9, 3: 1.0}, down={2})
    rounds, found, notes = check([0, 1, 2, 3], run)
    v = by_node(found)
    assert v[2].status == "faulty" and v[2].message.startswith(DOWN)
    assert {v[n].status for n in (0, 1, 3)} == {"ok"}
    assert calls[:2] == [(0, 1), (2, 3)]
    # round 2: the failed nodes (2, 3) each get a partner that worked in round 1, fastest with slowest
    assert calls[2:] == [(0, 3), (1, 2)]
    assert notes == []


def test_a_node_slower_than_twice_the_median_is_a_straggler():
    run, _ = fake({0: 1.0, 1: 3.5, 2: 1.1, 3: 0.9})
    _, found, _ = check([0, 1, 2, 3], run)
    v = by_node(found)
    assert v[1].status == "straggler" and v[1].slowdown == pytest.approx(3.5 / 1.05)
    assert all(v[n].status == "ok" for n in (0, 2, 3))


def test_one_point_nine_times_the_median_is_not_a_straggler():
    run, _ = fake({0: 1.0, 1: 1.9, 2: 1.0})
    _, found, _ = check([0, 1, 2], run)
    assert all(v.status == "ok" for v in found)


def test_two_nodes_a_failed_pair_names_no_culprit():
    run, _ = fake({0: 1.0, 1: 1.0}, down={1})
    _, found, notes = check([0, 1], run)
    assert [v.status for v in found] == ["suspect", "suspect"]
    assert "no third node" in notes[0]


def test_two_nodes_a_slow_one_is_only_a_suspect_straggler():
    run, _ = fake({0: 1.0, 1: 5.0})
    _, found, notes = check([0, 1], run)
    v = by_node(found)
    assert v[1].status == "suspect_straggler" and v[1].slowdown == pytest.approx(5.0)
    assert v[0].status == "ok"
    assert any("median is their mean" in n for n in notes)


def test_three_nodes_find_the_down_one_through_its_second_partner():
    run, _ = fake({0: 1.0, 1: 1.0, 2: 1.0}, down={1})
    _, found, _ = check([0, 1, 2], run)
    v = by_node(found)
    assert v[1].status == "faulty"
    assert v[0].status == v[2].status == "ok"


def test_three_nodes_all_failing_are_suspects_not_faulty():
    run, _ = fake({0: 1.0, 1: 1.0, 2: 1.0}, down={0, 1, 2})
    _, found, _ = check([0, 1, 2], run)
    assert {v.status for v in found} == {"suspect"}


def test_noise_below_the_floor_is_never_a_straggler():
    rounds = [RoundResult(1, [(0, 1), (2, 0)], {0: 0.001, 1: 0.005, 2: 0.001})]
    found, _ = verdicts([0, 1, 2], rounds)
    assert all(v.status == "ok" for v in found)


def test_outcome_excludes_faulty_and_optionally_stragglers():
    run, _ = fake({0: 1.0, 1: 3.5, 2: 1.1, 3: 0.9}, down={3})
    rounds, found, notes = check([0, 1, 2, 3], run)
    keep = outcome(found, 3, exclude_straggler=False)
    assert keep.usable == (0, 1, 2) and keep.can_start
    drop = outcome(found, 3, exclude_straggler=True)
    assert drop.usable == (0, 2) and drop.excluded == (1, 3) and not drop.can_start
    lines = report_lines(rounds, found, notes, True)
    assert any("The node is a straggler and exits." in ln and "node 1" in ln for ln in lines)
    assert any("The node is down." in ln and "node 3" in ln for ln in lines)
    results = results_of(found, True, lines)
    isolate = {r.fields.get("node") for r in results if r.action.label == "isolate_node"}
    assert isolate == {1, 3}


@pytest.mark.parametrize("text, expected", [("3", (3, 3)), ("2:4", (2, 4)), (2, (2, 2))])
def test_parse_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["0", "4:2", "a", "1:b", ""])
def test_parse_range_rejects(text):
    with pytest.raises(ValueError, match="--nnodes"):
        parse_range(text)


def crashing(times: dict[int, float], died: set[int]):
    """A runner like the agents': a group with a node whose process died fails as a whole, and the
    dead node's answer says so (``down``)."""
    def run(group):
        if set(group) & died:
            return {n: (None, "the check process ended (killed by signal 9)", True) if n in died
                    else (None, "Connection closed by peer", False) for n in group}
        return {n: (times[n], "", False) for n in group}
    return run


def test_two_nodes_the_one_whose_process_died_is_faulty_and_its_partner_is_not_blamed():
    _, found, notes = check([0, 1], crashing({0: 0.1, 1: 0.1}, died={1}))
    v = by_node(found)
    assert v[1].status == "faulty" and v[1].message.startswith(DOWN)
    assert v[0].status == "ok" and v[0].best is None and "not blamed" in v[0].message
    assert outcome(found, 1, exclude_straggler=False).usable == (0,)


def test_two_nodes_failing_without_a_death_stay_suspect():
    def run(group):
        return {n: (None, "timed out", False) for n in group}
    _, found, _ = check([0, 1], run)
    assert {v.status for v in found} == {"suspect"}


def test_a_node_whose_process_died_after_a_good_round_is_faulty():
    calls = []

    def run(group):
        calls.append(group)
        if len(calls) > 2 and 3 in group:                  # round 2: node 3's process dies
            return {n: (None, "ended", True) if n == 3 else (None, "peer closed", False) for n in group}
        return {n: (1.0, "", False) for n in group}
    _, found, _ = check([0, 1, 2, 3], run)
    v = by_node(found)
    assert v[3].status == "faulty" and {v[n].status for n in (0, 1, 2)} == {"ok"}


def test_the_round_line_shows_each_groups_own_times_not_a_nodes_best():
    """3 nodes: node 0 is in (0, 1) and, with the odd node 2, in (2, 0); node 2 dies: (2, 0) failed."""
    rounds, found, notes = check([0, 1, 2], crashing({0: 0.1, 1: 0.12, 2: 0.1}, died={2}))
    lines = report_lines(rounds, found, notes, exclude_straggler=False)
    assert lines[0] == "Node Check round 1: (0: 0.100s, 1: 0.120s) (2: FAILED, 0: FAILED)"
    assert by_node(found)[0].status == "ok" and by_node(found)[2].status == "faulty"
