"""A torchrun script that does what docs/resume.md asked before slurmddp.should_stop() existed: it
saves a snapshot when SIGTERM arrives and exits. It knows nothing of slurmddp or of USR2.

Each rank appends its optimizer steps to RUN_DIR/steps-RANK.log; rank 0 writes the final weights'
sum to final.json."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

stop = False


def on_sigterm(signum: int, frame: object) -> None:
    global stop
    stop = True


def main() -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    run_dir = os.environ["SLURMDDP_RUN_DIR"]
    snapshot = os.path.join(run_dir, "snapshot.pt")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(snapshot):
        state = torch.load(snapshot, weights_only=True)
        model.module.load_state_dict(state["model"])
        start = state["step"]
    total = int(sys.argv[1])
    with open(os.path.join(run_dir, f"steps-{rank}.log"), "a") as steps:
        for step in range(start + 1, total + 1):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 10 + rank))
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
            steps.write(f"{step}\n")
            steps.flush()
            time.sleep(0.05)
            # Each rank's own flag: ranks may see SIGTERM a step apart, so all agree on the max.
            flag = torch.tensor([int(stop)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                if rank == 0:
                    torch.save({"model": model.module.state_dict(), "step": step}, snapshot + ".tmp")
                    os.replace(snapshot + ".tmp", snapshot)
                dist.barrier()
                sys.exit(0)
    if rank == 0:
        with open(os.path.join(run_dir, "final.json"), "w") as handle:
            json.dump({"weight_sum": model.module.weight.sum().item()}, handle)


if __name__ == "__main__":
    main()
