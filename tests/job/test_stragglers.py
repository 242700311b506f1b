"""A slow node named from the telemetry's figures (job/train/stragglers.py): the node whose ranks'
compute (step time less communication) stays at least 1.3x the median node's for 30 s."""

from __future__ import annotations

import pytest

from slurmddp.job.train.stragglers import SLOW_FOR_S, Straggler, Watch, slowest_node

# 3 nodes x 2 ranks; node 1's second rank computes 20 ms a step where the others take 10-11 ms.
NODES = [0, 0, 1, 1, 2, 2]


def test_the_node_of_the_slowest_rank_is_named_with_its_cost() -> None:
    found = slowest_node([0.010, 0.011, 0.010, 0.020, 0.0105, 0.010], NODES, step_s=0.025)
    assert found is not None and found.node == 1
    assert found.ratio == pytest.approx(0.020 / 0.011)
    assert found.slows_by == pytest.approx((0.020 - 0.011) / 0.025)


def test_no_node_is_named_below_the_ratio_or_in_a_run_of_one_node() -> None:
    assert slowest_node([0.010, 0.011, 0.010, 0.014, 0.0105, 0.010], NODES, step_s=0.025) is None
    assert slowest_node([0.010, 0.030], [0, 0], step_s=0.04) is None


def test_two_nodes_compare_with_their_mean() -> None:
    found = slowest_node([0.010, 0.030], [0, 1], step_s=0.04)
    assert found is not None and found.node == 1 and found.ratio == pytest.approx(1.5)


def test_a_node_is_named_once_it_stayed_slow_for_the_whole_span_and_cleared_when_it_recovers() -> None:
    watch = Watch()
    slow = Straggler(1, 1.8, 0.3)
    every = 10.0
    assert not watch.seen(slow, 0.0, every) and watch.named is None
    assert not watch.seen(slow, every, 2 * every)
    assert watch.seen(slow, 2 * every, SLOW_FOR_S) and watch.named == 1
    assert not watch.seen(slow, SLOW_FOR_S, SLOW_FOR_S + every)  # named already: no news
    assert watch.seen(None, 40.0, 50.0) and watch.named is None


def test_another_node_starts_the_count_again() -> None:
    watch = Watch()
    watch.seen(Straggler(1, 1.8, 0.3), 0.0, 20.0)
    assert not watch.seen(Straggler(2, 1.8, 0.3), 20.0, 40.0)
    assert watch.named is None
