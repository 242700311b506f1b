"""A benchmark-only entrypoint: runs an example's training function unchanged and records when
slurmddp's loop hands out each step, for step_time.py and resume_cost.py.

    python -m slurmddp submit examples/quickstart.yaml executor=local \\
        entrypoint=benchmarks/timed_train.py:train train.timed=quickstart_train:train \\
        [train.timed_threads=1] [train.timed_cheap_seeds=true] [train.timed_snapshot_windows=W]

`train.timed` names the function in examples/ (quickstart_train:train, synthetic_train:train);
`train.timed_threads` calls torch.set_num_threads first (what OMP_NUM_THREADS=1 would give if torch
were imported after the runtime sets it); `train.timed_cheap_seeds` makes ctx.loader's per-sample
reseeding in the workers seed torch's CPU generator directly (torch.default_generator.manual_seed)
instead of calling torch.manual_seed, which also queues a seed for CUDA, XPU and MTIA and formats
a stack trace for each: the same values for CPU code, at ~1 us instead of ~370 us a sample.
`train.timed_snapshot_windows=W` takes one in-memory snapshot at the start of every other window of
W steps (at step 0, 2W, 4W, ...) and no other: the windows without are the same run's baseline
(snapshot_windows.py); the cadence still sees every boundary, and the interval it would choose at
each is recorded (`intervals`).
Every rank process writes RUN_DIR/timing/rank-R-pid-P.json:
  started      the process's start (/proc/self/stat), on CLOCK_BOOTTIME like every time here
  entered      the entrypoint called (imports, process group, preflight done)
  loop_called  ctx.loop(...) called; loop_built: it returned (a resume has loaded its checkpoint)
  steps        [step, priming, handed out, done]: the loop hands out the step (before it runs),
               and the training function asks for the next one (the step has run)
  ended        the loop finished, or stopped for a requeue
  first_step   the step the attempt started from (0, or the checkpoint's)
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from slurmddp import RunContext

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def process_started() -> float:
    """When this process started, in seconds since boot (the kernel counts clock ticks)."""
    stat = Path("/proc/self/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def train(ctx: RunContext) -> Any:
    from slurmddp.job.train.loop import TrainLoop

    record: dict[str, Any] = {"rank": ctx.rank, "started": process_started(), "entered": now(), "steps": []}
    threads = ctx.train.get("timed_threads")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    record["torch_threads"] = _torch_threads()
    if ctx.train.get("timed_cheap_seeds"):
        _cheap_seeds()
    windows = ctx.train.get("timed_snapshot_windows")
    if windows:
        record["window_steps"] = int(windows)
        record["snapshots"], record["intervals"] = _snapshot_windows(int(windows))
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    module, _, name = str(ctx.train.timed).partition(":")
    function: Callable[[RunContext], Any] = getattr(importlib.import_module(module), name)

    original_iter = TrainLoop.__iter__

    def timed_iter(self: TrainLoop) -> Iterator[Any]:
        for item in original_iter(self):
            record["steps"].append([self.step, self.priming, now()])
            yield item
            record["steps"][-1].append(now())

    make_loop = ctx.loop

    @functools.wraps(make_loop)
    def timed_loop(*args: Any, **kwargs: Any) -> TrainLoop:
        record["loop_called"] = now()
        loop = make_loop(*args, **kwargs)
        record["loop_built"] = now()
        record["first_step"] = loop.first_step
        return loop

    TrainLoop.__iter__ = timed_iter  # type: ignore[method-assign]
    ctx.loop = timed_loop  # type: ignore[method-assign]
    try:
        return function(ctx)
    finally:
        record["ended"] = now()
        folder = ctx.run_dir / "timing"
        folder.mkdir(exist_ok=True)
        (folder / f"rank-{ctx.rank}-pid-{os.getpid()}.json").write_text(json.dumps(record))


def _snapshot_windows(steps: int) -> tuple[list[int], list[int]]:
    """One snapshot due at the first boundary of each even window of `steps` steps (the one that
    keeps the state after 2kW steps), none elsewhere; the lists each due step and the interval the
    cadence would choose at each boundary are appended to (rank 0's)."""
    from slurmddp.job.train.snapshots import Snapshots

    kept: list[int] = []
    intervals: list[int] = []
    due_after = Snapshots.due_after

    def windowed(self: Snapshots, step: int, first_step: int, paused: bool) -> bool:
        due_after(self, step, first_step, paused)  # the cadence's estimates, from every boundary
        intervals.append(self.cadence.interval())
        due = (step + 1) % (2 * steps) == 0
        if due:
            kept.append(step + 1)
        return due

    Snapshots.due_after = windowed  # type: ignore[method-assign]
    return kept, intervals


def _cheap_seeds() -> None:
    import random

    import torch
    from torch.utils.data import get_worker_info

    from slurmddp.job.train import data

    def getitem(self: data._PerSampleSeeded, index: int) -> Any:
        if get_worker_info() is not None:
            seed = data.sample_seed(self.seed, int(self.epoch), index)
            torch.default_generator.manual_seed(seed)
            random.seed(seed)
            data._seed_numpy(seed)
        return self.dataset[index]

    data._PerSampleSeeded.__getitem__ = getitem  # type: ignore[method-assign]


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
