"""A LightningModule script as Lightning's docs write one, made preemption-safe by one line:
`callbacks=[SlurmddpCallback()]`. Run it with
`python -m slurmddp submit examples/frameworks/lightning.yaml`.

A tiny MLP with dropout on seeded synthetic data, a DataLoader with shuffle=True (Lightning puts a
DistributedSampler in), DDP on CPU. Each rank appends every optimizer step it makes, and its time, to
RUN_DIR/steps/rank-R.txt; rank 0 writes the final parameters' sha256 to RUN_DIR/final.json.
Flags for the tests: `--steps`, `--sleep` (seconds added to each step), `--signal-at N ...` (each
rank raises USR2 in itself after step N: the ranks stop after step N + 1), `--workers`,
`--accumulate`, `--no-callback` (leave the line out), `--auto` (leave it out and call
`slurmddp.integrations.lightning.auto()` instead).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

RUN_DIR = Path(os.environ.get("SLURMDDP_RUN_DIR", "."))


class Model(pl.LightningModule):
    def __init__(self, lr: float, sleep: float = 0.0, signal_at: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.lr = lr
        self.sleep = sleep
        self.signal_at = signal_at
        self.net = nn.Sequential(
            nn.Linear(16, 32),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(32, 32),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(32, 1),
        )
        self.steps = RUN_DIR / "steps" / f"rank-{int(os.environ.get('RANK', '0'))}.txt"

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.sleep)  # a step as long as a real one, so that a stop lands mid-run
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)  # TensorBoard, under RUN_DIR/lightning_logs/version_0 in every attempt
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # Lightning counts the step in global_step once this call returns: this is step global_step + 1.
        step = self.trainer.global_step + 1
        self.steps.parent.mkdir(parents=True, exist_ok=True)
        with open(self.steps, "a") as handle:
            handle.write(f"{step} {time.time()}\n")
        if step in self.signal_at:
            # As if Slurm's USR2 came right now: every rank stops after the next step.
            signal.raise_signal(signal.SIGUSR2)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 20, 0.9)}


def digest(model: nn.Module) -> str:
    sha = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        sha.update(name.encode())
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds added to each step")
    parser.add_argument("--signal-at", type=int, nargs="*", default=[], help="raise USR2 after these steps")
    parser.add_argument("--no-callback", action="store_true")
    parser.add_argument("--auto", action="store_true")
    args = parser.parse_args()

    pl.seed_everything(0)
    x = torch.randn(args.samples, 16, generator=torch.Generator().manual_seed(1))
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
    )

    callbacks: list[pl.Callback] = []
    if args.auto:
        from slurmddp.integrations import lightning as slurmddp_lightning

        slurmddp_lightning.auto()
    elif not args.no_callback:
        from slurmddp.integrations.lightning import SlurmddpCallback

        callbacks.append(SlurmddpCallback())  # the one line
    # Under torchrun (or slurmddp) every process is one device: devices x num_nodes = WORLD_SIZE.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=local,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // local,
        strategy="ddp",
        accumulate_grad_batches=args.accumulate,
        callbacks=callbacks,
        default_root_dir=str(RUN_DIR),
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    model = Model(args.lr, args.sleep, tuple(args.signal_at))
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.is_global_zero:
        (RUN_DIR / "final.json").write_text(
            json.dumps({"sha256": digest(model), "global_step": trainer.global_step})
        )


if __name__ == "__main__":
    main()
