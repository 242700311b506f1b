"""HF transformers' Trainer, written as its docs teach, made preemption-safe by one line.

    python -m slurmddp submit examples/frameworks/transformers.yaml --wait

A tiny GPT-2 (from a config, nothing downloaded, dropout on) learns a seeded synthetic corpus. The
one line is `callbacks=[SlurmddpCallback()]`: on a preemption or the time limit every rank saves
Trainer's own `checkpoint-N` at the same optimizer step and the job is requeued; the next attempt
runs this script again and `trainer.train()` resumes from the newest complete checkpoint.

Rank 0 writes the final parameters' SHA-256 to RUN_DIR/final.json (`--final`). The flags the
tests use: `--integration none|callback|auto` (leave the integration out, add the callback, or call
`slurmddp.integrations.transformers.auto()` and leave the script unchanged), `--record-steps DIR`
(each rank appends every optimizer step it makes to DIR/rank-R.txt), `--find-unused false` (DDP then
rebuilds its gradient buckets after the first backward; slurmddp's `ddp.resume_buckets` builds a
resumed attempt's DDP in the recorded layout, so the resume stays exact), `--save-steps N`,
`--step-sleep S`, `--report-to tensorboard` (one TensorBoard run, in RUN_DIR/tensorboard, across
attempts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

RUN_DIR = os.environ.get("SLURMDDP_RUN_DIR", ".")


class SyntheticText(Dataset[dict[str, torch.Tensor]]):
    """Token sequences with a pattern to learn: each token is the previous one plus a per-sequence
    stride (mod the vocabulary), from a seeded generator."""

    def __init__(self, size: int, length: int, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (size, 1), generator=gen)
        stride = torch.randint(1, 7, (size, 1), generator=gen)
        self.tokens = (start + stride * torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def digest(model: torch.nn.Module) -> str:
    sha = hashlib.sha256()
    for name, param in sorted(model.state_dict().items()):
        sha.update(name.encode())
        sha.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def record_steps(trainer: Trainer, folder: Path) -> None:
    """Append every optimizer step this rank makes (the step's number, counted from 1, and the
    time it ended) to folder/rank-R.txt: a step made twice, or never, shows there."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank-{trainer.args.process_index}.txt"

    def after_step(optimizer: torch.optim.Optimizer, *_: object) -> None:
        with path.open("a") as handle:
            handle.write(f"{trainer.state.global_step + 1} {time.time()}\n")

    register_optimizer_step_post_hook(after_step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default=os.path.join(RUN_DIR, "trainer"))
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--save-steps", type=int, default=0, help="periodic checkpoints (0: none)")
    parser.add_argument("--integration", choices=("callback", "auto", "none"), default="callback")
    parser.add_argument("--record-steps", type=Path, default=None)
    parser.add_argument("--final", type=Path, default=Path(RUN_DIR) / "final.json")
    parser.add_argument(
        "--find-unused",
        choices=("default", "true", "false"),
        default="default",
        help="ddp_find_unused_parameters (default: Trainer's choice, True for this model)",
    )
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    parser.add_argument("--report-to", default="none", help="TrainingArguments.report_to, e.g. tensorboard")
    args = parser.parse_args()

    if args.integration == "auto":
        # What slurmddp's zero-change mode does before the script runs; the script stays as it is.
        from slurmddp.integrations import transformers as slurmddp_transformers

        slurmddp_transformers.auto()

    set_seed(0)
    config = GPT2Config(
        vocab_size=61,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=args.accumulate,
        learning_rate=3e-3,
        warmup_steps=10,
        weight_decay=0.01,
        logging_steps=20,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        save_total_limit=2,
        report_to=args.report_to,
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        ddp_find_unused_parameters=None if args.find_unused == "default" else args.find_unused == "true",
    )
    callbacks = []
    if args.integration == "callback":
        from slurmddp.integrations.transformers import SlurmddpCallback

        # The one line slurmddp asks for:
        callbacks.append(SlurmddpCallback())
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=SyntheticText(size=300, length=16, vocab=61, seed=1),
        callbacks=callbacks,
    )
    if args.record_steps is not None:
        record_steps(trainer, args.record_steps)
    if args.step_sleep:
        import time

        from transformers import TrainerCallback

        class Slow(TrainerCallback):
            def on_step_end(self, *_: object, **__: object) -> None:
                time.sleep(args.step_sleep)

        trainer.add_callback(Slow())

    # As transformers' examples resume: from the last checkpoint in output_dir, if there is one.
    last_checkpoint = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last_checkpoint)

    # What a user does after training: none of it may run on an attempt that stopped for a requeue.
    trainer.save_model()
    digests: list[object] = [None] * trainer.args.world_size
    if torch.distributed.is_initialized():
        torch.distributed.all_gather_object(digests, digest(trainer.model))
    else:
        digests = [digest(trainer.model)]
    if trainer.is_world_process_zero():
        args.final.parent.mkdir(parents=True, exist_ok=True)
        with (args.final.parent / "after_train.txt").open("a") as handle:
            handle.write(f"{trainer.state.global_step}\n")
        torch.save(trainer.model.state_dict(), args.final.with_suffix(".pt"))
        result = {"sha256": digests[0], "ranks": digests, "global_step": trainer.state.global_step}
        args.final.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
