"""Submitting a 1000-element sweep and asking its status, on the lab cluster.

Side by side in each round (held jobs, so the lab is not flooded; cancelled after each round):
  slurmddp:  `python -m slurmddp submit examples/sweep.yaml` with a 1000-trial random sweep
  submitit:  the peer way, a Python process that submits 1000 pickled callables with
             `executor.batch()` (one array, no validation, no run directories)
  sbatch:    `sbatch --array=0-999%2 --hold --wrap true`, the floor
and `python -m slurmddp status SWEEP` against the floor of what it asks Slurm:
`squeue -r -j ID` then `sacct -j ID`.
A PATH shim counts the sbatch calls slurmddp makes.
Targets: submit <= 10 s, status <= 2 s, one sbatch call that submits.
Needs a running Slurm (SLURM_CONF set, e.g. from tests/slurm_lab/up).
Usage: python benchmarks/sweep_submit.py [--rounds 3] [--elements 1000]
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
SWEEP = ROOT / "examples" / "sweep.yaml"
SUBMITIT_PEER = """
import sys, submitit
def element(i):
    return i
executor = submitit.SlurmExecutor(folder=sys.argv[1])
executor.update_parameters(time=10, array_parallelism=2, additional_parameters={"hold": True})
with executor.batch():
    jobs = [executor.submit(element, i) for i in range(int(sys.argv[2]))]
print(jobs[0].job_id.split("_")[0])
"""
HOLD = "resources.sbatch.hold=true"
SHIM = """#!/bin/sh
echo "$*" >> {log}
exec {real} "$@"
"""


def timed(
    command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])}... failed:\n{proc.stdout}{proc.stderr}")
    return elapsed, proc.stdout


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], check=False)


def wait_for_room(n: int) -> None:
    """Until slurmctld would take another n-task array: each task of a cancelled array counts
    against MaxJobCount until MinJobAge has passed (22.05.8), and the rounds cancel 3 arrays."""
    deadline = time.monotonic() + 600
    probe = ["sbatch", "--test-only", f"--array=0-{n - 1}", "--wrap", "true"]
    while subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit("slurmctld has had no room for the array for 10 minutes")
        time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--elements", type=int, default=1000)
    args = parser.parse_args()
    n = args.elements
    real = shutil.which("sbatch")
    if real is None:
        raise SystemExit("no sbatch on PATH: start the lab (tests/slurm_lab/up) and set SLURM_CONF")
    times: dict[str, list[float]] = {k: [] for k in ("slurmddp", "submitit", "sbatch", "status", "queries")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shim_dir = work / "shim"
        shim_dir.mkdir()
        calls = work / "sbatch-calls.log"
        (shim_dir / "sbatch").write_text(SHIM.format(log=calls, real=real))
        (shim_dir / "sbatch").chmod(0o755)
        env = {
            **os.environ,
            "PATH": f"{shim_dir}{os.pathsep}{os.environ['PATH']}",
            "XDG_STATE_HOME": str(work / "state"),
        }
        shutil.copy(ROOT / "examples" / "synthetic_train.py", work)
        sweep = (
            f"sweep={{random: {{trials: {n}, seed: 1, params: {{lr: {{log_uniform: [0.0001, 0.1]}}, "
            "width: {choice: [128, 256]}}}, max_parallel: 2}"
        )
        for round_no in range(args.rounds):
            out = work / f"runs{round_no}"
            calls.write_text("")
            wait_for_room(n)
            elapsed, _ = timed(
                [sys.executable, "-m", "slurmddp", "submit", str(SWEEP), sweep, f"output_dir={out}", HOLD],
                env=env,
                cwd=work,
            )
            times["slurmddp"].append(elapsed)
            (manifest,) = out.glob("*/*/sweep.json")
            array_id = str(json.loads(manifest.read_text())["submissions"][0]["job_id"])
            sbatch_calls = calls.read_text().splitlines()
            submitting = [c for c in sbatch_calls if "--test-only" not in c]

            elapsed, table = timed(
                [sys.executable, "-m", "slurmddp", "status", str(manifest.parent)], env=env
            )
            times["status"].append(elapsed)
            rows = sum(1 for line in table.splitlines() if " PENDING " in line)
            elapsed, _ = timed(
                ["sh", "-c", f"squeue -h -r -j {array_id} -o '%i|%T' && sacct -X -n -P -j {array_id}"]
            )
            times["queries"].append(elapsed)
            cancel(array_id)

            elapsed, stdout = timed(
                [sys.executable, "-c", SUBMITIT_PEER, str(work / f"peer{round_no}"), str(n)]
            )
            times["submitit"].append(elapsed)
            cancel(stdout.strip())

            elapsed, stdout = timed(
                ["sbatch", "--parsable", f"--array=0-{n - 1}%2", "--hold", "--wrap", "true"]
            )
            times["sbatch"].append(elapsed)
            cancel(stdout.strip().split(";")[0])
            checks = len(sbatch_calls) - len(submitting)
            print(
                f"round {round_no + 1}: slurmddp submit {times['slurmddp'][-1]:.2f} s "
                f"({len(submitting)} submitting sbatch call(s), {checks} --test-only), "
                f"submitit batch {times['submitit'][-1]:.2f} s, raw sbatch {times['sbatch'][-1]:.2f} s; "
                f"status {times['status'][-1]:.2f} s ({rows} pending rows) "
                f"vs squeue+sacct {times['queries'][-1]:.2f} s",
                flush=True,
            )
    med = {key: statistics.median(values) for key, values in times.items()}
    print(f"\nmedians over {args.rounds} rounds, {n} elements:")
    print(f"  submit: slurmddp {med['slurmddp']:.2f} s (target <= 10 s)")
    print(
        f"          vs submitit batch {med['submitit']:.2f} s: ratio {med['slurmddp'] / med['submitit']:.2f}"
    )
    print(f"          vs raw sbatch {med['sbatch']:.2f} s: ratio {med['slurmddp'] / med['sbatch']:.1f}")
    print(f"  status: slurmddp {med['status']:.2f} s (target <= 2 s)")
    print(f"          vs squeue+sacct {med['queries']:.2f} s: ratio {med['status'] / med['queries']:.1f}")


if __name__ == "__main__":
    main()
