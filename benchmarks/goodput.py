"""Goodput under preemption: useful step time / wall time for quickstart (2 nodes x 2 ranks) with a
preemption injected every ~60 s, next to the same run uninterrupted, on the lab cluster
(SLURM_CONF set). The cluster's own requeue delay (the gap between an attempt's end and the next
one's start: cred_expire, scheduling) is shown separately.
Usage: python benchmarks/goodput.py [--steps 6000] [--every 60]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from labjobs import ends, gone, job_id, read_json, submit, wait_for


def attempts(run: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]


def preempt_every(seconds: float, run: Path, out: Path, stop: threading.Event) -> None:
    while not stop.wait(seconds):
        if ends(run) and ends(run)[-1].get("final"):
            return
        subprocess.run(
            [
                "sbatch",
                "-p",
                "high",
                "-N",
                "3",
                "--exclusive",
                "-t",
                "1",
                "-o",
                str(out / "high-%j.out"),
                "--wrap",
                "sleep 2",
            ],
            check=True,
            capture_output=True,
        )


def one(out: Path, steps: int, every: float | None) -> tuple[float, float, float, int]:
    started = time.time()
    run = submit(out, f"train.steps={steps}", "train.log_every=1000")
    stop = threading.Event()
    if every:
        threading.Thread(target=preempt_every, args=(every, run, out, stop), daemon=True).start()
    wait_for("the run to end", lambda: (run / "attempts.jsonl").exists() and gone(job_id(run)), timeout=3600)
    stop.set()
    wall = time.time() - started
    result = read_json(run / "result.json")
    step_ms = float(result["result"]["step_ms"]) if result else float("nan")
    records = attempts(run)
    begins = [r for r in records if r["event"] == "begin"]
    requeue_gap = sum(
        float(b["time"]) - float(e["time"]) for e, b in zip(ends(run), begins[1:], strict=False)
    )
    return wall, step_ms, requeue_gap, len(begins)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--every", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        base_wall, step_ms, _, _ = one(Path(tmp), args.steps, None)
        wall, _, gap, n = one(Path(tmp), args.steps, args.every)
    useful = args.steps * step_ms / 1000
    print(f"uninterrupted: wall {base_wall:.1f} s, useful {useful:.1f} s, goodput {useful / base_wall:.3f}")
    print(
        f"preempted every ~{args.every:.0f} s: {n} attempts, wall {wall:.1f} s, goodput {useful / wall:.3f}"
    )
    print(f"  of which the cluster's requeue delay (end -> next start): {gap:.1f} s")
    print(f"  goodput ratio preempted / uninterrupted: {base_wall / wall:.3f}")


if __name__ == "__main__":
    main()
