"""The baseline for step_time.py: the quickstart's training written by hand with plain torch.

The quickstart's model and Digits data set (imported from examples/quickstart_train.py), a
DataLoader over a torch DistributedSampler (shuffled from the same seed, drop_last, the same
per-rank batch and worker count, persistent workers as ctx.loader has them), `set_epoch` at each
epoch, the loss averaged over ranks and appended to a file by rank 0 every `log_every` steps, and
after every epoch the same validation (each sample once over all ranks, counts summed with one
all-reduce).

Run as one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set:
    python benchmarks/handwritten_ddp.py EPOCHS WORKERS OUT_DIR
Rank 0 appends its records to OUT_DIR/handwritten-metrics.jsonl as ctx.log does to metrics.jsonl:
the loss every 10 steps, and at each epoch's end (after its validation) val_acc and val_loss with
the time.time() they were written at, which step_time.py reads.

For step_time.py's `handwritten:EXTRAS` variants, a fourth argument adds pieces of what slurmddp
does, by name (comma-separated): `flags`, the loop's per-step agreement (an async all-reduce of
2 int32 started at one step boundary and waited for at the next); `seeds`, ctx.loader's per-sample
reseeding in the workers (slurmddp.job.train.data's dataset wrapper); `threadsN`,
torch.set_num_threads(N): `threads2` is what a slurmddp rank has on this machine (torch is imported
before the runtime sets OMP_NUM_THREADS=1), `threads1` undoes that inside slurmddp's runtime.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from quickstart_train import VALIDATION, Digits, make_model  # examples/ is not a package

from slurmddp import RunContext

# examples/quickstart.yaml's train: section.
GLOBAL_BATCH, HIDDEN, DROPOUT, LR, MOMENTUM, SEED, LOG_EVERY = 64, 256, 0.1, 0.05, 0.9, 0, 10


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader[tuple[torch.Tensor, torch.Tensor, int]]
) -> dict[str, float]:
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for images, labels, _ in loader:
        logits = model(images)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum").item()
        correct += int((logits.argmax(1) == labels).sum())
        total += len(labels)
    model.train()
    counts = torch.tensor([correct, total, loss_sum], dtype=torch.float64)
    dist.all_reduce(counts)
    correct_all, total_all, loss_all = counts.tolist()
    return {"val_acc": correct_all / total_all, "val_loss": loss_all / total_all}


def run(epochs: int, workers: int, out: Path, extras: frozenset[str] = frozenset()) -> dict[str, object]:
    """The training, in an initialised process group."""
    threads = {extra for extra in extras if extra.startswith("threads")}
    unknown = extras - {"flags", "seeds"} - threads
    if unknown:
        raise SystemExit(f"unknown extras {sorted(unknown)}")
    for extra in threads:
        torch.set_num_threads(int(extra.removeprefix("threads")))
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // world
    train_set: Dataset[tuple[torch.Tensor, torch.Tensor, int]] = Digits(0, -VALIDATION, torch.float32)
    if "seeds" in extras and workers > 0:
        from slurmddp.job.train.data import _PerSampleSeeded

        train_set = _PerSampleSeeded(train_set, SEED)
    val_set = Digits(-VALIDATION, None, torch.float32)
    model = DistributedDataParallel(make_model(HIDDEN, DROPOUT, SEED))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sampler = DistributedSampler(
        train_set,  # type: ignore[arg-type]
        num_replicas=world,
        rank=rank,
        shuffle=True,
        seed=SEED,
        drop_last=True,
    )
    train_loader = DataLoader(
        train_set,
        batch_size=per_rank,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world)), batch_size=4 * per_rank)
    metrics = out / "handwritten-metrics.jsonl"
    flags, pending = torch.zeros(2, dtype=torch.int32), None
    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for images, labels, _ in train_loader:
            if "flags" in extras:
                if pending is not None:
                    pending.wait()
                    int(flags[0].item())
                pending = dist.all_reduce(flags, op=dist.ReduceOp.MAX, async_op=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            if step % LOG_EVERY == 0:
                mean = loss.detach().double()
                dist.all_reduce(mean)
                if rank == 0:
                    with metrics.open("a") as handle:
                        record = {"step": step, "time": time.time(), "loss": mean.item() / world}
                        handle.write(json.dumps(record) + "\n")
            step += 1
        scores = evaluate(model, val_loader)
        if rank == 0:
            with metrics.open("a") as handle:
                handle.write(json.dumps({"step": step - 1, "time": time.time(), **scores}) + "\n")
            print(f"epoch {epoch} step {step - 1} " + " ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    if pending is not None:
        pending.wait()
    return {"steps": step, "epochs": epochs}


def train(ctx: RunContext) -> dict[str, object]:
    """The same loop as a slurmddp entrypoint (plain DDP and DataLoader inside slurmddp's runtime),
    to tell the runtime's share of a difference from ctx.ddp / ctx.loader / ctx.loop's:
    entrypoint=benchmarks/handwritten_ddp.py:train train.epochs=N train.workers=W [train.extras=a+b]."""
    extras = frozenset(filter(None, str(ctx.train.get("extras", "")).replace("+", ",").split(",")))
    return run(int(ctx.train.epochs), int(ctx.train.workers), ctx.run_dir, extras)


def main() -> None:
    epochs, workers, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    extras = frozenset(filter(None, (sys.argv[4] if len(sys.argv) > 4 else "").split(",")))
    dist.init_process_group("gloo")
    run(epochs, workers, out, extras)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
