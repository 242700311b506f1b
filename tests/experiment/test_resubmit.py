"""What a resubmission may change, and the accumulation it picks for another number of ranks."""

from __future__ import annotations

import pytest

from slurmddp.errors import ConfigError
from slurmddp.experiment.resubmit import accumulate_for, changed_keys, check_changes

BEFORE = {
    "name": "exp",
    "resources": {"nodes": 2, "time": "01:00:00", "sbatch": {}},
    "ddp": {"accumulate": 1, "static_graph": False},
    "checkpoint": {"dir": None, "every_steps": 0},
    "train": {"lr": 0.1, "layers": [1, 2]},
}


def changed(**sections: dict[str, object]) -> dict[str, object]:
    return {**BEFORE, **{name: {**BEFORE[name], **values} for name, values in sections.items()}}


def test_changed_keys_are_dotted_leaves() -> None:
    after = changed(resources={"nodes": 1, "sbatch": {"nodelist": "node1"}}, train={"layers": [1, 3]})
    assert changed_keys(BEFORE, after) == ["resources.nodes", "resources.sbatch", "train.layers"]
    assert changed_keys(BEFORE, BEFORE) == []


def test_where_and_how_long_may_change_what_is_trained_may_not() -> None:
    after = changed(
        resources={"nodes": 1, "time": "04:00:00"}, ddp={"accumulate": 2}, checkpoint={"every_steps": 50}
    )
    assert check_changes(BEFORE, after) == [
        "checkpoint.every_steps",
        "ddp.accumulate",
        "resources.nodes",
        "resources.time",
    ]
    refused = {
        "train.lr": changed(train={"lr": 0.5}),
        "ddp.static_graph": changed(ddp={"static_graph": True}),
        "checkpoint.dir": changed(checkpoint={"dir": "/elsewhere"}),
        "name": {**BEFORE, "name": "other"},
    }
    for key, after in refused.items():
        with pytest.raises(ConfigError, match=rf"resubmit cannot change {key} .*submit the experiment again"):
            check_changes(BEFORE, after)


@pytest.mark.parametrize(
    ("accumulate", "before", "after", "global_batch", "expected"),
    [
        (1, 2, 1, 64, 2),  # one rank takes both shares: two micro-batches of the old size
        (1, 3, 2, 60, 2),  # 30 a rank, 15 a micro-batch (was 20)
        (1, 3, 2, 66, 3),  # 33 a rank: 2 does not cut it evenly, 3 does (11 a micro-batch)
        (2, 3, 2, None, 3),  # global batch unknown (no ctx.loader): the ceiling
        (4, 1, 2, 64, 2),  # more ranks, fewer micro-batches
        (1, 1, 4, 64, 1),
        (1, 4, 1, 2, 2),  # a share of 2 cut into micro-batches of 1 at most
        (8, 1, 2, 4, 2),  # wanted 4 > the share of 2: one sample a micro-batch
    ],
)
def test_accumulation_keeps_a_ranks_micro_batch_no_larger(
    accumulate: int, before: int, after: int, global_batch: int | None, expected: int
) -> None:
    assert accumulate_for(accumulate, before, after, global_batch) == expected


def test_a_global_batch_the_new_ranks_cannot_share_is_refused() -> None:
    with pytest.raises(ConfigError, match="global batch of 64 samples cannot be split evenly over 3 ranks"):
        accumulate_for(1, 2, 3, 64)
