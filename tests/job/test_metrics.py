"""Reductions over 3 gloo ranks (in processes of this test): sums of counts stay exact integers,
means and gathers see every rank."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from slurmddp.job.train.metrics import gather, reduce_mean, reduce_sum

WORLD = 3


def _rank(rank: int, init: str, out: str) -> None:
    tdist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    cpu = torch.device("cpu")
    try:
        counts = reduce_sum([rank + 1, torch.tensor(10 * rank)], cpu)
        floats = reduce_sum([0.1 * rank, 2**53], cpu)
        mean = reduce_mean(torch.tensor(float(rank)), cpu)
        everyone = gather({"rank": rank})
        torch.save({"counts": counts, "floats": floats, "mean": mean, "gather": everyone}, f"{out}/{rank}.pt")
    finally:
        tdist.destroy_process_group()


def test_reductions_over_three_ranks(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs=WORLD)
    results = [torch.load(tmp_path / f"{rank}.pt") for rank in range(WORLD)]
    for got in results:
        assert got["counts"] == [6, 30] and all(type(v) is int for v in got["counts"])
        assert abs(got["floats"][0] - 0.3) < 1e-12 and got["floats"][1] == 3 * 2**53
        assert got["mean"] == 1.0
        assert got["gather"] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
