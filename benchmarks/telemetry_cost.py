"""What telemetry costs a training run: the quickstart with telemetry on vs off.

    python benchmarks/telemetry_cost.py [--rounds 5] [--epochs 8] [--workers 2] [--every-s 10]

Both variants run examples/quickstart.yaml with executor=local (4 gloo ranks on this machine); the
baseline is `telemetry.enabled=false`, which leaves DDP's own all-reduce path untouched, and every
round runs off, then on (A, B, A, B, ...), so drift of a shared machine hits both. A run's step time
is read as step_time.py reads it (its `steady_ms`): rank 0's epoch-end records, the first epoch
left out, validation and each epoch's new loader iterator in. What telemetry adds is in it: the
timed hook on every bucket, the clock reads, the timed barriers at the start, the all-gather of
every record (`--every-s` sets telemetry.every_s; the default is the config's own) and the last one.
Prints each run (with the 1-minute load average before it), the ratio to the baseline per round,
the medians, the median of the ratios and the ratio of the medians (target: <= 1.01), and what
the runs with telemetry measured of themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

# benchmarks/ is not a package: run as a script, its folder is on sys.path (as labjobs.py is found).
from step_time import slurmddp, steady_ms

VARIANTS = {"off": ["telemetry.enabled=false"], "on": ["telemetry.enabled=true"]}
"""The first is the baseline."""
TARGET = 1.01


def run_variant(
    variant: str, epochs: int, workers: int, every_s: float | None, out: Path
) -> tuple[float, Any]:
    """ms per step, and the telemetry summary result.json holds (None with telemetry off)."""
    overrides = [f"train.epochs={epochs}", f"train.workers={workers}", *VARIANTS[variant]]
    if every_s is not None and variant == "on":
        overrides.append(f"telemetry.every_s={every_s}")
    run = slurmddp(out, *overrides)
    result = json.loads((run / "result.json").read_text())
    if (result["telemetry"] is None) != (variant == "off"):
        raise SystemExit(f"{run}: telemetry is {result['telemetry']!r} with telemetry {variant}")
    return steady_ms(run / "metrics.jsonl"), result["telemetry"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8, help="at least 2: the first is left out")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--every-s", type=float, help="telemetry.every_s of the runs with telemetry")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs: at least 2 (the first epoch is left out)")
    base, *others = VARIANTS
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: dict[str, list[float]] = {v: [] for v in others}
    summaries: list[dict[str, Any]] = []
    runs = []
    every = "the config's" if args.every_s is None else f"{args.every_s:g} s"
    print(
        f"{os.cpu_count()} cores, {args.epochs} epochs, {args.workers} workers per rank, 4 ranks, "
        f"telemetry.every_s {every}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            parts = []
            for variant in VARIANTS:
                out = Path(tmp) / f"{round_}-{variant}"
                out.mkdir()
                load = os.getloadavg()[0]
                started = time.monotonic()
                ms, summary = run_variant(variant, args.epochs, args.workers, args.every_s, out)
                wall = time.monotonic() - started
                times[variant].append(ms)
                runs.append(
                    {
                        "round": round_,
                        "variant": variant,
                        "ms": ms,
                        "load": load,
                        "wall_s": wall,
                        "telemetry": summary,
                    }
                )
                if summary is not None:
                    summaries.append(summary)
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
            f"{statistics.median(times[variant]) / statistics.median(times[base]):.3f} (target <= {TARGET})"
        )
    if summaries:

        def median_of(key: str, scale: float = 1.0) -> str:
            values = [s[key] * scale for s in summaries if s.get(key) is not None]
            return f"{statistics.median(values):.3g}" if values else "-"

        print(
            "telemetry measured (medians over the runs with it): "
            f"step {median_of('step_s', 1000)} ms (the loop's steps only), "
            f"comm {median_of('comm_s', 1000)} ms, exposed {median_of('exposed_comm_frac', 100)}% of a step, "
            f"data wait {median_of('data_wait_frac', 100)}%, barrier {median_of('barrier_s', 1000)} ms, "
            f"{median_of('buckets')} buckets"
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
