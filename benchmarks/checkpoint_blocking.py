"""How long a checkpoint blocks the training path: raw torch.save vs CheckpointStore, sync and async.

State: a model of two 4096x4096 linear layers and its SGD momentum, float32 (~256 MiB). Each round
runs every variant once, in an order rotated per round so no variant always goes first; before each
run dirty pages are flushed (os.sync) and every earlier save is durable, so runs do not pay for each
other's write-back. Prints each run, the medians and their ratios to raw (target: async <= 0.35x).

    raw         torch.save(state, file) + flush + fsync
    sync        CheckpointStore.save() in sync mode (durable on return: temp+fsync+rename, markers)
    async       CheckpointStore.save() in async mode: time until it returns (copy to CPU memory)
    async-new   the same without reusing the previous save's CPU buffers
and, for async, the time until the save is durable (save() + wait()).

Usage: python benchmarks/checkpoint_blocking.py [--rounds 5] [--dir DIR]
(DIR: where to write, e.g. the cluster file system checkpoints go to; default a temp dir in /tmp)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slurmddp.experiment.schema import Checkpoint
from slurmddp.job.checkpoint import CheckpointStore, capture_rng_state


def make_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 4096))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(2, 4096)).sum().backward()
    optimizer.step()  # creates the momentum buffers
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def state_mib(state: Any) -> float:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() / 2**20
    if isinstance(state, dict):
        return sum(state_mib(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_mib(v) for v in state)
    return 0.0


class Bench:
    def __init__(self, root: Path, state: dict[str, Any]) -> None:
        self.root = root
        self.state = state
        self.step = 0
        self.stores = {
            "sync": CheckpointStore(root / "sync", 0, 1, attempt="bench"),
            "async": CheckpointStore(root / "async", 0, 1, Checkpoint(async_save=True), attempt="bench"),
            "async-new": CheckpointStore(
                root / "async-new",
                0,
                1,
                Checkpoint(async_save=True),
                attempt="bench",
                reuse_snapshot_buffers=False,
            ),
        }

    def raw(self) -> tuple[float, float | None]:
        path = self.root / "raw.pt"
        path.unlink(missing_ok=True)
        os.sync()
        started = time.perf_counter()
        with open(path, "wb") as handle:
            torch.save(self.state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        return time.perf_counter() - started, None

    def store(self, name: str) -> tuple[float, float | None]:
        store = self.stores[name]
        self.step += 1
        local = {"rng": capture_rng_state()}
        os.sync()
        started = time.perf_counter()
        store.save(self.step, self.state, local)
        returned = time.perf_counter() - started
        store.wait()
        durable = time.perf_counter() - started
        store.prune()
        return returned, durable if store.async_save else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    try:
        state = make_state()
        bench = Bench(root, state)
        runs: dict[str, Callable[[], tuple[float, float | None]]] = {
            "raw": bench.raw,
            "sync": lambda: bench.store("sync"),
            "async": lambda: bench.store("async"),
            "async-new": lambda: bench.store("async-new"),
        }
        print(f"state: {state_mib(state):.0f} MiB float32 (2x Linear(4096, 4096) + SGD momentum)")
        print(f"writing to {root}; torch {torch.__version__}, {torch.get_num_threads()} threads\n")
        # The first async save has no buffers to reuse yet: shown, not counted.
        blocked, durable = bench.store("async")
        print(f"warm-up   async     blocked {blocked:6.3f} s  durable {durable:6.3f} s  (allocates buffers)")
        for name in ("raw", "sync", "async-new"):
            blocked, _ = runs[name]()
            print(f"warm-up   {name:9s} blocked {blocked:6.3f} s")

        times: dict[str, list[float]] = {name: [] for name in runs}
        durables: dict[str, list[float]] = {"async": [], "async-new": []}
        names = list(runs)
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                blocked, done = runs[name]()
                times[name].append(blocked)
                line = f"round {round_ + 1}   {name:9s} blocked {blocked:6.3f} s"
                if done is not None:
                    durables[name].append(done)
                    line += f"  durable {done:6.3f} s"
                print(line)

        raw = statistics.median(times["raw"])
        print("\nmedian time blocked on the training path (ratio to raw):")
        for name in names:
            median = statistics.median(times[name])
            print(f"  {name:9s} {median:6.3f} s   {median / raw:5.2f}x")
        for name, values in durables.items():
            median = statistics.median(values)
            print(f"  {name:9s} until durable (save + wait) {median:6.3f} s   {median / raw:5.2f}x")
        ratio = statistics.median(times["async"]) / raw
        print(f"\nasync <= 0.35x raw: {'yes' if ratio <= 0.35 else 'NO'} ({ratio:.2f}x)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
