"""Wall time of `scale` for 3 sizes against submitting and waiting for the same jobs by hand.

    python benchmarks/scale_wall.py [--rounds 2] [--steps 20]

Both sides run examples/sleep_compute.yaml on the lab at 1, 2 and 3 nodes (the 1-node run is the
study's baseline) with the same steps and settings, one job at a time:
  by hand:  `python -m slurmddp submit ... resources.nodes=N --wait` three times, one after another,
            as a user measuring by hand would (then reads three result.json files themselves);
  scale:    `python -m slurmddp scale ... --nodes 1,2,3`, which also prints the table, verdicts,
            CSV and PNG.
Rounds alternate the order (hand, scale, scale, hand, ...), so drift of the shared machine hits each.
Prints each run's seconds and the ratio scale / by hand per round and the median (target: ~1, the
study adds its report, not waiting). Needs a running Slurm (SLURM_CONF set, tests/slurm_lab/up).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "examples" / "sleep_compute.yaml"
SIZES = (1, 2, 3)


def by_hand(out: Path, steps: int, settings: list[str]) -> float:
    started = time.perf_counter()
    for nodes in SIZES:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "slurmddp",
                "submit",
                str(WORKLOAD),
                f"resources.nodes={nodes}",
                f"train.global_batch={8 * nodes}",
                f"telemetry.max_steps={steps}",
                *settings,
                f"output_dir={out}",
                "--wait",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return time.perf_counter() - started


def study(out: Path, steps: int, settings: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "scale",
            str(WORKLOAD),
            "--nodes",
            ",".join(map(str, SIZES)),
            "--steps",
            str(steps),
            *settings,
            f"output_dir={out}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        raise SystemExit("no sbatch on PATH: start the lab (tests/slurm_lab/up) and set SLURM_CONF")
    settings = ["profile=lab"]
    ratios = []
    with tempfile.TemporaryDirectory(prefix="scale-wall-") as tmp:
        for number in range(args.rounds):
            order = [("by hand", by_hand), ("scale", study)]
            if number % 2:
                order.reverse()
            seconds = {}
            for name, run in order:
                seconds[name] = run(Path(tmp) / f"{number}-{name.replace(' ', '-')}", args.steps, settings)
                print(f"round {number + 1}: {name}: {seconds[name]:.1f} s", flush=True)
            ratios.append(seconds["scale"] / seconds["by hand"])
            print(f"round {number + 1}: scale / by hand = {ratios[-1]:.3f}", flush=True)
    print(f"median ratio scale / by hand over {args.rounds} rounds: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
