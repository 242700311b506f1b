"""What a script pays per step for being preemption-safe, in one run of gloo ranks, interleaved
finely enough to see 1 %.

    python benchmarks/stop_overhead.py [--blocks 40] [--steps 25] [--width 256] [--ranks 3]

Every rank holds three DDP copies of the same MLP (784 -> width -> width -> 10): untouched (the
baseline), and two asking `slurmddp.should_stop()` after each optimizer step over a rendezvous
store of their own that rank 0 hosts as a script rank's process does: one reading the store at
every step (K = 1, a compare-and-set round trip a step, as every script did before K), and one
reading it every K steps, K chosen by rank 0 from what it timed (job/process/stop.py). (A resumed
script's DDP starts in the bucket layout DDP itself rebuilt to, job/script/ddp_buckets.py: no
step of either differs.) They train in alternating blocks of `--steps` steps, so drift of the
machine hits all within a second. Prints each one's median step time, the mean time a step
spends in `should_stop()`, and, against the baseline, the median of the per-block ratios and
their quartiles, and the ratio of the mean steps over all rounds with a 95% interval from
resampling the rounds (target <= 1.01). The per-round ratios spread over 10% on 2 busy cores:
resolving 1% takes hundreds of rounds (--blocks 400: about 4 minutes).

3 ranks on 2 cores (the default) is the worst case: the store's thread waits for a core, and a
whole step pays about three times the reads' own time. `--ranks 2` gives each rank a core of its
own, as a GPU node gives each rank its own cores.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from resample import interval_95
from spawned import run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from slurmddp.job.process.stop import Agreement

VARIANTS = ["plain", "every step", "every K"]
"""The first is the baseline."""


def mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def block(
    model: Any, optimizer: Any, steps: int, batch: int, agreement: Agreement | None
) -> tuple[float, float]:
    """Seconds per step over `steps` steps, and of it in `should_stop()`."""
    inputs, targets = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    dist.barrier()
    asking = 0.0
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        if agreement is not None:
            asked = time.perf_counter()
            if agreement.should_stop():
                raise RuntimeError("no stop was asked")
            asking += time.perf_counter() - asked
    return (time.perf_counter() - started) / steps, asking / steps


def rank_main(rank: int, ports: tuple[int, ...], args: argparse.Namespace, out: Any) -> None:
    from torch._C._distributed_c10d import TCPStore

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank, world_size=args.ranks
    )
    # The script's store: hosted by rank 0's process, a client on every rank (as in a job); one
    # for each agreement, whose keys are the same.
    timeout = timedelta(seconds=60)
    hosts = [
        TCPStore("127.0.0.1", port, args.ranks, rank == 0, timeout, wait_for_workers=False)
        for port in ports[1:]
    ]
    clients = [TCPStore("127.0.0.1", port, args.ranks, False, timeout) for port in ports[1:]]
    every_k = Agreement(clients[1], heard=lambda: None)
    asks = {
        "plain": None,
        "every step": Agreement(clients[0], heard=lambda: None, every=1),
        "every K": every_k,
    }
    models = {name: DistributedDataParallel(mlp(args.width)) for name in VARIANTS}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in models.items()}
    for name, model in models.items():  # warm-up: DDP's bucket rebuild, the allocator
        block(model, optimizers[name], 5, args.batch, None)
    rounds = []
    for number in range(args.blocks):
        shift = number % len(VARIANTS)
        order = VARIANTS[shift:] + VARIANTS[:shift]
        rounds.append(
            {
                name: block(models[name], optimizers[name], args.steps, args.batch, asks[name])
                for name in order
            }
        )
    if rank == 0:
        out.put((rounds, every_k.every))
    dist.barrier()
    del hosts
    dist.destroy_process_group()


def means_ratio(rounds: Sequence[dict[str, tuple[float, float]]], name: str) -> float:
    """`name`'s mean step over the baseline's, over all the rounds."""
    mean = statistics.fmean
    return mean(r[name][0] for r in rounds) / mean(r[VARIANTS[0]][0] for r in rounds)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    args = parser.parse_args()
    ports = (free_port(), free_port(), free_port())
    rounds, every = run_ranks(rank_main, (ports, args), args.ranks)
    print(
        f"{os.cpu_count()} cores, {args.ranks} gloo ranks, {args.blocks} rounds of {args.steps} steps each, "
        f"width {args.width}, {args.batch} samples a rank; K chosen: {every}"
    )
    for name in VARIANTS:
        median = statistics.median(r[name][0] for r in rounds)
        line = f"{name:11s} median step {1000 * median:.3f} ms"
        if name != VARIANTS[0]:
            asking = statistics.fmean(r[name][1] for r in rounds)
            ratios = [r[name][0] / r[VARIANTS[0]][0] for r in rounds]
            line += f"; in should_stop() {1e6 * asking:.1f} us a step"
            low, mid, high = statistics.quantiles(ratios, n=4)
            line += f"; per-round ratio to {VARIANTS[0]}: median {mid:.4f} (quartiles {low:.4f}-{high:.4f})"
            low, high = interval_95(rounds, lambda chosen, name=name: means_ratio(chosen, name))
            line += f"; ratio of the means {means_ratio(rounds, name):.4f} (95%: {low:.4f}-{high:.4f})"
        print(line)
    print("target: <= 1.01")


if __name__ == "__main__":
    main()
