"""What a search that learns buys: pruning's share of the time, and TPE against random draws.

1. Pruning. examples/search.yaml (the quickstart as 12 trials of lr x hidden, TPE, 2 at a time) run
   twice side by side, `pruner: asha` and `pruner: none`, the same seed: the allocated time of the
   pruned sweep over the unpruned one's, and the best val_loss of each.
2. Samplers. At equal trials, TPE and random draws over `--seeds` seeds on an objective whose optimum
   is known: a 1-rank function whose final loss is (log10(lr) + 2.5)^2 + (log2(hidden) - 7)^2 / 4,
   0 at lr = 10^-2.5 and hidden = 128. The median over seeds of each sampler's best value.

Everything goes through `python -m slurmddp submit`, on Slurm where SLURM_CONF points at one (the
lab: eval "$(tests/slurm_lab/up)"), else locally, one element after another.
Usage: python benchmarks/search_pruning.py [--seeds 5] [--trials 12] [--skip-pruning]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE = """\
import math
def main(ctx):
    lr, hidden = ctx.train.lr, ctx.train.hidden
    floor = (math.log10(lr) + 2.5) ** 2 + (math.log2(hidden) - 7) ** 2 / 4
    for step in ctx.loop(ctx.train.steps):
        if step % 10 == 9:
            ctx.log(step, loss=floor + 1 / (step + 1))
    return {"loss": floor + 1 / ctx.train.steps}
"""
KNOWN = """\
entrypoint: objective.py:main
resources: {nodes: 1, tasks_per_node: 1, time: "00:10:00"}
train: {steps: 40, lr: 0.1, hidden: 64}
sweep:
  search:
    trials: 12
    params: {lr: {log_uniform: [1.0e-5, 1.0]}, hidden: "choice(16, 32, 64, 128, 256, 512, 1024)"}
    pruner: none
  max_parallel: 2
  metric: loss
  mode: min
"""


def submit(work: Path, experiment: Path, *overrides: str) -> tuple[dict[str, object], float]:
    """Run a sweep to its end; its `status --json` and the wall time of the whole."""
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
    out = work / "runs"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(experiment),
            f"output_dir={out}",
            "--wait",
            *overrides,
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    newest = max(out.glob("*/*/sweep.json"), key=lambda p: p.stat().st_mtime).parent
    shown = subprocess.run(
        [sys.executable, "-m", "slurmddp", "status", str(newest), "--json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(shown.stdout), wall


def allocated_s(status: dict[str, object]) -> float:
    total = status["total"]
    assert isinstance(total, dict) and isinstance(total["goodput"], dict)
    return float(total["goodput"]["allocated_s"])


def best(status: dict[str, object]) -> float:
    study = status["study"]
    assert isinstance(study, dict) and isinstance(study["best"], dict)
    return float(study["best"]["value"])


def pruning(work: Path) -> None:
    (work / "quickstart_train.py").write_text((ROOT / "examples" / "quickstart_train.py").read_text())
    (work / "data").symlink_to(ROOT / "examples" / "data")
    rows = []
    for pruner in ("asha", "none"):
        status, wall = submit(work, ROOT / "examples" / "search.yaml", f"sweep.search.pruner={pruner}")
        pruned = status["study"]["trials"]["pruned"]  # type: ignore[index]
        print(f"pruner {pruner}: {pruned} of 12 trials pruned")
        rows.append((pruner, allocated_s(status), wall, best(status), pruned))
        _, spent, _, value, _ = rows[-1]
        print(f"pruner {pruner}: allocated {spent:.0f} s, wall {wall:.0f} s, best {value:.4f}")
    (_, with_s, with_wall, with_best, _), (_, without_s, without_wall, without_best, _) = rows
    print(
        f"pruned / unpruned: allocated {with_s / without_s:.2f}, wall {with_wall / without_wall:.2f}; "
        f"best val_loss {with_best:.4f} vs {without_best:.4f}"
    )


def samplers(work: Path, seeds: int, trials: int) -> None:
    (work / "objective.py").write_text(OBJECTIVE)
    experiment = work / "known.yaml"
    experiment.write_text(KNOWN)
    found: dict[str, list[float]] = {"tpe": [], "random": []}
    for seed in range(seeds):
        for sampler in found:
            status, _ = submit(
                work,
                experiment,
                f"sweep.search.sampler={sampler}",
                f"sweep.search.seed={seed}",
                f"sweep.search.trials={trials}",
            )
            found[sampler].append(best(status))
            print(f"seed {seed} {sampler}: best {found[sampler][-1]:.4f}", flush=True)
    tpe, rand = (statistics.median(found[name]) for name in ("tpe", "random"))
    print(
        f"median best over {seeds} seeds, {trials} trials (optimum 0 + 1/40 = 0.025): "
        f"tpe {tpe:.4f}, random {rand:.4f}, tpe / random {tpe / rand:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--skip-pruning", action="store_true")
    parser.add_argument("--skip-samplers", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="search-bench-"))
    try:
        if not args.skip_pruning:
            pruning(work)
        if not args.skip_samplers:
            samplers(work, args.seeds, args.trials)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
