"""The baseline for step_time.py: a hand-written DDP loop over quickstart's model and data.

Run as one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; rank 0 prints
{"step_ms": ...} as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from synthetic_train import global_batch, make_model  # examples/ is not a package


def main() -> None:
    steps, width, classes, batch, seed = int(sys.argv[1]), 512, 10, 64, 0
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = batch // world
    model = DistributedDataParallel(make_model(width, classes, seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    started = time.perf_counter()
    for step in range(steps):
        inputs, targets = global_batch(step, batch, width, classes, seed)
        lo = rank * local
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs[lo : lo + local]), targets[lo : lo + local]).backward()
        optimizer.step()
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(json.dumps({"step_ms": 1000 * elapsed / steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
