"""An ordinary torchrun script, unchanged: it reads RANK/WORLD_SIZE/... from the environment.

Run it with torchrun, or on Slurm with `python -m slurmddp submit examples/torchrun_script.yaml`.
Rank 0 writes what every rank saw (its rank variables and host) to a JSON file (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

SEEN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NODEID",
    "SLURM_JOB_NODELIST",
    "CUDA_VISIBLE_DEVICES",
    "SLURMDDP_DEVICE",
    "OMP_NUM_THREADS",
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    # SLURMDDP_RUN_DIR is set by slurmddp; under plain torchrun the file lands in the current dir.
    parser.add_argument("--out", default=os.path.join(os.environ.get("SLURMDDP_RUN_DIR", "."), "ranks.json"))
    parser.add_argument("--steps", type=int, default=20)
    # The torchelastic pattern: snapshot every N steps, resume from the snapshot after a restart.
    # Under slurmddp a stop signal reaches the script as SIGTERM, whose default action ends it.
    parser.add_argument("--snapshot-every", type=int, default=0)
    parser.add_argument(
        "--snapshot", default=os.path.join(os.environ.get("SLURMDDP_RUN_DIR", "."), "snapshot.pt")
    )
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(16, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if args.snapshot_every and os.path.exists(args.snapshot):
        snapshot = torch.load(args.snapshot, map_location=device, weights_only=True)
        model.module.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        start = snapshot["step"]
        print(f"resumed from snapshot at step {start}", flush=True)
    for step in range(start, args.steps):
        gen = torch.Generator().manual_seed(step * 100 + dist.get_rank())
        inputs = torch.randn(8, 16, generator=gen).to(device)
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        if args.snapshot_every and (step + 1) % args.snapshot_every == 0 and dist.get_rank() == 0:
            state = {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "step": step + 1,
            }
            torch.save(state, args.snapshot + ".tmp")
            os.replace(args.snapshot + ".tmp", args.snapshot)

    seen = {name: os.environ.get(name) for name in SEEN}
    seen["hostname"] = socket.gethostname()
    seen["threads"] = torch.get_num_threads()
    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, seen)
    if dist.get_rank() == 0:
        with open(args.out, "w") as handle:
            json.dump({"ranks": everyone, "weight_sum": model.module.weight.sum().item()}, handle, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
