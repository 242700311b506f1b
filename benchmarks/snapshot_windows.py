"""What in-memory snapshots cost a step, measured inside one run: the quickstart as shipped (2 nodes x
2 ranks, 2 loader workers a rank) on the lab cluster, through `python -m slurmddp submit` and
benchmarks/timed_train.py, with snapshots allowed in every other window of --window steps only
(train.timed_snapshot_windows): the windows without them are the baseline, run by the same
processes on the same machine a few seconds apart, so the load that swings separate runs' step
times by 10% (snapshot_cost.py) falls on both alike.

A step's time is rank 0's period from the loop handing out one step to handing out the next (the
boundary's work, a snapshot's part on the training path included). Periods over 3x their window's
median (an epoch's validation, the next epoch's loader start) are left out of both kinds. Each
window with snapshots is paired with the window after it; the ratio of their mean step times is a
pair's ratio. Prints the median of the pairs' ratios and the ratio of all windows' means, the
latter with a 95% interval from resampling the pairs, and the snapshots each window took.
Checkpoints on disk are off (checkpoint.every_steps=0).

Runs the interval slurmddp chooses (null, the default) and, as a check that the method sees a cost
that is there, --every N steps (0: not).

On the lab (the lab's export line in the environment: `eval "$(tests/slurm_lab/up)"`):

    python benchmarks/snapshot_windows.py [--epochs 200] [--window 200] [--every 5]

A pair's ratio spreads over several per cent on 2 busy cores: resolving a 1% cost takes
hundreds of windows (--epochs 800: about 40 pairs).
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

from labjobs import ROOT, ends, gone, interval_said, job_id, submit, wait_for
from resample import interval_95

QUICKSTART = ROOT / "examples" / "quickstart.yaml"
ENTRY = f"entrypoint={ROOT / 'benchmarks' / 'timed_train.py'}:train"
OUTLIER = 3.0
"""A period this many times its window's median is a pause, not a step."""


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


def means_ratio(pairs: Sequence[tuple[list[float], list[float]]]) -> float:
    """The mean step with snapshots over the mean step without, over all the pairs' windows."""
    with_ = [p for on, _ in pairs for p in on]
    without = [p for _, off in pairs for p in off]
    return statistics.fmean(with_) / statistics.fmean(without)


def one(
    out: Path, epochs: int, window: int, setting: str
) -> tuple[list[float], float, tuple[float, float], list[int], str]:
    """The pairs' ratios, the ratio of all windows' means and its 95% interval, the snapshots kept
    per window with them, and what rank 0 said of the interval."""
    run = submit(
        out,
        ENTRY,
        "train.timed=quickstart_train:train",
        f"train.timed_snapshot_windows={window}",
        f"train.epochs={epochs}",
        "checkpoint.every_steps=0",
        setting,
        experiment=QUICKSTART,
    )
    wait_for("the job to end", lambda: gone(job_id(run)), timeout=1800)
    end = ends(run)[-1]
    if end["reason"] != "completed":
        raise SystemExit(f"{run}: ended {end['reason']}")
    (timing,) = (run / "timing").glob("rank-0-pid-*.json")
    record = json.loads(timing.read_text())
    periods = windows(record)
    # The first window holds the cadence's first measurements and the loader's start; the last may
    # be cut short: neither is paired.
    full = sorted(periods)[1:-1]
    pairs = [(k, k + 1) for k in full if k % 2 == 0 and k + 1 in full]
    ratios = [statistics.fmean(periods[on]) / statistics.fmean(periods[off]) for on, off in pairs]
    steps = [(periods[on], periods[off]) for on, off in pairs]
    kept = [sum(1 for step in record["snapshots"] if step // window == on) for on, _ in pairs]
    said = interval_said(run)
    return ratios, means_ratio(steps), interval_95(steps, means_ratio), kept, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    settings = {"chosen": "checkpoint.snapshot_every_steps=null"}
    if args.every:
        settings[f"every {args.every}"] = f"checkpoint.snapshot_every_steps={args.every}"
    results = {}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        for name, setting in settings.items():
            ratios, overall, (low, high), kept, said = one(Path(tmp), args.epochs, args.window, setting)
            results[name] = statistics.median(ratios)
            print(
                f"{name:8} {len(ratios)} pairs of {args.window}-step windows: median ratio with/without "
                f"{statistics.median(ratios):.4f} (quartiles "
                f"{', '.join(f'{q:.4f}' for q in statistics.quantiles(ratios, n=4)[::2])}), all windows' "
                f"means {overall:.4f} (95%: {low:.4f}-{high:.4f}); snapshots a window "
                f"{min(kept)}-{max(kept)}; {said or 'none said'}",
                flush=True,
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
