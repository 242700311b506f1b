"""What a mid-epoch resume costs: the priming step, and the time from process start to the first step
with a data loader (the quickstart) and without one (examples/synthetic.yaml).

    python benchmarks/resume_cost.py [--rounds 3] [--epochs 6] [--stop-step 30]
        [--synthetic-steps 150] [--synthetic-stop 50] [--fixes]

Each round runs the quickstart (4 local gloo ranks, 2 loader workers each) and the synthetic
example (4 ranks, no loader) one after the other, both through benchmarks/timed_train.py, which
runs the example's function unchanged and records when the loop hands out each step. Once rank 0
has logged the stop step (metrics.jsonl, progress.json), SIGUSR2 goes to the 4 rank processes (as
a preemption would): every rank saves at the same step, exits with the local requeue status, and
submitit's local controller starts all four again; that attempt resumes from the checkpoint. From rank 0 of
the resumed attempt it prints:
  priming     the priming step + the checkpoint's reload (from the loop handing out the priming
              step to it handing out the same step again), in ms and in mean steps of that attempt;
              split at the training function asking for its next step
  to first    process start -> the loop hands out the first step (the priming one) and the first
              real step, split into: start -> entrypoint called (interpreter, imports, process
              group, preflight), -> ctx.loop called (the example's own setup), -> loop built (the
              checkpoint loaded), -> first step handed out (first boundary; with a loader its
              iterator positioned mid-epoch, worker processes started, first batch)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENTRY = f"entrypoint={ROOT / 'benchmarks' / 'timed_train.py'}:train"
TIMEOUT_S = 900


def rank_pids(run: Path) -> list[int]:
    """The rank processes of `run`: children of submitit's local controller (not loader workers)."""
    logs = str(run / "logs").encode()
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if logs in cmdline and b"submitit.core._submit" in cmdline:
            found[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return [pid for pid, parent in found.items() if parent not in found]


def progress_step(run: Path) -> int:
    """How far rank 0 got: progress.json (every 2 s) or metrics.jsonl (every log_every steps)."""
    steps = [-1]
    with contextlib.suppress(OSError, ValueError, KeyError):
        steps.append(int(json.loads((run / "progress.json").read_text())["step"]))
    with contextlib.suppress(OSError, ValueError, KeyError):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        steps.extend(int(json.loads(line)["step"]) for line in lines[-1:])
    return max(steps)


def stopped_run(out: Path, experiment: str, stop_step: int, overrides: list[str]) -> Path:
    """Submit, stop the ranks once rank 0 has passed `stop_step`, wait for the resumed attempt's end."""
    command = [sys.executable, "-m", "slurmddp", "submit", str(ROOT / "examples" / experiment)]
    proc = subprocess.Popen(
        [*command, "executor=local", f"output_dir={out}", ENTRY, *overrides],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + TIMEOUT_S
    run = None
    while run is None or progress_step(run) < stop_step:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{experiment}: no step {stop_step} (exit status {proc.poll()})")
        time.sleep(0.05)
        run = next((p.parent for p in out.glob("*/*/manifest.json")), None)
    for pid in rank_pids(run):
        os.kill(pid, signal.SIGUSR2)
    if proc.wait(timeout=TIMEOUT_S):
        raise SystemExit(f"{experiment}: the stopped run failed")
    return run


def resumed_record(run: Path) -> dict[str, Any]:
    records = [json.loads(p.read_text()) for p in (run / "timing").glob("rank-0-pid-*.json")]
    resumed = [r for r in records if r.get("first_step", 0) > 0]
    if len(resumed) != 1:
        raise SystemExit(f"{run}: expected one resumed attempt, found {len(resumed)}")
    return resumed[0]


def figures(record: dict[str, Any]) -> dict[str, float]:
    steps = record["steps"]
    (prime_step, priming, primed_at, primed_done), (real_step, real_priming, real_at, _) = steps[:2]
    assert priming and not real_priming and prime_step == real_step, steps[:2]
    # Intervals between the steps after the first real one: the attempt's steady steps, epoch
    # ends (validation, a new iterator) included in the mean, not in the median.
    later = [b[2] - a[2] for a, b in itertools.pairwise(steps[2:])]
    started = record["started"]
    return {
        "resumed_at": real_step,
        "priming_ms": 1000 * (real_at - primed_at),
        "priming_step_ms": 1000 * (primed_done - primed_at),
        "reload_ms": 1000 * (real_at - primed_done),
        "first_real_step_ms": 1000 * (steps[2][2] - real_at),
        "mean_step_ms": 1000 * statistics.mean(later),
        "median_step_ms": 1000 * statistics.median(later),
        "to_entry_s": record["entered"] - started,
        "entry_to_loop_s": record["loop_called"] - record["entered"],
        "loop_build_s": record["loop_built"] - record["loop_called"],
        "to_first_handout_s": primed_at - record["loop_built"],
        "start_to_first_step_s": primed_at - started,
        "start_to_first_real_step_s": real_at - started,
    }


def show(name: str, f: dict[str, float]) -> str:
    return (
        f"{name}: resumed at step {f['resumed_at']:.0f}; priming {f['priming_ms']:.0f} ms (step "
        f"{f['priming_step_ms']:.0f} + reload {f['reload_ms']:.0f}) = "
        f"{f['priming_ms'] / f['mean_step_ms']:.2f} mean steps ({f['mean_step_ms']:.1f} ms; "
        f"{f['priming_ms'] / f['median_step_ms']:.2f} median steps of {f['median_step_ms']:.1f} ms), "
        f"first real step {f['first_real_step_ms']:.0f} ms; start -> first step "
        f"{f['start_to_first_step_s']:.2f} s (entry {f['to_entry_s']:.2f} + setup "
        f"{f['entry_to_loop_s']:.2f} + loop/checkpoint {f['loop_build_s']:.2f} + first handout "
        f"{f['to_first_handout_s']:.2f}), -> first real step {f['start_to_first_real_step_s']:.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--stop-step", type=int, default=30, help="quickstart: 22 steps an epoch")
    parser.add_argument("--synthetic-steps", type=int, default=150)
    parser.add_argument("--synthetic-stop", type=int, default=50)
    parser.add_argument(
        "--fixes",
        action="store_true",
        help="1 torch thread, cheap per-sample seeds (timed_train.py), as step_time.py's slurmddp-fixed",
    )
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    fixes = ["train.timed_threads=1", "train.timed_cheap_seeds=true"] if args.fixes else []
    quick = ["train.timed=quickstart_train:train", f"train.epochs={args.epochs}", "train.workers=2", *fixes]
    synth = ["train.timed=synthetic_train:train", f"train.steps={args.synthetic_steps}", *fixes]
    results: dict[str, list[dict[str, float]]] = {"quickstart": [], "synthetic": []}
    print(f"{os.cpu_count()} cores; 4 ranks each")
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            for name, yaml, stop, overrides in (
                ("quickstart", "quickstart.yaml", args.stop_step, quick),
                ("synthetic", "synthetic.yaml", args.synthetic_stop, synth),
            ):
                load = os.getloadavg()[0]
                run = stopped_run(Path(tmp) / f"{round_}-{name}", yaml, stop, overrides)
                f = {**figures(resumed_record(run)), "load": load}
                results[name].append(f)
                print(f"round {round_} (load {load:.1f}) {show(name, f)}", flush=True)
    for name, runs in results.items():
        median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"median {show(name, median)}")
        costs = [r["priming_ms"] / r["mean_step_ms"] for r in runs]
        print(f"  priming cost per resume: median {statistics.median(costs):.2f} steps ({costs})")
    first = [
        q["start_to_first_step_s"] / s["start_to_first_step_s"]
        for q, s in zip(results["quickstart"], results["synthetic"], strict=True)
    ]
    print(f"start -> first step, loader / no loader: per round {[round(x, 3) for x in first]}")
    print(f"  median {statistics.median(first):.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
