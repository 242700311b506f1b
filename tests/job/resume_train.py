"""The training function of test_rank_resume.py: a small model with dropout under autocast whose
every batch is drawn from the RNG streams (CUDA's on a GPU), so a resume is exact only if the
checkpoint restored those streams, the model and the optimizer."""

from __future__ import annotations

import hashlib
import os
import signal
from typing import Any

from slurmddp import RunContext

STEPS = 30
STOP_AT_ENV = "RESUME_TEST_STOP_AT"
CRASH_AT_ENV = "RESUME_TEST_CRASH_AT"


def train(ctx: RunContext) -> dict[str, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)  # the same initial weights in every attempt; a resume overwrites them
    model = ctx.ddp(nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.2), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # Each rank its own stream, as each draws its own data: a resume must give each rank its own back.
    torch.manual_seed(1000 + ctx.rank)
    stop_at = int(os.environ.get(STOP_AT_ENV, "-1"))
    crash_at = int(os.environ.get(CRASH_AT_ENV, "-1"))
    loss = torch.zeros(())
    for step in ctx.loop(STEPS, model=model, optimizer=optimizer):
        x = torch.randn(16, 32, device=ctx.device)
        y = torch.randint(0, 4, (16,), device=ctx.device)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == stop_at and ctx.restart_count == 0:
            # What Slurm sends before the time limit; the loop stops every rank one step later.
            os.kill(os.getpid(), signal.SIGUSR2)
        if step == crash_at and ctx.restart_count == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    weights = torch.cat([p.detach().float().flatten() for p in model.parameters()]).cpu()
    return {
        "device": str(ctx.device),
        "loss": float(loss.item()),
        "digest": hashlib.sha256(repr(weights.tolist()).encode()).hexdigest(),
    }
