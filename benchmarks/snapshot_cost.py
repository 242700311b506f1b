"""What in-memory snapshots cost the training: the quickstart as shipped (2 nodes x 2 ranks, 2
loader workers a rank) on the lab cluster, through `python -m slurmddp submit`, with snapshots off
(checkpoint.snapshot_every_steps=0, the baseline), at the interval slurmddp chooses (null, the
default), and every --every steps, alternating A B C C B A for --rounds rounds.

Per run: the steady step time, from rank 0's phases in the end record (its first step's end to its
last recorded step, over the steps between; checkpoints on disk are off, so none is in it), and
the snapshot folder's bytes on each node, read while the run goes (one snapshot a node; the
writing rank holds one more copy in its CPU buffers). Prints each setting's median step time and
its ratio to the baseline's, run side by side on the same machine.

On the lab (the lab's export line in the environment: `eval "$(tests/slurm_lab/up)"`):

    python benchmarks/snapshot_cost.py [--rounds 3] [--epochs 40] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from labjobs import ROOT, ends, gone, interval_said, job_id, submit, wait_for

QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def node_bytes(job: str) -> dict[str, int]:
    """Bytes in each node's snapshot folder of `job`'s first allocation now."""
    sizes: dict[str, int] = {}
    for folder in (Path("/dev/shm") / f"slurmddp-{os.getuid()}").glob(f"{job}.0-*"):
        for node in folder.iterdir():
            sizes[node.name] = sum(f.stat().st_size for f in node.iterdir() if f.is_file())
    return sizes


def one(out: Path, epochs: int, setting: str) -> tuple[float, int, str]:
    """Seconds a step, the most bytes a node's folder held, and what rank 0 said of the interval."""
    run = submit(out, f"train.epochs={epochs}", setting, experiment=QUICKSTART)
    job = job_id(run)
    most = 0
    while not gone(job):
        most = max([most, *node_bytes(job).values()])
        time.sleep(0.2)
    (end,) = wait_for("the end record", lambda: ends(run), timeout=60)
    if end["reason"] != "completed":
        raise SystemExit(f"{run}: ended {end['reason']}")
    phases = end["phases"]
    steps = end["step"] - phases["started_step"] - 1
    per_step = (phases["last_step_at"] - phases["first_step_at"]) / steps
    said = interval_said(run)
    return per_step, most, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    settings = {
        "off": "checkpoint.snapshot_every_steps=0",
        "chosen": "checkpoint.snapshot_every_steps=null",
        f"every {args.every}": f"checkpoint.snapshot_every_steps={args.every}",
    }
    names = list(settings)
    times: dict[str, list[float]] = {name: [] for name in names}
    sizes: dict[str, list[int]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else reversed(names):
                per_step, most, said = one(Path(tmp), args.epochs, settings[name])
                times[name].append(per_step)
                sizes[name].append(most)
                print(
                    f"round {round_ + 1} {name:9} {1000 * per_step:.2f} ms a step, a node's snapshot "
                    f"folder at most {most} bytes; {said or 'no snapshot taken'}",
                    flush=True,
                )
    base = statistics.median(times["off"])
    for name in names:
        median = statistics.median(times[name])
        print(
            f"{name:9} median {1000 * median:.2f} ms a step, ratio to off {median / base:.3f} "
            f"(rounds: {', '.join(f'{t / b:.3f}' for t, b in zip(times[name], times['off'], strict=True))}); "
            f"a node's folder at most {max(sizes[name])} bytes"
        )
    print(json.dumps({name: statistics.median(times[name]) / base for name in names}))


if __name__ == "__main__":
    main()
