"""The elements of a scaling study: sizes, the baseline, batches per mode, and every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Entrypoint, Experiment, Resources
from slurmddp.experiment.study import Study, numbers, plan


def experiment(batch: int | None = 64, nodes: int = 2, tasks: int = 2, gpus: int = 0) -> Experiment:
    train = {} if batch is None else {"global_batch": batch}
    resources = Resources(nodes=nodes, tasks_per_node=None if gpus else tasks, gpus_per_node=gpus)
    return Experiment(entrypoint=Entrypoint(function="m:f"), resources=resources, train=train)


DEFAULTS: dict[str, Any] = {
    "nodes": [1, 2],
    "ranks_per_node": None,
    "mode": "weak",
    "steps": None,
    "batch_key": None,
    "bucket_caps": [],
    "cluster_nodes": None,
}


def study(exp: Experiment | None = None, **changes: Any) -> Study:
    """plan() of `exp` (default: 64 a step on 2 nodes x 2 ranks) with DEFAULTS changed by `changes`."""
    return plan(exp or experiment(), **{**DEFAULTS, **changes})


def test_weak_scaling_keeps_the_batch_per_rank_and_adds_a_baseline() -> None:
    made = study(nodes=[3, 1, 2], steps=50, cluster_nodes=3)
    # Written for 4 ranks with 64: 16 a rank, kept at every size.
    got = [(e.role, e.nodes, e.ranks, e.overrides["train.global_batch"]) for e in made.elements]
    assert got == [("baseline", 1, 1, 16), ("size", 1, 2, 32), ("size", 2, 4, 64), ("size", 3, 6, 96)]
    assert all(e.overrides["telemetry.max_steps"] == 50 for e in made.elements)
    assert made.elements[0].overrides["resources.tasks_per_node"] == 1
    assert [e.index for e in made.elements] == [0, 1, 2, 3]


def test_strong_scaling_keeps_the_global_batch_and_bucket_sizes_run_at_the_largest() -> None:
    made = study(
        experiment(batch=48, gpus=4),
        nodes=[1, 3],
        ranks_per_node=4,
        mode="strong",
        batch_key="train.global_batch",
        bucket_caps=[5, 100],
    )
    got = [(e.label, e.ranks, e.bucket_cap_mb, e.overrides["train.global_batch"]) for e in made.elements]
    assert got == [
        ("baseline", 1, None, 48),
        ("1 node", 4, None, 48),
        ("3 nodes", 12, None, 48),
        ("3 nodes, bucket 5 MB", 12, 5, 48),
        ("3 nodes, bucket 100 MB", 12, 100, 48),
    ]
    assert made.elements[2].overrides["resources.gpus_per_node"] == 4  # a GPU job sets GPUs, not tasks
    assert made.elements[3].overrides["ddp.bucket_cap_mb"] == 5
    assert "telemetry.max_steps" not in made.elements[0].overrides


def test_one_rank_per_node_measures_one_node_once_as_the_baseline() -> None:
    made = study(experiment(batch=None, nodes=1, tasks=1), nodes=[1, 2, 3])
    assert [(e.label, e.ranks) for e in made.elements] == [
        ("1 node (baseline)", 1),
        ("2 nodes", 2),
        ("3 nodes", 3),
    ]
    assert all("train.global_batch" not in e.overrides for e in made.elements)  # none to keep


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"nodes": [1, 4], "cluster_nodes": 3}, "4 nodes, but the default partition has 3"),
        ({"mode": "fast"}, "--mode fast: must be weak or strong"),
        ({"mode": "strong", "nodes": [1, 3]}, "3 rank(s) cannot split it evenly"),
        ({"batch_key": "bs"}, "--batch-key bs: the experiment's train: has no 'bs'"),
        ({"nodes": []}, "--nodes: give the node counts"),
        ({"steps": 3}, "--steps 3: the first 3 steps of a run are warm-up"),
    ],
)
def test_a_bad_study_is_refused(kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        study(ranks_per_node=1, **kwargs)


def test_weak_scaling_needs_a_batch_that_splits_over_the_written_ranks() -> None:
    # train.global_batch is checked as the experiment loads; a batch under another key, here.
    exp = Experiment(
        entrypoint=Entrypoint(function="m:f"),
        resources=Resources(nodes=2, tasks_per_node=2),
        train={"bs": 30},
    )
    with pytest.raises(ConfigError, match="bs=30 does not split evenly over the experiment's 4 ranks"):
        study(exp, nodes=[1], batch_key="train.bs")


def test_an_experiment_whose_global_batch_cannot_split_over_its_ranks_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        experiment(batch=30)
    assert str(refused.value) == (
        "train.global_batch: 30 samples cannot be split evenly over 4 ranks (resources.nodes=2 x 2 per "
        "node); use a multiple of 4, such as 28 or 32, or change the number of ranks"
    )
    with pytest.raises(ConfigError, match="use a multiple of 4, such as 4, or"):
        experiment(batch=2)
    assert experiment(batch=32).train == {"global_batch": 32}


def test_numbers_are_positive_distinct_and_named() -> None:
    assert numbers("1, 2,4", "--nodes", int) == [1, 2, 4]
    assert numbers("5,25.5", "--bucket-cap-mb", float) == [5.0, 25.5]
    for text, said in (
        ("", "is not a number"),
        ("0", "not positive"),
        ("2,2", "given twice"),
        ("x", "--nodes x"),
    ):
        with pytest.raises(ConfigError, match=said):
            numbers(text, "--nodes", int)


def test_a_study_needs_the_telemetry_on() -> None:
    exp = experiment()
    exp.telemetry.enabled = False
    with pytest.raises(ConfigError, match=r"drop telemetry\.enabled=false"):
        study(exp)
