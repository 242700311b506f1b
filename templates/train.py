"""A starting point for a slurmddp training function: replace the model and data with yours."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from slurmddp import RunContext


def main(ctx: RunContext) -> dict[str, float]:
    cfg = ctx.train
    torch.manual_seed(0)
    model = nn.Linear(32, 1)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
    loss = torch.zeros(())
    # Resumes from the latest checkpoint; on preemption or near the time limit every rank saves at
    # the same step and the job requeues itself.
    for step in ctx.loop(cfg.steps, model=model, optimizer=optimizer):
        # Make each step's data a function of `step` (or use slurmddp.ResumableDistributedSampler)
        # so that a resumed run sees exactly the data the uninterrupted one would have.
        gen = torch.Generator().manual_seed(step * ctx.world_size + ctx.rank)
        inputs = torch.randn(cfg.batch_size, 32, generator=gen).to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(ddp(inputs), inputs.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        if ctx.is_main and step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    return {"loss": loss.item()}
