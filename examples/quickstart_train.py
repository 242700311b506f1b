"""The quickstart's training function: an MLP learns handwritten digits with DistributedDataParallel.

What real DDP code does, with slurmddp's helpers: a sharded, reshuffled training loader
(`ctx.loader`), epochs and a validation pass over a sharded set reduced across ranks
(`ctx.reduce_sum`), mixed precision (`ctx.autocast`, `ctx.scaler`) and gradient accumulation
(`loop.micro_batches`) as the config says, and a loop that checkpoints, stops on preemption and
resumes mid-epoch exactly (`ctx.loop`).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from slurmddp import RunContext

DATA = Path(__file__).resolve().parent / "data" / "digits.csv.gz"
VALIDATION = 360
"""The last 360 of the 1797 digits are held out."""


class Digits(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """(image as 64 values in 0..1, label, index) for rows [start, stop) of digits.csv.gz."""

    def __init__(self, start: int, stop: int | None, dtype: torch.dtype) -> None:
        with gzip.open(DATA, "rt") as handle:
            rows = [[int(v) for v in row] for row in csv.reader(handle)][start:stop]
        table = torch.tensor(rows)
        self.images = (table[:, :64] / 16).to(dtype)
        self.labels = table[:, 64]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.images[index], self.labels[index], index


def make_model(hidden: int, dropout: float, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def param_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def widened(logits: torch.Tensor) -> torch.Tensor:
    """bfloat16 logits (autocast) to float32 for the loss; float64 ones stay float64."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


@torch.no_grad()
def evaluate(ctx: RunContext, model: nn.Module, loader: torch.utils.data.DataLoader) -> dict[str, float]:
    """Accuracy and mean loss over the whole validation set, as one process would count them."""
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for images, labels, _ in loader:
        images, labels = images.to(ctx.device), labels.to(ctx.device)
        with ctx.autocast():
            logits = model(images)
        loss_sum += F.cross_entropy(widened(logits), labels, reduction="sum").item()
        correct += int((logits.argmax(1) == labels).sum())
        total += len(labels)
    model.train()
    correct, total, loss_sum = ctx.reduce_sum(correct, total, loss_sum)
    return {"val_acc": correct / total, "val_loss": loss_sum / total}


def train(ctx: RunContext) -> dict[str, object]:
    cfg = ctx.train
    dtype = getattr(torch, cfg.dtype)
    train_set = Digits(0, -VALIDATION, dtype)
    val_set = Digits(-VALIDATION, None, dtype)
    model = make_model(cfg.hidden, cfg.dropout, cfg.seed).to(ctx.device, dtype)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    train_loader = ctx.loader(
        train_set, global_batch=cfg.global_batch, num_workers=cfg.workers, seed=cfg.seed
    )
    val_loader = ctx.loader(val_set, global_batch=4 * cfg.global_batch, shuffle=False)
    # Resumes from the latest checkpoint (mid-epoch too); on a stop signal every rank saves at the
    # same step and the job is requeued.
    loop = ctx.loop(epochs=cfg.epochs, data=train_loader, model=model, optimizer=optimizer)
    samples = ctx.run_dir / "samples" / f"rank-{ctx.rank}.jsonl"
    if cfg.record_samples:
        samples.parent.mkdir(exist_ok=True)
    metrics: dict[str, float] = {}
    started = time.perf_counter()
    for step, (images, labels, index) in loop:
        optimizer.zero_grad(set_to_none=True)
        for x, y in loop.micro_batches((images.to(ctx.device), labels.to(ctx.device))):
            with ctx.autocast():
                loss = F.cross_entropy(widened(ddp(x)), y) / loop.accumulate
            ctx.scaler.scale(loss).backward()
        ctx.scaler.step(optimizer)
        ctx.scaler.update()
        if cfg.record_samples and not loop.priming:
            with samples.open("a") as handle:
                handle.write(json.dumps({"step": step, "epoch": loop.epoch, "index": index.tolist()}) + "\n")
        if step % cfg.log_every == 0:
            # The mean over ranks: each rank's loss is over its own share of the batch.
            ctx.log(step, loss=ctx.reduce_mean(loss * loop.accumulate), epoch=loop.epoch)
        if loop.epoch_end:
            metrics = evaluate(ctx, model, val_loader)
            ctx.log(step, epoch=loop.epoch, **metrics)
            if ctx.is_main and not loop.priming:
                print(
                    f"epoch {loop.epoch} step {step} " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
                    flush=True,
                )
    steps_run = loop.total_steps - loop.first_step
    if ctx.is_main:
        torch.save(model.state_dict(), ctx.run_dir / "final_model.pt")
    return {
        "steps": loop.total_steps,
        "epochs": cfg.epochs,
        **metrics,
        "step_ms": 1000 * (time.perf_counter() - started) / max(1, steps_run),
        "param_sha256": param_digest(model),
    }
