"""Steady-state step time of the quickstart under slurmddp vs the same training written by hand.

    python benchmarks/step_time.py [--rounds 5] [--epochs 8] [--workers 2] [--variants A,B,...]

Each variant runs 4 gloo ranks on this machine, the first variant is the baseline, and every round
runs all variants one after another (A, B, A, B, ...), so drift of a shared machine hits each.
A run's step time is read the same way for every variant: rank 0's record written at the end of
each epoch (after validation), (time at the last epoch's end - time at the first's) / steps between;
the first epoch (start-up, first iterator, DDP's first step) is left out, validation and each
epoch's new loader iterator are in. Prints each run (with the 1-minute load average before it),
the ratio to the baseline per round, the medians and the median ratio (target: <= 1.02).

Variants:
  handwritten[:EXTRAS]   benchmarks/handwritten_ddp.py, 4 processes with RANK/WORLD_SIZE/MASTER_*
                         and OMP_NUM_THREADS=1 as torchrun gives them; EXTRAS adds pieces of
                         slurmddp to it (flags, seeds, threadsN joined by +, e.g. flags+seeds:
                         see handwritten_ddp.py)
  slurmddp               python -m slurmddp submit examples/quickstart.yaml executor=local
  slurmddp-1thread       the same through benchmarks/timed_train.py with torch.set_num_threads(1)
  slurmddp-fixed         ... and ctx.loader's per-sample seeding made cheap (see timed_train.py)
  runtime[:EXTRAS]       the hand-written loop as a slurmddp entrypoint: slurmddp's runtime without
                         ctx.ddp / ctx.loader / ctx.loop
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
TIMEOUT_S = 1800


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def steady_ms(metrics: Path) -> float:
    """ms per step between the first and the last epoch-end record of a metrics file."""
    ends = [json.loads(line) for line in metrics.read_text().splitlines() if "val_acc" in line]
    if len(ends) < 2:
        raise SystemExit(f"{metrics}: fewer than two epoch ends")
    first, last = ends[0], ends[-1]
    return 1000 * (last["time"] - first["time"]) / (last["step"] - first["step"])


def handwritten(epochs: int, workers: int, out: Path, extras: str) -> Path:
    port = free_port()
    procs = []
    for rank in range(4):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        command = [sys.executable, str(ROOT / "benchmarks" / "handwritten_ddp.py")]
        with (out / f"rank-{rank}.err").open("w") as stderr:
            procs.append(
                subprocess.Popen(
                    [*command, str(epochs), str(workers), str(out), extras],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                )
            )
    codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    if any(codes):
        said = "".join((out / f"rank-{rank}.err").read_text()[-2000:] for rank in range(4))
        raise SystemExit(f"the hand-written baseline failed (exit statuses {codes}):\n{said}")
    return out / "handwritten-metrics.jsonl"


def slurmddp(out: Path, *overrides: str) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(QUICKSTART),
            "executor=local",
            f"output_dir={out}",
            *overrides,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=TIMEOUT_S,
    )
    (run,) = out.glob("*/*/manifest.json")
    return run.parent


def run_variant(variant: str, epochs: int, workers: int, out: Path) -> float:
    name, _, extras = variant.partition(":")
    train = [f"train.epochs={epochs}", f"train.workers={workers}"]
    if name == "handwritten":
        return steady_ms(handwritten(epochs, workers, out, extras.replace("+", ",")))
    if name == "slurmddp":
        return steady_ms(slurmddp(out, *train) / "metrics.jsonl")
    if name in ("slurmddp-1thread", "slurmddp-fixed"):
        entry = f"entrypoint={ROOT / 'benchmarks' / 'timed_train.py'}:train"
        fixes = [
            "train.timed_threads=1",
            *(["train.timed_cheap_seeds=true"] if name == "slurmddp-fixed" else []),
        ]
        run = slurmddp(out, *train, entry, "train.timed=quickstart_train:train", *fixes)
        return steady_ms(run / "metrics.jsonl")
    if name == "runtime":
        entry = f"entrypoint={ROOT / 'benchmarks' / 'handwritten_ddp.py'}:train"
        run = slurmddp(out, *train, entry, *([f"train.extras={extras}"] if extras else []))
        return steady_ms(run / "handwritten-metrics.jsonl")
    raise SystemExit(f"unknown variant {variant!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--variants", default="handwritten,slurmddp", help="comma-separated; first: baseline")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    variants = args.variants.split(",")
    base = variants[0]
    times: dict[str, list[float]] = {v: [] for v in variants}
    ratios: dict[str, list[float]] = {v: [] for v in variants[1:]}
    runs = []
    print(f"{os.cpu_count()} cores, {args.epochs} epochs, {args.workers} workers per rank, 4 ranks")
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            parts = []
            for variant in variants:
                out = Path(tmp) / f"{round_}-{variant.replace(':', '-')}"
                out.mkdir()
                load = os.getloadavg()[0]
                started = time.monotonic()
                ms = run_variant(variant, args.epochs, args.workers, out)
                wall = time.monotonic() - started
                times[variant].append(ms)
                runs.append({"round": round_, "variant": variant, "ms": ms, "load": load, "wall_s": wall})
                shown = f"{variant} {ms:.1f} ms (load {load:.1f})"
                if variant != base:
                    ratios[variant].append(ms / times[base][-1])
                    shown += f" x{ratios[variant][-1]:.3f}"
                parts.append(shown)
            print(f"round {round_}: " + ", ".join(parts), flush=True)
    print("median ms/step: " + ", ".join(f"{v} {statistics.median(t):.1f}" for v, t in times.items()))
    for variant, values in ratios.items():
        print(
            f"{variant} / {base}: median of ratios {statistics.median(values):.3f}, ratio of medians "
            f"{statistics.median(times[variant]) / statistics.median(times[base]):.3f} (target <= 1.02)"
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
