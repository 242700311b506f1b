"""Stop signal received -> checkpoint durable -> requeue issued, for a ~270 MB training state.

On the lab cluster (SLURM_CONF set): quickstart with a 4096-wide MLP (model + SGD momentum ~270 MB)
on 1 node x 2 ranks, interrupted with `slurmddp interrupt --preempt`, sync and async saves
alternating. For scale it also times a raw torch.save + fsync of a state of the same size in the
same run. Target: total < 2 s.  Usage: python benchmarks/requeue_latency.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labjobs import ends, gone, job_id, read_json, state, step, submit, wait_for

WIDTH = 4096


def raw_save_seconds(folder: Path) -> float:
    import torch

    state = {f"w{i}": torch.randn(WIDTH, WIDTH) for i in range(4)}  # 4 x 64 MiB = 256 MiB
    path = folder / "raw.pt"
    started = time.perf_counter()
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def one(out: Path, async_save: bool) -> tuple[float, float, float]:
    run = submit(
        out,
        f"train.width={WIDTH}",
        "train.steps=100000",
        "resources.nodes=1",
        "resources.tasks_per_node=2",
        f"checkpoint.async_save={str(async_save).lower()}",
    )
    wait_for("training to start", lambda: step(run) >= 3)
    subprocess.run(
        [sys.executable, "-m", "slurmddp", "interrupt", str(run), "--preempt"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    end = wait_for("the attempt to end", lambda: ends(run))[0]
    stop = read_json(run / "stop.json")
    # Cancel only once the requeue has landed: `scontrol requeue` also requeues a cancelled job.
    wait_for("the requeue", lambda: state(job_id(run)) in ("PENDING", ""))
    subprocess.run(["scancel", job_id(run)], check=True)
    wait_for("the job to leave the queue", lambda: gone(job_id(run)))
    return stop["time"] - stop["signal_at"], float(stop["save_s"]), end["time"] - stop["time"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float, float]]] = {"sync": [], "async": []}
    raws = []
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        for round_ in range(args.rounds):
            raws.append(raw_save_seconds(Path(tmp)))
            for mode in ("sync", "async"):
                durable, save, requeue = one(Path(tmp), mode == "async")
                rows[mode].append((durable, save, requeue))
                print(
                    f"round {round_ + 1} {mode:5}: signal->durable {durable:.2f} s (of which the save "
                    f"{save:.2f} s, the rest finishing the step in flight and the next), "
                    f"durable->requeue issued {requeue:.2f} s, total {durable + requeue:.2f} s"
                )
    raw = statistics.median(raws)
    print(f"raw torch.save + fsync of 256 MiB: median {raw:.2f} s")
    for mode, values in rows.items():
        total = statistics.median(d + r for d, _, r in values)
        save = statistics.median(s for _, s, _ in values)
        print(f"{mode:5} median total {total:.2f} s (target < 2 s); save {save:.2f} s, {save / raw:.2f}x raw")


if __name__ == "__main__":
    main()
