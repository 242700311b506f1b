"""A DDP training function without a data loader: an MLP on seeded synthetic data.

The global batch of step s is a pure function of (seed, s), and each rank trains on its own slice of
it, so any number of ranks computes the same averaged gradient as one process on the whole batch.
"""

from __future__ import annotations

import hashlib
import time

import torch
import torch.nn.functional as F
from torch import nn

from slurmddp import RunContext


def make_model(width: int, classes: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, classes),
    )


def global_batch(
    step: int, size: int, width: int, classes: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    inputs = torch.randn(size, width, generator=gen)
    targets = torch.randint(0, classes, (size,), generator=gen)
    return inputs, targets


def param_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def train(ctx: RunContext) -> dict[str, object]:
    cfg = ctx.train
    if cfg.global_batch % ctx.world_size:
        raise ValueError(f"train.global_batch={cfg.global_batch} is not divisible by {ctx.world_size} ranks")
    local = cfg.global_batch // ctx.world_size
    dtype = getattr(torch, cfg.dtype)
    model = make_model(cfg.width, cfg.classes, cfg.seed).to(ctx.device, dtype)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    # Resumes from the latest checkpoint; on a stop signal every rank saves at the same step and
    # the job is requeued.
    loop = ctx.loop(cfg.steps, model=model, optimizer=optimizer)
    first_step_at = time.time()
    started = time.perf_counter()
    loss = torch.zeros(())
    for step in loop:
        inputs, targets = global_batch(step, cfg.global_batch, cfg.width, cfg.classes, cfg.seed)
        lo = ctx.rank * local
        inputs = inputs[lo : lo + local].to(ctx.device, dtype)
        targets = targets[lo : lo + local].to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(inputs), targets)
        loss.backward()
        optimizer.step()
        # Only a test that needs a long run with idle cores sets it (examples/synthetic.yaml).
        if cfg.get("step_sleep"):
            time.sleep(cfg.step_sleep)
        if step % cfg.log_every == 0:
            ctx.log(step, loss=loss)  # rank 0 appends to metrics.jsonl; `status`/`results` read it
            if ctx.is_main:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - started
    # loop.total_steps, not cfg.steps: telemetry.max_steps (scale --steps) may end the loop sooner.
    steps_run = loop.total_steps - loop.first_step
    ctx.log(loop.total_steps, loss=loss)
    if ctx.is_main:
        torch.save(model.state_dict(), ctx.run_dir / "final_model.pt")
    return {
        "steps": loop.total_steps,
        "final_loss": loss.item(),
        "step_ms": 1000 * elapsed / max(1, steps_run),
        "first_step_at": first_step_at,
        "param_sha256": param_digest(model),
    }
