"""A training script in HF accelerate's docs idiom (Accelerator, prepare, accelerator.backward,
accumulate), preemption-safe under slurmddp with `slurmddp.integrations.accelerate.Resumable`.

    python -m slurmddp submit examples/frameworks/accelerate.yaml
    accelerate launch examples/frameworks/accelerate_train.py       # the same script, no slurmddp

Flags for the tests: --epochs, --accumulate, --no-helper (the same loop without the helper: it
neither saves nor resumes), --record-steps (each rank appends every optimizer step it makes to
RUN_DIR/steps/rank-R.txt), --step-sleep (a slower step, for a test to stop it in time). Rank 0
writes the final parameters' sha256 to RUN_DIR/final.json and the parameters themselves to
RUN_DIR/final.pt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

RUN_DIR = Path(os.environ.get("SLURMDDP_RUN_DIR", "."))


def synthetic(samples: int, features: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, features, generator=generator)
    y = (x @ torch.randn(features, 1, generator=generator)).tanh() + 0.1 * torch.randn(
        samples, 1, generator=generator
    )
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--no-helper", action="store_true", help="leave the slurmddp helper out")
    parser.add_argument(
        "--record-steps", action="store_true", help="append each step to RUN_DIR/steps/rank-R.txt"
    )
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    args = parser.parse_args()

    set_seed(0)
    accelerator = Accelerator(
        # Without a GPU accelerate runs every rank as a lone process unless told the CPU is the
        # device (what `accelerate launch --cpu` sets as ACCELERATE_USE_CPU).
        cpu=not torch.cuda.is_available(),
        gradient_accumulation_steps=args.accumulate,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(64, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.9)
    train_dataloader = DataLoader(synthetic(args.samples, 16), batch_size=args.batch_size, shuffle=True)
    model, optimizer, train_dataloader, scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, scheduler
    )

    run = None
    if not args.no_helper:
        from slurmddp.integrations.accelerate import Resumable

        run = Resumable(accelerator, train_dataloader)
    completed_steps = run.global_step if run else 0
    steps_file = None
    if args.record_steps:
        (RUN_DIR / "steps").mkdir(exist_ok=True)
        steps_file = open(RUN_DIR / "steps" / f"rank-{accelerator.process_index}.txt", "a")  # noqa: SIM115

    started = time.perf_counter()
    for epoch in run.epochs(args.epochs) if run else range(args.epochs):
        model.train()
        for batch in run.batches() if run else train_dataloader:
            inputs, targets = batch
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                if steps_file:
                    steps_file.write(f"{completed_steps} {epoch} {time.time()}\n")
                    steps_file.flush()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
            if run:
                run.after_step()
    elapsed = time.perf_counter() - started

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        params = [p.detach().cpu() for p in accelerator.unwrap_model(model).parameters()]
        digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
        torch.save(params, RUN_DIR / "final.pt")
        result = {"param_sha256": digest, "steps": completed_steps, "seconds": elapsed, "loss": loss.item()}
        (RUN_DIR / "final.json").write_text(json.dumps(result) + "\n")
    accelerator.end_training()


if __name__ == "__main__":
    main()
