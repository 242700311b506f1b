"""Reading a quickstart run back: its validation history, its final parameters, the samples each
rank trained on (train.record_samples=true). Shared by the local and the real-cluster tests."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

TRAIN_SAMPLES = 1797 - 360
"""The quickstart's training split."""


def result(run: Path) -> dict[str, Any]:
    outcome: dict[str, Any] = json.loads((run / "result.json").read_text())
    assert len({r["param_sha256"] for r in outcome["ranks"]}) == 1, "ranks ended with different parameters"
    return outcome


def validation_history(run: Path) -> list[tuple[int, float, float]]:
    """(step, val_acc, val_loss) of every validation, as metrics.jsonl holds them."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["val_acc"], r["val_loss"]) for r in records if "val_acc" in r]


def assert_every_sample_once_per_epoch(run: Path, global_batch: int, epochs: int) -> None:
    """Each step trained once per rank (no step lost or repeated across attempts), and over all
    ranks every epoch saw distinct samples, one full global batch a step."""
    steps_per_epoch = TRAIN_SAMPLES // global_batch
    per_step: dict[int, list[int]] = defaultdict(list)
    steps_of_rank: Counter[tuple[int, int]] = Counter()
    files = sorted((run / "samples").glob("rank-*.jsonl"))
    assert files, "no samples were recorded"
    for rank, path in enumerate(files):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps_of_rank[(rank, record["step"])] += 1
            assert record["epoch"] == record["step"] // steps_per_epoch
            per_step[record["step"]].extend(record["index"])
    repeated = [key for key, n in steps_of_rank.items() if n > 1]
    assert not repeated, f"(rank, step) trained twice: {repeated[:5]}"
    assert sorted(per_step) == list(range(epochs * steps_per_epoch)), "steps missing"
    for epoch in range(epochs):
        steps = range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
        seen = Counter(i for step in steps for i in per_step[step])
        assert len(seen) == steps_per_epoch * global_batch and max(seen.values()) == 1, f"epoch {epoch}"


def global_batches(run: Path) -> dict[int, list[int]]:
    """step -> the sorted sample indices all ranks trained on at that step (train.record_samples)."""
    batches: dict[int, list[int]] = defaultdict(list)
    for path in (run / "samples").glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            batches[record["step"]].extend(record["index"])
    return {step: sorted(indices) for step, indices in batches.items()}


def largest_parameter_difference(run: Path, reference: Path) -> float:
    """The largest difference between the final parameters (final_model.pt) of two runs."""
    import torch

    ours, theirs = (torch.load(r / "final_model.pt") for r in (run, reference))
    assert ours.keys() == theirs.keys()
    return max(float((ours[name] - tensor).abs().max()) for name, tensor in theirs.items())


def last_step(root: Path) -> int:
    """The last step rank 0 trained, from its per-step sample record (train.record_samples) in
    the one run under `root` (an output_dir or the run directory); -1 before the first."""
    try:
        lines = next(root.glob("**/samples/rank-0.jsonl")).read_text().splitlines()
        return max(int(json.loads(line)["step"]) for line in lines[-2:] if line.endswith("}"))
    except (StopIteration, OSError, ValueError, KeyError):
        return -1
