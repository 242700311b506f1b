"""torchdata's StatefulDataLoader vs ctx.loader's step-derived position, on one mid-epoch resume.

    pip install torchdata==0.11.0 && python benchmarks/stateful_loader_eval.py

Rank 0 of 4's share of 1437 samples, 16 a batch, 2 workers; an epoch stopped after 9 of its 22
batches and resumed in a new loader. Each sample draws one value from torch's RNG in the worker (an
augmentation would): the resumed batches should hold the same samples and the same draws as the
uninterrupted epoch.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler

from slurmddp.job.train.data import Feed, make_loader

SAMPLES, WORLD, BATCH, STOP = 1437, 4, 16, 9


class Noisy(Dataset[tuple[int, float, float]]):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[int, float, float]:
        return index, float(torch.rand(())), random.random()


def same(a: list[Any], b: list[Any], column: int) -> bool:
    return len(a) == len(b) and all(torch.equal(x[column], y[column]) for x, y in zip(a, b, strict=True))


def stateful() -> None:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        print("StatefulDataLoader: torchdata is not installed (pip install torchdata==0.11.0)")
        return

    def loader() -> Any:
        sampler = DistributedSampler(Noisy(), WORLD, 0, shuffle=True, seed=0, drop_last=True)
        sampler.set_epoch(0)
        return StatefulDataLoader(Noisy(), batch_size=BATCH, sampler=sampler, num_workers=2, drop_last=True)

    whole = list(loader())
    first = loader()
    iterator = iter(first)
    for _ in range(STOP):
        next(iterator)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    print(
        f"StatefulDataLoader: samples same {same(whole[STOP:], rest, 0)}, "
        f"worker draws same {same(whole[STOP:], rest, 1)}, state kept per rank: {sorted(state)}"
    )


def ours() -> None:
    def feed() -> Feed:
        loader = make_loader(
            Noisy(),
            global_batch=BATCH * WORLD,
            rank=0,
            world_size=WORLD,
            shuffle=True,
            seed=0,
            num_workers=2,
            pin_memory=False,
            options={},
        )
        return Feed(loader)

    uninterrupted = feed()
    steps = uninterrupted.steps_per_epoch
    whole = [uninterrupted.batch(step) for step in range(steps)]
    resumed = feed()
    rest = [resumed.batch(step) for step in range(STOP, steps)]
    print(
        f"ctx.loader: samples same {same(whole[STOP:], rest, 0)}, "
        f"worker draws same {same(whole[STOP:], rest, 1)}, state kept: none (the step number)"
    )


if __name__ == "__main__":
    stateful()
    ours()
