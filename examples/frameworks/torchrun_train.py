"""A plain torchrun DDP loop (the PyTorch DDP tutorial's shape: DistributedSampler, set_epoch,
rank 0 checkpoints), made preemption-safe by slurmddp's lines, marked `# slurmddp`.

    torchrun --nproc-per-node 3 examples/frameworks/torchrun_train.py          # as before
    python -m slurmddp submit examples/frameworks/torchrun.yaml                 # on Slurm

Each optimizer step is appended to RUN_DIR/steps-RANK.log with its time (the tests count steps done
twice or never; benchmarks/framework_stop.py times them), and rank 0 writes the final parameters'
digest to RUN_DIR/final.json.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import slurmddp  # slurmddp
from slurmddp.integrations import checkpoints  # slurmddp


def dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(960, 32, generator=gen)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--no-slurmddp", action="store_true", help="leave slurmddp's lines out (benchmarks)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds added to each step (tests)")
    args = parser.parse_args()
    run_dir = os.environ.get("SLURMDDP_RUN_DIR", ".")
    ckpt_dir = os.path.join(run_dir, "checkpoints")

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    sampler = DistributedSampler(dataset(), shuffle=True, seed=0)
    # Its own generator: making an iterator draws a seed from it, and from the global RNG (which
    # dropout draws from) without one; a resumed epoch makes one more iterator than the original.
    loader = DataLoader(
        dataset(), batch_size=args.batch_size, sampler=sampler, drop_last=True, generator=torch.Generator()
    )

    step = 0
    state = None if args.no_slurmddp else checkpoints.resume(ckpt_dir)  # slurmddp
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    with open(os.path.join(run_dir, f"steps-{rank}.log"), "a") as steps_log:
        for epoch in range(step // len(loader), args.epochs):
            sampler.set_epoch(epoch)
            # A resumed epoch skips the batches its checkpoint already trained on.
            for x, y in itertools.islice(loader, step - epoch * len(loader), None):
                optimizer.zero_grad()
                loss = nn.functional.binary_cross_entropy_with_logits(ddp(x), y)
                loss.backward()
                optimizer.step()
                step += 1
                steps_log.write(f"{step} {time.time()}\n")
                steps_log.flush()
                time.sleep(args.step_sleep)
                if not args.no_slurmddp and slurmddp.should_stop():  # slurmddp
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                    checkpoints.save(ckpt_dir, step, state)  # slurmddp
                    slurmddp.exit_for_requeue()  # slurmddp

    if rank == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
        with open(os.path.join(run_dir, "final.json"), "w") as handle:
            json.dump({"digest": digest.hexdigest(), "steps": step}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
