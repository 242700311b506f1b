"""Submit-to-first-step on the lab cluster: slurmddp against two bare sbatch+srun jobs (2 nodes x
2 ranks each), one that only imports torch and initialises the gloo process group, and one that
also does what the example's training function does before its first step, with the same imports:
the target compares with that one ("with the same imports").

--example synthetic (the default): the synthetic function's model, DDP and SGD optimizer (whose
construction imports torch._dynamo); rank 0's first step from the function's own result.
--example quickstart: the quickstart as shipped (examples/quickstart.yaml): its data sets read from
the CSV, model, DDP, SGD, a sharded loader with 2 workers a rank, and its first step (the bare job
ends its first optimizer step, as slurmddp's does); rank 0's first step from the attempt's record.

Needs a running Slurm (SLURM_CONF set, e.g. from tests/slurm_lab/up). Alternates the three, prints
each run and the ratios of medians (target: <= 1.3 against the bare job with the same setup), and
that one's ratio of the means with a 95% interval from resampling the rounds.
Usage: python benchmarks/startup.py [--rounds 3] [--example synthetic|quickstart]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from resample import interval_95

ROOT = Path(__file__).resolve().parents[1]
BARE = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=5
#SBATCH --output={out}/bare-%j.out
srun bash -c 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1) \\
  MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000)) RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS \\
  OMP_NUM_THREADS=1 PYTHONPATH={examples} exec {python} -c "{code}"'
"""
READY = """
import time, torch, torch.distributed as dist
dist.init_process_group(\\"gloo\\")
print(\\"READY\\", dist.get_rank(), time.time(), flush=True)
dist.destroy_process_group()
"""
SETUP = """
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from synthetic_train import make_model
dist.init_process_group(\\"gloo\\")
model = make_model(512, 10, 0)
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
print(\\"READY\\", dist.get_rank(), time.time(), flush=True)
dist.destroy_process_group()
"""
"""What the synthetic example's function does before its first step (examples/synthetic.yaml's
width, classes, seed, lr and momentum), without slurmddp."""
QUICKSTART = """
import time, torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from quickstart_train import VALIDATION, Digits, make_model
dist.init_process_group(\\"gloo\\")
train_set = Digits(0, -VALIDATION, torch.float32)
val_set = Digits(-VALIDATION, None, torch.float32)
ddp = DistributedDataParallel(make_model(256, 0.1, 0))
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
sampler = DistributedSampler(train_set, seed=0)
loader = DataLoader(train_set, batch_size=16, sampler=sampler, num_workers=2)
images, labels, _ = next(iter(loader))
optimizer.zero_grad(set_to_none=True)
F.cross_entropy(ddp(images), labels).backward()
optimizer.step()
print(\\"READY\\", dist.get_rank(), time.time(), flush=True)
dist.destroy_process_group()
"""
"""What the quickstart's function does up to the end of its first step (examples/quickstart.yaml as
shipped: 2 loader workers a rank, 64 samples a step over 4 ranks), without slurmddp."""


def wait_gone(job_id: str) -> None:
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        time.sleep(0.2)


def bare(out: Path, code: str) -> float:
    script = out / "bare.sh"
    script.write_text(BARE.format(out=out, python=sys.executable, examples=ROOT / "examples", code=code))
    started = time.time()
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job.stdout.strip()
    wait_gone(job_id)
    lines = [line.split() for line in (out / f"bare-{job_id}.out").read_text().splitlines()]
    ready = [float(w[2]) for w in lines if w[:1] == ["READY"]]
    if len(ready) != 4:
        raise SystemExit(f"bare job {job_id} did not start 4 ranks")
    return min(ready) - started


SHORT = {"synthetic": "train.steps=5", "quickstart": "train.epochs=1"}


def ours(out: Path, example: str) -> tuple[float, float]:
    """(submit -> rank 0's first step, submit -> rank 0's process group ready)."""
    started = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(ROOT / "examples" / f"{example}.yaml"),
            SHORT[example],
            f"output_dir={out}",
            "--wait",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"slurmddp submit failed:\n{proc.stdout}{proc.stderr}")
    run = sorted(out.glob(f"{example}/*/result.json"))[-1].parent
    data = json.loads((run / "result.json").read_text())
    if example == "synthetic":
        first = float(data["result"]["first_step_at"])
    else:
        (end,) = [
            r
            for r in map(json.loads, (run / "attempts.jsonl").read_text().splitlines())
            if r["event"] == "end"
        ]
        first = float(end["phases"]["first_step_at"])
    return first - started, float(data["started_at"]) - started


def means_ratio(pairs: Sequence[tuple[float, float]]) -> float:
    """slurmddp's mean over the bare job's with the same setup, over paired rounds."""
    return statistics.fmean(ours for ours, _ in pairs) / statistics.fmean(bare for _, bare in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--example", choices=sorted(SHORT), default="synthetic")
    args = parser.parse_args()
    same_setup = QUICKSTART if args.example == "quickstart" else SETUP
    base, setup, first, ready = [], [], [], []
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        for round_ in range(args.rounds):
            base.append(bare(Path(tmp), READY))
            setup.append(bare(Path(tmp), same_setup))
            step, pg = ours(Path(tmp), args.example)
            first.append(step)
            ready.append(pg)
            print(
                f"round {round_ + 1}: bare sbatch+srun {base[-1]:.2f} s, with the same setup "
                f"{setup[-1]:.2f} s; slurmddp first step {step:.2f} s, process group ready {pg:.2f} s"
            )
    bare_s, setup_s = statistics.median(base), statistics.median(setup)
    first_s, ready_s = statistics.median(first), statistics.median(ready)
    print(f"median: bare {bare_s:.2f} s, with the same setup {setup_s:.2f} s; ", end="")
    print(f"slurmddp first step {first_s:.2f} s, process group ready {ready_s:.2f} s")
    print(f"ratio first step / bare with the same setup: {first_s / setup_s:.3f} (target <= 1.3)")
    pairs = list(zip(first, setup, strict=True))
    low, high = interval_95(pairs, means_ratio)
    print(f"ratio of the means: {means_ratio(pairs):.3f} (95%: {low:.3f}-{high:.3f})")
    print(f"ratio first step / bare: {first_s / bare_s:.3f}")
    print(f"ratio process group ready / bare (the same point as the bare script's): {ready_s / bare_s:.3f}")


if __name__ == "__main__":
    main()
