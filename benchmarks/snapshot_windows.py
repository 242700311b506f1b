"""What in-memory snapshots cost a step, measured inside one run: the quickstart as shipped (2 nodes x
2 ranks, 2 loader workers a rank) on the lab cluster, through `python -m slurmddp submit` and
benchmarks/timed_train.py, with one snapshot at the start of every other window of --window steps
and none elsewhere (train.timed_snapshot_windows): the windows without are the baseline, run by the
same processes on the same machine a second later, so the load that swings separate runs' step
times by 10% (snapshot_cost.py) falls on both alike.

A step's time is rank 0's period from the loop handing out one step to handing out the next (the
boundary's work, a snapshot's part on the training path included). Periods over 3x their window's
median (an epoch's validation, the next epoch's loader start) are left out of both kinds. Each
window with a snapshot is paired with the window after it. What one snapshot costs is the with
windows' mean step less the without windows' (over all pairs), times the window's steps; what it
costs a step at the interval slurmddp chooses is that over the interval times the step: the ratio
printed, with a 95% interval from resampling the pairs (target <= 1.01). The interval is the median
of what rank 0's cadence would choose at each boundary of the run (its estimates see every
boundary). Checkpoints on disk are off (checkpoint.every_steps=0).

Short windows give many pairs, and the window's start leaves a snapshot's write (a few steps) inside
its window; one snapshot in W steps is denser than the chosen interval, and the cost is scaled to
that interval, not measured at it.

On the lab (the lab's export line in the environment: `eval "$(tests/slurm_lab/up)"`):

    python benchmarks/snapshot_windows.py [--epochs 800] [--window 50]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labjobs import ROOT, ends, gone, job_id, submit, wait_for
from resample import interval_95

QUICKSTART = ROOT / "examples" / "quickstart.yaml"
ENTRY = f"entrypoint={ROOT / 'benchmarks' / 'timed_train.py'}:train"
OUTLIER = 3.0
"""A period this many times its window's median is a pause, not a step."""

Pair = tuple[list[float], list[float]]
"""A window's step periods with its snapshot, and the next window's without."""


def windows(record: dict[str, Any]) -> dict[int, list[float]]:
    """Rank 0's step periods by window (window k: the steps k*W to (k+1)*W - 1), pauses left out."""
    size = int(record["window_steps"])
    handed = [(int(step), float(at)) for step, priming, at, *_ in record["steps"] if not priming]
    found: dict[int, list[float]] = {}
    for (_, before), (step, after) in itertools.pairwise(handed):
        found.setdefault(step // size, []).append(after - before)
    for window, periods in found.items():
        median = statistics.median(periods)
        found[window] = [p for p in periods if p <= OUTLIER * median]
    return found


def mean_step(pairs: Sequence[Pair], side: int) -> float:
    """The mean step of the windows with a snapshot (side 0) or without (side 1)."""
    return statistics.fmean(period for pair in pairs for period in pair[side])


def snapshot_s(pairs: Sequence[Pair], window: int) -> float:
    """One snapshot's cost: the extra time of the windows with one over those without."""
    return (mean_step(pairs, 0) - mean_step(pairs, 1)) * window


def step_ratio(pairs: Sequence[Pair], window: int, interval: float) -> float:
    """A step's time with a snapshot every `interval` steps over one without."""
    return 1 + snapshot_s(pairs, window) / (interval * mean_step(pairs, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=800)
    parser.add_argument("--window", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        run = submit(
            Path(tmp),
            ENTRY,
            "train.timed=quickstart_train:train",
            f"train.timed_snapshot_windows={args.window}",
            f"train.epochs={args.epochs}",
            "checkpoint.every_steps=0",
            experiment=QUICKSTART,
        )
        wait_for("the job to end", lambda: gone(job_id(run)), timeout=3600)
        end = ends(run)[-1]
        if end["reason"] != "completed":
            raise SystemExit(f"{run}: ended {end['reason']}")
        (timing,) = (run / "timing").glob("rank-0-pid-*.json")
        record = json.loads(timing.read_text())
    periods = windows(record)
    # The first window holds the cadence's first measurements and the loader's start; the last may
    # be cut short: neither is paired.
    full = sorted(periods)[1:-1]
    pairs = [(periods[k], periods[k + 1]) for k in full if k % 2 == 0 and k + 1 in full]
    intervals = record["intervals"][2 * args.window :]
    interval = statistics.median(intervals)
    window = args.window
    cost_low, cost_high = interval_95(pairs, lambda drawn: snapshot_s(drawn, window))
    low, high = interval_95(pairs, lambda drawn: step_ratio(drawn, window, interval))
    step = mean_step(pairs, 1)
    quartiles = statistics.quantiles(intervals, n=4)
    print(
        f"{len(pairs)} pairs of {window}-step windows, {len(record['snapshots'])} snapshots; a step "
        f"{1000 * step:.2f} ms without\n"
        f"one snapshot costs {1000 * snapshot_s(pairs, window):.2f} ms "
        f"(95%: {1000 * cost_low:.2f}-{1000 * cost_high:.2f})\n"
        f"interval chosen: median {interval:g} steps (quartiles {quartiles[0]:g}-{quartiles[2]:g})\n"
        f"a step with snapshots at it over one without: {step_ratio(pairs, window, interval):.4f} "
        f"(95%: {low:.4f}-{high:.4f}); target <= 1.01",
        flush=True,
    )
    print(json.dumps({"snapshot_s": snapshot_s(pairs, window), "ratio": step_ratio(pairs, window, interval)}))


if __name__ == "__main__":
    main()
