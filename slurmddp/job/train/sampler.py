"""A DistributedSampler that can stop in the middle of an epoch and resume at the next index.

    sampler = ResumableDistributedSampler(len(dataset), world_size, rank, seed=seed)
    loader = DataLoader(dataset, batch_size=bs, sampler=sampler)
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)          # the same epoch as a loaded state keeps its position
        for batch in loader:
            ...one step...
            sampler.advance(len(batch))   # at the step boundary, before the state is saved

Position is what the caller reports through advance(), not what the sampler has handed out: a
DataLoader pulls indices ahead of training (prefetch_factor * num_workers batches with worker
processes), so a count of handed-out indices would skip the prefetched samples on resume.
Every rank advances by the same amounts (each rank's share of an epoch has the same length), so
the state is the same on all ranks and may be saved with the shared state by rank 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Sampler

from slurmddp.errors import SamplerStateError


class ResumableDistributedSampler(Sampler[int]):
    """This rank's indices of the current epoch, the same as torch.utils.data.DistributedSampler
    gives (same permutation from seed + epoch, same padding or dropping), from a resumable position.
    """

    def __init__(
        self,
        dataset_len: int,
        num_replicas: int,
        rank: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if dataset_len < 0:
            raise SamplerStateError(f"dataset_len is {dataset_len}; it must be >= 0")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise SamplerStateError(f"rank {rank} is not one of {num_replicas} replicas")
        self.dataset_len = dataset_len
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        # DistributedSampler's arithmetic, kept verbatim so the shares match it exactly.
        if drop_last and dataset_len % num_replicas != 0:
            self.num_samples = math.ceil((dataset_len - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(dataset_len / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.epoch = 0
        self._consumed = 0
        # Where the next iteration starts: the loaded position once, then 0 (as a fresh epoch).
        self._start = 0

    def epoch_indices(self) -> list[int]:
        """All of this rank's indices of the current epoch, from the first."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices: list[int] = torch.randperm(self.dataset_len, generator=generator).tolist()
        else:
            indices = list(range(self.dataset_len))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[: self.total_size]
        return indices[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        start = self._start
        self._start = 0
        self._consumed = start
        return iter(self.epoch_indices()[start:])

    def __len__(self) -> int:
        """How many indices the next iteration yields (fewer than a full share right after a
        mid-epoch load_state_dict())."""
        return self.num_samples - self._start

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order is used. A different epoch starts at its first index; the
        current one (e.g. the epoch of a loaded state) keeps its position."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._consumed = 0
            self._start = 0

    def advance(self, n: int) -> None:
        """Record that `n` more of this epoch's indices were consumed by training."""
        if n < 0 or self._consumed + n > self.num_samples:
            raise SamplerStateError(
                f"advance({n}) after {self._consumed} of this rank's {self.num_samples} indices "
                f"of epoch {self.epoch}: an epoch has no more; call set_epoch() for the next one"
            )
        self._consumed += n

    def state_dict(self) -> dict[str, int]:
        """{"epoch", "consumed"}: consumed = indices of this epoch reported through advance()."""
        return {"epoch": self.epoch, "consumed": self._consumed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the index after the last one consumed when `state` was taken."""
        epoch, consumed = state.get("epoch"), state.get("consumed")
        if type(epoch) is not int or type(consumed) is not int or not 0 <= consumed <= self.num_samples:
            raise SamplerStateError(
                f"sampler state {dict(state)!r} does not fit this sampler (epoch: int, consumed: "
                f"0..{self.num_samples}); was it saved with another dataset size or world size?"
            )
        self.epoch = epoch
        self._consumed = consumed
        self._start = consumed
