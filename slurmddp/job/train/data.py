"""DataLoaders sharded across ranks, and the feed that gives the loop each step's batch.

    train = ctx.loader(train_set, global_batch=64, num_workers=2)          # shuffled, resumable
    val = ctx.loader(val_set, global_batch=256, shuffle=False)             # every sample once
    for step, batch in ctx.loop(epochs=10, data=train, model=model, optimizer=optimizer): ...

A training loader shards like DistributedSampler (drop_last: every step is a full global batch,
so any world size sees the same global batches; see `ResumableDistributedSampler`). Its position is
a function of the step alone (epoch = step // steps_per_epoch), so the loop repositions it on resume
without saving what a worker has prefetched, and sets each epoch's order without the user calling
`set_epoch`.

Randomness in a worker (augmentations in `__getitem__`) is seeded per sample from (seed, epoch,
index): a resumed epoch, a different worker count or a different world size draw the same values
for the same sample. A worker's own RNG stream would depend on which samples it fetched before,
which a mid-epoch resume changes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from slurmddp.errors import SlurmddpError
from slurmddp.job.train.sampler import ResumableDistributedSampler

_MIX = 0x9E3779B97F4A7C15


class ShardedEvalSampler(Sampler[int]):
    """Rank r of W gets samples r, r + W, r + 2W, ...: every sample exactly once over all ranks, no
    padding (DistributedSampler repeats samples to even the shares, which would count them twice in
    a validation metric), in order."""

    def __init__(
        self, dataset_len: int, num_replicas: int, rank: int, beat: Callable[[], None] | None = None
    ) -> None:
        self.dataset_len = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.beat = beat
        """Told of every sample drawn: an evaluation is progress to the hang watchdog."""

    def __iter__(self) -> Iterator[int]:
        indices = range(self.rank, self.dataset_len, self.num_replicas)
        return iter(indices) if self.beat is None else self._beating(indices)

    def _beating(self, indices: range) -> Iterator[int]:
        assert self.beat is not None
        for index in indices:
            self.beat()
            yield index

    def __len__(self) -> int:
        return len(range(self.rank, self.dataset_len, self.num_replicas))


class _PerSampleSeeded(Dataset[Any]):
    """Reseeds torch, numpy and `random` before each sample fetched in a worker process."""

    def __init__(self, dataset: Dataset[Any], seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        # In shared memory: persistent workers keep the copy of this object they started with, and
        # must still see the epoch the loop sets afterwards.
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        if get_worker_info() is not None:
            seed = sample_seed(self.seed, int(self.epoch), index)
            # The CPU generator only: torch.manual_seed also queues the lazy seeding of every
            # accelerator, ~370 us a sample (traceback.format_stack) against ~1 us for this.
            torch.default_generator.manual_seed(seed)
            random.seed(seed)
            _seed_numpy(seed)
        return self.dataset[index]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed, distinct for each (seed, epoch, index) in practice."""
    value = seed
    for part in (epoch, index):
        value = ((value ^ part) * _MIX + part) & (2**64 - 1)
        value ^= value >> 31
    return value >> 1


def _seed_numpy(seed: int) -> None:
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


def make_loader(
    dataset: Dataset[Any],
    *,
    global_batch: int,
    rank: int,
    world_size: int,
    shuffle: bool,
    seed: int,
    num_workers: int,
    pin_memory: bool,
    options: Mapping[str, Any],
    beat: Callable[[], None] | None = None,
) -> DataLoader[Any]:
    """What `ctx.loader` returns: a plain DataLoader over this rank's share."""
    _check_batching(options, global_batch, world_size)
    per_rank = global_batch // world_size
    length = len(dataset)  # type: ignore[arg-type]
    if not shuffle:
        return DataLoader(
            dataset,
            batch_size=per_rank,
            sampler=ShardedEvalSampler(length, world_size, rank, beat),
            num_workers=num_workers,
            pin_memory=pin_memory,
            **options,
        )
    return _training_loader(
        dataset,
        length=length,
        global_batch=global_batch,
        per_rank=per_rank,
        rank=rank,
        world_size=world_size,
        seed=seed,
        num_workers=num_workers,
        pin_memory=pin_memory,
        options=options,
    )


def _check_batching(options: Mapping[str, Any], global_batch: int, world_size: int) -> None:
    """Raise where the DataLoader options or `global_batch` leave ctx.loader no even per-rank batch."""
    if "sampler" in options or "batch_sampler" in options or "batch_size" in options:
        raise SlurmddpError(
            "ctx.loader chooses the sampler and the per-rank batch size (global_batch // world size); "
            "pass global_batch, or build your own DataLoader"
        )
    if global_batch < 1 or global_batch % world_size:
        raise SlurmddpError(
            f"global_batch={global_batch} cannot be split evenly over {world_size} ranks; use a multiple "
            f"of {world_size} (each rank takes global_batch // {world_size})"
        )


def _training_loader(
    dataset: Dataset[Any],
    *,
    length: int,
    global_batch: int,
    per_rank: int,
    rank: int,
    world_size: int,
    seed: int,
    num_workers: int,
    pin_memory: bool,
    options: Mapping[str, Any],
) -> DataLoader[Any]:
    """A shuffled, resumable loader of this rank's share of `dataset` (`length` samples): full
    global batches only, each sample's randomness seeded from (seed, epoch, index)."""
    if length // global_batch == 0:
        raise SlurmddpError(
            f"the data set has {length} samples, fewer than one global batch of {global_batch}: "
            "no training step can be made; lower global_batch"
        )
    sampler = ResumableDistributedSampler(length, world_size, rank, shuffle=True, seed=seed, drop_last=True)
    if num_workers > 0:
        dataset = _PerSampleSeeded(dataset, seed)
        # Workers forked once per attempt, not once per epoch: a fork of a process that runs threads
        # (gloo's, a tracker's writer) can copy a lock that another thread holds. A worker of the
        # hand-written baseline in benchmarks/ (a new iterator every epoch) hung that way, in fork.
        options = {"persistent_workers": True, **options}
    return DataLoader(
        dataset,
        batch_size=per_rank,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=pin_memory,
        # Its own generator: making an iterator draws the workers' base seed from it, which would
        # otherwise advance the global RNG (dropout's) at every epoch start and at a resume.
        generator=torch.Generator().manual_seed(seed),
        **options,
    )


class Feed:
    """Gives the batch of each step from a `ctx.loader` training loader, from any step on."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        sampler = loader.sampler
        if not isinstance(sampler, ResumableDistributedSampler) or not loader.drop_last:
            raise SlurmddpError(
                "ctx.loop(data=...) takes a training loader made by ctx.loader(dataset, global_batch=...) "
                "(shuffle=True): the loop positions its sampler at each epoch and on resume"
            )
        assert loader.batch_size is not None
        self.loader = loader
        self.sampler = sampler
        self.batch_size = loader.batch_size
        self.steps_per_epoch = sampler.num_samples // self.batch_size
        self.samples = sampler.dataset_len
        self._iterator: Iterator[Any] | None = None
        self._epoch = -1

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def batch(self, step: int) -> Any:
        """The batch of `step`: the next one of the running epoch, or the first of a new iterator
        positioned at `step` (an epoch start, or a resume)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        if self._iterator is None or epoch != self._epoch:
            self.sampler.load_state_dict({"epoch": epoch, "consumed": within * self.batch_size})
            assert self.loader.generator is not None
            self.loader.generator.manual_seed(sample_seed(self.sampler.seed, epoch, -1))
            if isinstance(self.loader.dataset, _PerSampleSeeded):
                self.loader.dataset.epoch.fill_(epoch)
            self._iterator = iter(self.loader)
            self._epoch = epoch
        return next(self._iterator)

    def advance(self) -> None:
        """The batch handed out last was trained on."""
        self.sampler.advance(self.batch_size)

    def identity(self) -> dict[str, int]:
        """What a checkpoint's position means: a resume with other values would read other batches."""
        return {"samples": self.samples, "global_batch": self.batch_size * self.sampler.num_replicas}


def split(batch: Any, parts: int) -> list[Any]:
    """`batch` cut into `parts` equal micro-batches along the first dimension; tensors inside
    tuples, lists and dicts are cut alike, anything else is repeated."""
    if isinstance(batch, torch.Tensor):
        if batch.shape[0] % parts:
            raise SlurmddpError(
                f"a batch of {batch.shape[0]} samples per rank cannot be cut into {parts} equal "
                f"micro-batches (ddp.accumulate={parts}); make the per-rank batch a multiple of it"
            )
        return list(batch.chunk(parts))
    if isinstance(batch, Mapping):
        cut = {key: split(value, parts) for key, value in batch.items()}
        return [type(batch)((key, pieces[i]) for key, pieces in cut.items()) for i in range(parts)]  # type: ignore[call-arg]
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        columns = [split(value, parts) for value in batch]
        rows = [[column[i] for column in columns] for i in range(parts)]
        return [type(batch)(row) if isinstance(batch, list) else tuple(row) for row in rows]
    return [batch] * parts
