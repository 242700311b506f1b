"""Per-step time of quickstart's training under slurmddp's runtime vs a hand-written DDP loop.

Both run 2 gloo ranks on this machine with the same model, data and thread count, alternating
A, B, A, B, ... so drift of a noisy machine hits both; prints each run and the ratio of medians
(target: <= 1.02).  Usage: python benchmarks/step_time.py [--rounds 5] [--steps 300]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def handwritten(steps: int) -> float:
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "benchmarks" / "handwritten_ddp.py"), str(steps)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("the hand-written baseline failed")
    return float(json.loads(outs[0])["step_ms"])


def slurmddp(steps: int, out: Path) -> float:
    before = set(out.glob("*/*/result.json"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(ROOT / "examples" / "synthetic.yaml"),
            "executor=local",
            "resources.nodes=1",
            "resources.tasks_per_node=2",
            f"train.steps={steps}",
            f"output_dir={out}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (result,) = set(out.glob("*/*/result.json")) - before
    return float(json.loads(result.read_text())["ranks"][0]["step_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    ours, base = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            base.append(handwritten(args.steps))
            ours.append(slurmddp(args.steps, Path(tmp)))
            print(f"round {round_ + 1}: hand-written {base[-1]:.2f} ms/step, slurmddp {ours[-1]:.2f} ms/step")
    ratio = statistics.median(ours) / statistics.median(base)
    print(
        f"median ms/step: hand-written {statistics.median(base):.2f}, slurmddp {statistics.median(ours):.2f}"
    )
    print(f"ratio slurmddp / hand-written: {ratio:.3f} (target <= 1.02)")


if __name__ == "__main__":
    main()
