"""A workload whose compute is a fixed sleep per step and whose gradients are real: how a GPU job
scales, on machines whose cores cannot stand in for GPUs.

Each layer's forward and backward sleep their share of `train.compute_ms`, so, as on a GPU, the
compute takes the same time whatever else runs, and the all-reduce of the last layers' buckets
overlaps the backward of the first ones. The model's weights are real and DDP averages real
gradients (`train.width`, `train.layers` set their size).

Besides slurmddp's telemetry it keeps its own record, to check it against:
- RUN_DIR/own_steps.txt (rank 0): the time at the end of every step;
- `allreduce_s` in its result: after training, one plain all-reduce of a tensor of each bucket size
  DDP used, timed one after another (the median of `train.allreduce_repeats`).
    python -m slurmddp scale examples/sleep_compute.yaml --nodes 1,2,3 --steps 60
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from slurmddp import RunContext


class Sleep(torch.autograd.Function):
    """Identity whose forward takes `seconds` and backward twice that, without using a core."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        time.sleep(seconds)
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # Backward's matmuls take about twice forward's.
        time.sleep(2 * ctx.seconds)
        return grad, None


class SleepyMLP(nn.Module):
    def __init__(self, width: int, layers: int, step_s: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        # A third of the step in forward, two thirds in backward.
        self.per_layer_s = step_s / 3 / layers

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            inputs = Sleep.apply(torch.tanh(layer(inputs)), self.per_layer_s)
        return inputs


def plain_allreduce_s(sizes: list[int], repeats: int) -> float:
    """Seconds to all-reduce one float32 tensor of each size in `sizes` (bytes), one by one."""
    tensors = [torch.ones(max(1, size // 4)) for size in sizes]
    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        for tensor in tensors:
            dist.all_reduce(tensor)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def train(ctx: RunContext) -> dict[str, Any]:
    cfg = ctx.train
    local = cfg.global_batch // ctx.world_size
    torch.manual_seed(cfg.seed)
    model = SleepyMLP(cfg.width, cfg.layers, cfg.compute_ms / 1000)
    ddp = ctx.ddp(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
    generator = torch.Generator().manual_seed(cfg.seed + ctx.rank)
    own = (ctx.run_dir / "own_steps.txt").open("a") if ctx.is_main else None
    loop = ctx.loop(cfg.steps, model=model, optimizer=optimizer)
    loss = torch.zeros(())
    for step in loop:
        inputs = torch.randn(local, cfg.width, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss = ddp(inputs).square().mean()
        loss.backward()
        optimizer.step()
        if own is not None and not loop.priming:
            own.write(f"{step} {time.time():.6f}\n")
        if step % cfg.log_every == 0:
            ctx.log(step, loss=loss)
    if own is not None:
        own.close()
    sizes = list(loop.telemetry.timer.bucket_bytes) if loop.telemetry is not None else []
    return {
        "loss": float(loss.item()),
        "bucket_bytes": sizes,
        "allreduce_s": plain_allreduce_s(sizes, cfg.allreduce_repeats) if sizes else None,
    }
