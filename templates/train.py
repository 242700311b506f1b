"""A starting point for a slurmddp training function: replace the data set and the model with yours.

It does what the quickstart in slurmddp's examples does: a sharded loader, epochs, validation
reduced over ranks, mixed precision and accumulation as the config's `precision:` and `ddp:` say,
and a loop that checkpoints and resumes mid-epoch exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from slurmddp import RunContext


def data(n: int, seed: int) -> TensorDataset:
    """Stand-in data: y = sum(x). Any map-style Dataset works."""
    x = torch.randn(n, 32, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


@torch.no_grad()
def validate(ctx: RunContext, model: nn.Module, loader: torch.utils.data.DataLoader) -> float:
    model.eval()
    loss_sum, count = 0.0, 0
    for x, y in loader:
        with ctx.autocast():
            loss_sum += F.mse_loss(model(x.to(ctx.device)).float(), y.to(ctx.device), reduction="sum").item()
        count += len(y)
    model.train()
    loss_sum, count = ctx.reduce_sum(loss_sum, count)  # over all ranks: what one process would get
    return loss_sum / count


def main(ctx: RunContext) -> dict[str, float]:
    cfg = ctx.train
    torch.manual_seed(0)  # the same initial weights on every rank (a resume overwrites them)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
    train_loader = ctx.loader(data(4096, 0), global_batch=cfg.global_batch, num_workers=cfg.workers)
    val_loader = ctx.loader(data(512, 1), global_batch=cfg.global_batch, shuffle=False)
    # Resumes from the latest checkpoint; on preemption or near the time limit every rank saves at
    # the same step and the job requeues itself.
    loop = ctx.loop(epochs=cfg.epochs, data=train_loader, model=model, optimizer=optimizer)
    val_loss = float("nan")
    for step, (x, y) in loop:
        optimizer.zero_grad(set_to_none=True)
        for xs, ys in loop.micro_batches((x.to(ctx.device), y.to(ctx.device))):
            with ctx.autocast():
                loss = F.mse_loss(ddp(xs).float(), ys) / loop.accumulate
            ctx.scaler.scale(loss).backward()
        ctx.scaler.step(optimizer)
        ctx.scaler.update()
        if step % 50 == 0:
            ctx.log(step, loss=loss * loop.accumulate)
        if loop.epoch_end:
            val_loss = validate(ctx, model, val_loader)
            ctx.log(step, val_loss=val_loss, epoch=loop.epoch)
    return {"val_loss": val_loss}
