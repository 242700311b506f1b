"""ResumableDistributedSampler: torch's DistributedSampler order, plus an exact mid-epoch resume."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from slurmddp.errors import SamplerStateError
from slurmddp.job.train.sampler import ResumableDistributedSampler


class Indices(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_same_indices_as_torch_distributed_sampler(shuffle: bool, drop_last: bool) -> None:
    for n, replicas, seed in itertools.product([0, 1, 2, 5, 7, 10, 13, 64, 101], [1, 2, 3, 4, 8], [0, 7]):
        for rank in range(replicas):
            ours = ResumableDistributedSampler(
                n, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
            theirs: DistributedSampler[int] = DistributedSampler(
                Indices(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
            for epoch in (0, 1, 5):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                case = (n, replicas, rank, seed, epoch)
                assert list(ours) == list(theirs), case
                assert len(ours) == len(theirs) == ours.num_samples, case


def run(
    sampler: ResumableDistributedSampler,
    epochs: int,
    batch_size: int,
    stop_after: int | None,
    drop_last_batch: bool = False,
) -> tuple[list[list[int]], dict[str, int]]:
    """The batches a training loop sees, stopping (at a step boundary) after `stop_after` batches."""
    loader = DataLoader(
        Indices(sampler.dataset_len),
        batch_size=batch_size,
        sampler=sampler,
        num_workers=0,
        drop_last=drop_last_batch,
    )
    seen: list[list[int]] = []
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            seen.append(batch.tolist())
            sampler.advance(len(batch))
            if stop_after is not None and len(seen) == stop_after:
                return seen, sampler.state_dict()
    return seen, sampler.state_dict()


@pytest.mark.parametrize(("drop_last", "drop_last_batch"), [(False, False), (True, False), (False, True)])
def test_interrupted_and_resumed_iteration_matches_uninterrupted(
    drop_last: bool, drop_last_batch: bool
) -> None:
    n, replicas, batch_size, epochs = 43, 3, 4, 3  # 15 indices per rank: 4 batches, the last partial
    for rank in range(replicas):

        def sampler(rank: int = rank) -> ResumableDistributedSampler:
            return ResumableDistributedSampler(n, replicas, rank, seed=3, drop_last=drop_last)

        full, _ = run(sampler(), epochs, batch_size, None, drop_last_batch)
        # Every stop point, including the last batch of an epoch and the end of training.
        for stop in range(1, len(full) + 1):
            first, state = run(sampler(), epochs, batch_size, stop, drop_last_batch)
            resumed = sampler()
            resumed.load_state_dict(state)
            rest, _ = run(resumed, epochs, batch_size, None, drop_last_batch)
            assert first + rest == full, (rank, stop, state)
        # Two interruptions in a row, one inside an epoch, one across an epoch boundary.
        first, state = run(sampler(), epochs, batch_size, 2, drop_last_batch)
        again = sampler()
        again.load_state_dict(state)
        second, state = run(again, epochs, batch_size, 4, drop_last_batch)
        last = sampler()
        last.load_state_dict(state)
        rest, _ = run(last, epochs, batch_size, None, drop_last_batch)
        assert first + second + rest == full


def test_state_dict_counts_what_was_reported_not_what_was_handed_out() -> None:
    sampler = ResumableDistributedSampler(20, 2, 0, seed=1)
    iterator = iter(sampler)
    handed_out = [next(iterator) for _ in range(6)]
    sampler.advance(4)
    assert sampler.state_dict() == {"epoch": 0, "consumed": 4}
    resumed = ResumableDistributedSampler(20, 2, 0, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    assert len(resumed) == 6
    assert list(resumed)[:2] == handed_out[4:6]


def test_set_epoch_keeps_the_loaded_position_only_for_the_loaded_epoch() -> None:
    sampler = ResumableDistributedSampler(10, 1, 0, seed=0)
    sampler.set_epoch(2)
    order = list(sampler)
    sampler.load_state_dict({"epoch": 2, "consumed": 3})
    sampler.set_epoch(2)
    assert list(sampler) == order[3:]
    # The resume point is used once: a second pass over the same epoch is whole, as in torch.
    assert list(sampler) == order
    sampler.load_state_dict({"epoch": 2, "consumed": 3})
    sampler.set_epoch(3)
    assert sampler.state_dict() == {"epoch": 3, "consumed": 0}
    assert len(list(sampler)) == 10


def test_bad_values_are_refused() -> None:
    sampler = ResumableDistributedSampler(10, 2, 1)
    with pytest.raises(SamplerStateError, match="no more"):
        sampler.advance(6)
    with pytest.raises(SamplerStateError, match="another dataset size"):
        sampler.load_state_dict({"epoch": 0, "consumed": 6})
    with pytest.raises(SamplerStateError):
        sampler.load_state_dict({"epoch": "0", "consumed": 1})
    with pytest.raises(SamplerStateError):
        ResumableDistributedSampler(10, 2, 2)


def test_state_survives_a_checkpoint_round_trip() -> None:
    # The state is plain ints: it loads with torch.load(weights_only=True).
    import io

    buffer = io.BytesIO()
    torch.save(ResumableDistributedSampler(10, 2, 1).state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == {"epoch": 0, "consumed": 0}
