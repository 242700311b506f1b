"""Submit-to-first-step on the lab cluster: slurmddp vs a bare sbatch+srun that only imports torch
and initialises the gloo process group (2 nodes x 2 ranks each).

Needs a running Slurm (SLURM_CONF set, e.g. from tests/slurm_lab/up). Alternates the two, prints
each run and the ratio of medians (target: <= 1.3).
Usage: python benchmarks/startup.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BARE = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=5
#SBATCH --output={out}/bare-%j.out
srun bash -c 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1) \\
  MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000)) RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS \\
  OMP_NUM_THREADS=1 exec {python} -c "
import time, torch, torch.distributed as dist
dist.init_process_group(\\"gloo\\")
print(\\"READY\\", dist.get_rank(), time.time(), flush=True)
dist.destroy_process_group()
"'
"""


def wait_gone(job_id: str) -> None:
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        time.sleep(0.2)


def bare(out: Path) -> float:
    script = out / "bare.sh"
    script.write_text(BARE.format(out=out, python=sys.executable))
    started = time.time()
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True)
    job_id = job.stdout.strip()
    wait_gone(job_id)
    lines = [line.split() for line in (out / f"bare-{job_id}.out").read_text().splitlines()]
    ready = [float(w[2]) for w in lines if w[:1] == ["READY"]]
    if len(ready) != 4:
        raise SystemExit(f"bare job {job_id} did not start 4 ranks")
    return min(ready) - started


def ours(out: Path) -> tuple[float, float]:
    """(submit -> rank 0's first step, submit -> rank 0's process group ready)."""
    started = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(ROOT / "examples" / "synthetic.yaml"),
            "train.steps=5",
            f"output_dir={out}",
            "--wait",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"slurmddp submit failed:\n{proc.stdout}{proc.stderr}")
    result = sorted(out.glob("synthetic/*/result.json"))[-1]
    data = json.loads(result.read_text())
    return float(data["result"]["first_step_at"]) - started, float(data["started_at"]) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base, first, ready = [], [], []
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        for round_ in range(args.rounds):
            base.append(bare(Path(tmp)))
            step, pg = ours(Path(tmp))
            first.append(step)
            ready.append(pg)
            print(
                f"round {round_ + 1}: bare sbatch+srun {base[-1]:.2f} s; slurmddp first step {step:.2f} s, "
                f"process group ready {pg:.2f} s"
            )
    bare_s = statistics.median(base)
    print(f"median: bare {bare_s:.2f} s; slurmddp first step {statistics.median(first):.2f} s, ", end="")
    print(f"process group ready {statistics.median(ready):.2f} s")
    print(f"ratio first step / bare: {statistics.median(first) / bare_s:.3f} (target <= 1.3)")
    print(
        f"ratio process group ready / bare (the same point as the bare script's): "
        f"{statistics.median(ready) / bare_s:.3f}"
    )


if __name__ == "__main__":
    main()
