"""Each framework's example script (examples/frameworks/) with and without slurmddp's line, and the
stop: 3 local gloo ranks, interleaved runs.

    python benchmarks/framework_stop.py [--frameworks torchrun,transformers,...] [--rounds 3]

For each framework it runs, `--rounds` times in turn, the script without the integration and with
it, uninterrupted, and compares their median time per optimizer step (from the time each rank's
step log gives every step, the last word of its line; the first 10 steps left out): the ratio per
round, and its median (target <= 1.01; on 2 shared cores single runs swing by several percent). Then one run
with the integration is sent the stop signal (USR2, as Slurm sends it) at a third of its steps:
it prints the time from the signal to the last step every rank made (all ranks stop at the same
step: the step printed), and to the stop's record, written once every rank's script saved its
checkpoint durably and exited.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ROOT / "examples" / "frameworks"
RANKS = 3
CASES = {
    # name: (experiment, its arguments ({out}: the run's output_dir), the arguments that leave the
    # integration out, the step log of rank R relative to the run directory)
    "torchrun": ("torchrun.yaml", "--epochs 6", "--no-slurmddp", "steps-{rank}.log"),
    "transformers": (
        "transformers.yaml",
        "--max-steps 240 --record-steps {out}/steps",
        "--integration none",
        "../../steps/rank-{rank}.txt",
    ),
    "accelerate": ("accelerate.yaml", "--epochs 6 --record-steps", "--no-helper", "steps/rank-{rank}.txt"),
    "lightning": ("lightning.yaml", "--steps 240", "--no-callback", "steps/rank-{rank}.txt"),
}


def steps(run: Path, rank: int, log: str) -> list[tuple[int, float]]:
    lines = (run / log.format(rank=rank)).read_text().splitlines()
    return [(int(line.split()[0]), float(line.split()[-1])) for line in lines]


def submit(name: str, out: Path, without: bool = False) -> tuple[subprocess.Popen[str], Path]:
    experiment, args, leave_out, _ = CASES[name]
    arguments = args.format(out=out).split() + (leave_out.split() if without else [])
    overrides = [
        f"resources.tasks_per_node={RANKS}",
        "resources.nodes=1",
        "executor=local",
        f"output_dir={out}",
        f"entrypoint.args=[{','.join(arguments)}]",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", str(FRAMEWORKS / experiment), *overrides],
        cwd=out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, out


def run_dir(out: Path) -> Path:
    (manifest,) = out.glob("*/*/manifest.json")
    return manifest.parent


def step_time(name: str, run: Path) -> float:
    times = [at for _, at in steps(run, 0, CASES[name][3])][10:]
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def rank_pids(run: Path) -> list[int]:
    logs = str(run / "logs").encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and b"submitit.core._submit" in cmdline and logs in cmdline:
            found.append(int(entry.name))
    return found


def finished(proc: subprocess.Popen[str]) -> None:
    output, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"a run failed:\n{output}")


def overhead(name: str, rounds: int, work: Path) -> None:
    ratios = []
    for number in range(rounds):
        timed = {}
        for variant in ("without", "with"):
            proc, out = submit(name, work / f"{name}-{variant}-{number}", without=variant == "without")
            finished(proc)
            timed[variant] = step_time(name, run_dir(out))
        ratios.append(timed["with"] / timed["without"])
        print(
            f"{name}: round {number + 1}: step {1000 * timed['without']:.2f} ms without, "
            f"{1000 * timed['with']:.2f} ms with: ratio {ratios[-1]:.4f}",
            flush=True,
        )
    median = statistics.median(ratios)
    print(f"{name}: median ratio with/without {median:.4f} over {rounds} rounds (target <= 1.01)")


def stop_latency(name: str, work: Path) -> None:
    log = CASES[name][3]
    proc, out = submit(name, work / f"{name}-stopped")
    while not list(out.glob(f"*/*/{log.format(rank=0)}")) or len(steps(run_dir(out), 0, log)) < 60:
        if proc.poll() is not None:
            raise SystemExit(f"{name}: the run ended before its 60th step")
        time.sleep(0.02)
    run = run_dir(out)
    sent = time.time()
    for pid in rank_pids(run):
        os.kill(pid, signal.SIGUSR2)
    finished(proc)
    stopped = json.loads((run / "stop.json").read_text())
    # Each rank's last step of the stopped attempt: the last one made before the stop's record.
    last = [
        max((s for s in steps(run, r, log) if s[1] < stopped["time"]), key=lambda s: s[1])
        for r in range(RANKS)
    ]
    print(
        f"{name}: signal -> every rank stopped (at step {sorted({s for s, _ in last})}): "
        f"{1000 * (max(at for _, at in last) - sent):.0f} ms; -> checkpoint durable and the ranks out: "
        f"{1000 * (stopped['time'] - sent):.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frameworks", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        for name in args.frameworks.split(","):
            overhead(name, args.rounds, Path(tmp))
            stop_latency(name, Path(tmp))


if __name__ == "__main__":
    main()
