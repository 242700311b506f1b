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
    assert watch.seen(slow, 2 * every, SLOW_FOR_S) and watch.named == slow
    slower = Straggler(1, 2.0, 0.4)
    assert not watch.seen(slower, SLOW_FOR_S, SLOW_FOR_S + every)  # named already: no news
    assert watch.named == slower  # ...but its newest figures
    assert not watch.seen(None, 40.0, 50.0) and watch.named == slower  # one record back to pace
    assert watch.seen(None, 50.0, 60.0) and watch.named is None  # two: slow for 1/3 of the span


def test_one_noisy_record_does_not_start_the_count_again() -> None:
    """Records every 5 s, the node slow throughout but one record (at 15-20 s) found it under the
    ratio: named at 30 s all the same, where a count started again would have waited to 50 s."""
    watch = Watch()
    slow = Straggler(1, 2.1, 0.2)
    verdicts = [slow, slow, slow, None, slow, slow]
    named = [watch.seen(found, 5.0 * i, 5.0 * (i + 1)) for i, found in enumerate(verdicts)]
    assert named == [False] * 5 + [True] and watch.named == slow


def test_a_pause_of_a_few_seconds_names_no_node() -> None:
    """A node slow in one 5 s record of six (a garbage collection, a checkpoint) is not named."""
    watch = Watch()
    verdicts = [None, None, Straggler(2, 9.0, 0.8), None, None, None, None]
    assert not any(watch.seen(found, 5.0 * i, 5.0 * (i + 1)) for i, found in enumerate(verdicts))
    assert watch.named is None


def test_another_node_is_not_named_on_the_first_ones_time() -> None:
    watch = Watch()
    watch.seen(Straggler(1, 1.8, 0.3), 0.0, 20.0)
    assert not watch.seen(Straggler(2, 1.8, 0.3), 20.0, 40.0)
    assert watch.named is None
