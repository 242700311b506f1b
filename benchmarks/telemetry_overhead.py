"""Telemetry's cost per step, in one run of 3 gloo ranks, interleaved finely enough to see 1 %.

    python benchmarks/telemetry_overhead.py [--blocks 40] [--steps 25] [--width 256]

benchmarks/telemetry_cost.py times whole quickstart runs; on 2 shared cores their step times swing
by tens of percent from run to run, which hides a 1 % cost. Here every rank holds two DDP copies of
the same MLP (the quickstart's shape: 784 -> width -> width -> 10), three of them: untouched (the
baseline); with a Python all-reduce hook that only does what DDP does (what any Python hook costs,
the floor of a hook-based measurement); and as `ctx.loop` runs it with telemetry (the timed hook,
`Telemetry.step` and its clock reads every step). They train in rotating blocks of `--steps` steps,
so drift of the machine hits each within a second. Prints each one's median step time, and for
each against the baseline the median of the per-block ratios (target for telemetry: <= 1.01) and
their quartiles.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from spawned import run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from slurmddp.experiment import schema
from slurmddp.job.train.telemetry import Telemetry

RANKS = 3
VARIANTS = ["plain", "hook", "telemetry"]
"""The first is the baseline."""


def mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def block(model: Any, optimizer: Any, steps: int, batch: int, telemetry: Telemetry | None) -> float:
    """Seconds per step over `steps` steps."""
    inputs, targets = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    dist.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        began = time.perf_counter()
        fetched = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        if telemetry is not None:
            telemetry.step(fetched - began, time.perf_counter() - began)
    return (time.perf_counter() - started) / steps


def plain_hook(group: Any, bucket: Any) -> Any:
    buffer = bucket.buffer().mul_(1.0 / group.size())
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])


def rank_main(rank: int, port: int, args: argparse.Namespace, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    models = {name: DistributedDataParallel(mlp(args.width)) for name in VARIANTS}
    models["hook"].register_comm_hook(
        models["hook"].process_group, lambda group, bucket: plain_hook(group, bucket)
    )
    telemetry = Telemetry(
        schema.Telemetry(warmup_steps=0, every_s=1e9),
        rank=rank,
        world_size=RANKS,
        device=torch.device("cpu"),
        samples_per_step=args.batch * RANKS,
        backend="gloo",
        transport="tcp",
        log=lambda step, **values: None,
    )
    telemetry.start([models["telemetry"]])
    measured = {name: telemetry if name == "telemetry" else None for name in VARIANTS}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in models.items()}
    for name, model in models.items():  # warm-up: DDP's bucket rebuild, the allocator
        block(model, optimizers[name], 5, args.batch, None)
    rounds = []
    for number in range(args.blocks):
        shift = number % len(VARIANTS)
        order = VARIANTS[shift:] + VARIANTS[:shift]
        rounds.append(
            {
                name: block(models[name], optimizers[name], args.steps, args.batch, measured[name])
                for name in order
            }
        )
    if rank == 0:
        out.put(rounds)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rounds = run_ranks(rank_main, (port, args), RANKS)
    print(
        f"{os.cpu_count()} cores, {RANKS} gloo ranks, {args.blocks} rounds of {args.steps} steps each, "
        f"width {args.width}, {args.batch} samples a rank"
    )
    for name in VARIANTS:
        median = statistics.median(r[name] for r in rounds)
        line = f"{name:9s} median step {1000 * median:.3f} ms"
        if name != VARIANTS[0]:
            ratios = [r[name] / r[VARIANTS[0]] for r in rounds]
            low, mid, high = statistics.quantiles(ratios, n=4)
            line += f"; per-round ratio to {VARIANTS[0]}: median {mid:.4f} (quartiles {low:.4f}-{high:.4f})"
        print(line)
    print("target: telemetry <= 1.01")


if __name__ == "__main__":
    main()
