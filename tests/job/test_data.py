"""ctx.loader's pieces without a process group: shards, the feed's positions, per-sample seeds."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from slurmddp.errors import SlurmddpError
from slurmddp.job.train.data import Feed, ShardedEvalSampler, make_loader, sample_seed, split


class Noisy(Dataset[tuple[int, float, float]]):
    """(index, a torch draw, a `random` draw): what an augmentation in a worker would draw."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, float, float]:
        return index, float(torch.rand(())), random.random()


def loader(rank: int, world: int, workers: int, n: int = 103, global_batch: int = 12) -> Any:
    return make_loader(
        Noisy(n),
        global_batch=global_batch,
        rank=rank,
        world_size=world,
        shuffle=True,
        seed=7,
        num_workers=workers,
        pin_memory=False,
        options={},
    )


def batches(feed: Feed, steps: range) -> list[list[tuple[int, float, float]]]:
    out = []
    for step in steps:
        index, noise, other = feed.batch(step)
        out.append(list(zip(index.tolist(), noise.tolist(), other.tolist(), strict=True)))
        feed.advance()
    return out


def test_three_ranks_see_every_sample_of_an_epoch_once_and_one_process_sees_the_same_global_batches() -> None:
    world = 3
    feeds = [Feed(loader(rank, world, 0)) for rank in range(world)]
    assert feeds[0].steps_per_epoch == 103 // 12
    steps = range(2 * feeds[0].steps_per_epoch)
    per_rank = [batches(feed, steps) for feed in feeds]
    single = batches(Feed(loader(0, 1, 0)), steps)
    for step in steps:
        together = sorted(i for rank in range(world) for i, _, _ in per_rank[rank][step])
        assert together == sorted(i for i, _, _ in single[step])
    for epoch in (0, 1):
        seen = Counter(
            i
            for rank in range(world)
            for s in steps
            if feeds[0].epoch_of(s) == epoch
            for i, _, _ in per_rank[rank][s]
        )
        assert max(seen.values()) == 1 and len(seen) == 8 * 12
    assert [i for i, _, _ in per_rank[0][0]] != [i for i, _, _ in per_rank[0][feeds[0].steps_per_epoch]]


@pytest.mark.process  # DataLoader workers
def test_a_feed_started_mid_epoch_with_workers_gives_the_batches_and_draws_of_an_uninterrupted_one() -> None:
    steps = range(3, 14)
    feed = Feed(loader(1, 2, 2))
    everything = batches(feed, range(14))
    whole = everything[3:]
    # The persistent workers see the new epoch: a sample drawn in both epochs draws other values.
    draws = [
        {i: noise for step in range(a, b) for i, noise, _ in everything[step]} for a, b in ((0, 8), (8, 14))
    ]
    common = draws[0].keys() & draws[1].keys()
    assert feed.steps_per_epoch == 8 and common and all(draws[0][i] != draws[1][i] for i in common)
    resumed = batches(Feed(loader(1, 2, 2)), steps)
    assert resumed == whole
    # Per-sample seeds: the draws do not depend on the number of workers either.
    assert batches(Feed(loader(1, 2, 1)), steps) == whole


@pytest.mark.process  # DataLoader workers
def test_making_an_iterator_does_not_touch_the_global_rng() -> None:
    torch.manual_seed(0)
    before = torch.get_rng_state()
    feed = Feed(loader(0, 2, 2))
    feed.batch(5)
    assert torch.equal(before, torch.get_rng_state())


def test_eval_shards_cover_every_sample_once_without_padding() -> None:
    shards = [list(ShardedEvalSampler(10, 3, rank)) for rank in range(3)]
    assert sorted(i for shard in shards for i in shard) == list(range(10))
    assert [len(ShardedEvalSampler(10, 3, rank)) for rank in range(3)] == [4, 3, 3]


def test_split_cuts_nested_batches_and_refuses_uneven_ones() -> None:
    batch = {"x": torch.arange(8).reshape(4, 2), "pair": (torch.arange(4), [torch.zeros(4, 1)])}
    first, second = split(batch, 2)
    assert first["x"].tolist() == [[0, 1], [2, 3]] and second["pair"][0].tolist() == [2, 3]
    assert isinstance(first["pair"][1], list) and first["pair"][1][0].shape == (2, 1)
    with pytest.raises(SlurmddpError, match=r"ddp\.accumulate=3"):
        split(torch.zeros(4), 3)


def test_loader_errors_name_the_fix() -> None:
    with pytest.raises(SlurmddpError, match="multiple of 3"):
        loader(0, 3, 0, global_batch=64)
    with pytest.raises(SlurmddpError, match="fewer than one global batch"):
        loader(0, 2, 0, n=5, global_batch=8)
    with pytest.raises(SlurmddpError, match=r"ctx\.loader"):
        Feed(torch.utils.data.DataLoader(Noisy(4), batch_size=2))


def test_sample_seeds_differ_by_epoch_and_index() -> None:
    seeds = {sample_seed(7, epoch, index) for epoch in range(3) for index in range(1000)}
    assert len(seeds) == 3000 and all(0 <= s < 2**63 for s in seeds)
