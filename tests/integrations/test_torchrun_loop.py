"""A plain torchrun loop with slurmddp's lines (examples/frameworks/torchrun_train.py), 3 local
ranks, stopped twice at steps drawn at random: no step is lost or made twice, and the final
parameters are the uninterrupted run's, bit for bit (3 ranks: with 2, a + b == b + a would hide a
changed summation order). The run's records count its steps across the attempts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from framework_runs import (
    assert_each_step_once,
    assert_records_count_the_steps,
    final,
    finish,
    stop_at,
    submit,
)

RANKS = ("resources.nodes=1", "resources.tasks_per_node=3")
TOTAL = 6 * (960 // 3 // 8)  # epochs x batches per rank and epoch


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("reference") / "runs"
    run = finish(submit(out, "torchrun.yaml", *RANKS), out)
    assert_each_step_once(run, 3, TOTAL)
    return final(run)


def test_stopped_twice_at_random_steps_ends_on_the_uninterrupted_weights(
    tmp_path: Path, reference: dict[str, object]
) -> None:
    rng = random.Random()
    first = rng.randrange(10, TOTAL // 2)
    second = rng.randrange(first + 10, TOTAL - 10)
    out = tmp_path / "runs"
    proc = submit(out, "torchrun.yaml", *RANKS)
    stop_at(proc, out, first)
    stop_at(proc, out, second)
    run = finish(proc, out)
    assert_each_step_once(run, 3, TOTAL)
    assert final(run) == reference, f"stopped at {first} and {second}"
    assert_records_count_the_steps(run, TOTAL)
