"""How fast the training runs, measured by the loop itself: no change to the user's code.

Each step (after `telemetry.warmup_steps`) every rank records
- its step time: from asking the loader for the batch to the end of the user's step (a checkpoint
  save at the boundary is not in it);
- the time it waited for that batch;
- its gradient all-reduces, timed by a DDP communication hook that does what DDP's own path does
  (the bucket is multiplied by 1/world_size, then all-reduced: the same bits), with wall clocks on
  CPU and CUDA events on GPUs: `comm_s`, the time at least one bucket was in flight, and
  `exposed_s`, the part of it after the last bucket was launched, when backward's compute was
  done and nothing was left to hide it behind. A bucket's all-reduce ends when the last rank has
  joined it, so a rank's `comm_s` holds its wait for slower ranks too; the least `comm_s` over the
  ranks (`comm_min_s`) is the transfer alone.
Every `telemetry.every_s` seconds (rank 0 decides, the loop's boundary all-reduce carries it, so
every rank is at the same step) the ranks gather their figures in one small all-gather and rank 0
logs them as `perf/...` metrics; at the end of the loop the totals since warm-up become the
`telemetry` summary of result.json, with the latency of a barrier measured once at the start.
The cost is a few clock reads a step and one Python call a bucket.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmddp.experiment import schema
from slurmddp.job.train import stragglers
from slurmddp.rundir.layout import PERF

BARRIERS = 10
"""Timed barriers at the start of each attempt (after one untimed, which sets up connections)."""
# The sums of a stretch of steps each rank keeps, in the order `_Gathered` reads them back.
_SUMS = ("steps", "step_s", "data_s", "comm_s", "exposed_s", "buckets")
_TIMER = "_slurmddp_comm_timer"
"""The attribute of a DDP module that holds the CommTimer its hook reports to."""


def transport(backend: str, env: Mapping[str, str]) -> str:
    """How gradients travel between nodes: `tcp` (gloo, or NCCL kept off InfiniBand), `ib`/`roce`
    (NCCL on a verbs HCA, RoCE when a GID index is set), `auto` (NCCL left to choose)."""
    if backend != "nccl" or env.get("NCCL_NET", "").lower() == "socket" or env.get("NCCL_IB_DISABLE") == "1":
        return "tcp"
    if env.get("NCCL_IB_HCA"):
        return "roce" if env.get("NCCL_IB_GID_INDEX") else "ib"
    return "auto"


def busy_time(intervals: Sequence[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: buckets queued behind one another are
    not counted twice."""
    total = 0.0
    reach = float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def exposed_time(intervals: Sequence[tuple[float, float]]) -> float:
    """Communication after the last bucket was launched: what the step waited for with no compute
    left to overlap it."""
    if not intervals:
        return 0.0
    return max(0.0, max(end for _, end in intervals) - max(start for start, _ in intervals))


class CommTimer:
    """The communication hook of one or more DDP modules, and the intervals of the current step."""

    def __init__(self, device: Any) -> None:
        self._cuda = getattr(device, "type", "cpu") == "cuda"
        # A clock read on CPU, a CUDA event on the current stream on a GPU.
        self._mark: Callable[[], Any] = _event if self._cuda else time.perf_counter
        self._starts: list[Any] = []
        self._ends: list[Any] = []
        self.bucket_bytes: list[int] = []
        """The sizes of the buckets of the last step measured."""

    def hook(self, group: Any, bucket: Any) -> Any:
        """DDP's default all-reduce, timed. Registered with the module's process group as state.
        It runs for every bucket of every step: it calls the process group directly, as DDP's own
        reducer does, without torch.distributed.all_reduce's Python checks."""
        buffer = bucket.buffer()
        self._starts.append(self._mark())
        self.bucket_bytes.append(buffer.nbytes)
        # The reducer's own path multiplies by the reciprocal while copying into the bucket;
        # div_ would round differently and change the run's bits.
        buffer.mul_(1.0 / group.size())
        ends, mark = self._ends, self._mark

        def done(fut: Any) -> Any:
            # On CPU this runs in gloo's thread as the all-reduce completes; on a GPU the event is
            # recorded on a stream that waits for NCCL's kernel.
            ends.append(mark())
            return fut.value()[0]

        return group.allreduce([buffer]).get_future().then(done)

    def take(self) -> list[tuple[float, float]]:
        """The (start, end) seconds of every bucket since the last call, and forget them. Called
        after the step, when DDP has waited for every bucket."""
        starts, ends = self._starts, self._ends
        self._starts, self._ends = [], []
        if len(starts) != len(ends) or not starts:
            return []
        self.bucket_bytes = self.bucket_bytes[-len(starts) :]
        if not self._cuda:
            return list(zip(starts, ends, strict=True))
        ends[-1].synchronize()
        origin = starts[0]
        return [
            (origin.elapsed_time(s) / 1000, origin.elapsed_time(e) / 1000)
            for s, e in zip(starts, ends, strict=True)
        ]

    def discard(self) -> None:
        """Forget the buckets of a step that is not measured (warm-up, a priming step)."""
        self._starts, self._ends = [], []
        self.bucket_bytes = []


def _event() -> Any:
    import torch

    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def attach(modules: Sequence[Any], timer: CommTimer) -> bool:
    """Time the all-reduces of every DDP module with `timer`; False when one of them cannot be:

    - it has a hook of the user's (a module takes one hook, once);
    - it keeps gradients as bucket views (ddp.gradient_as_bucket_view): when those gradients are
      zeroed in place, DDP's own path divides the bucket where the hook would multiply, other bits.
    A module timed by an earlier loop's timer is handed to this one.
    """
    measured = True
    for module in modules:
        if isinstance(getattr(module, _TIMER, None), CommTimer):
            setattr(module, _TIMER, timer)
            continue
        if module._comm_hooks or module.gradient_as_bucket_view:
            measured = False
            continue
        setattr(module, _TIMER, timer)
        try:
            # A lambda: DDP refuses a hook whose annotations are strings (`from __future__`). It
            # looks the timer up on each call, so that a later loop can take the module over.
            module.register_comm_hook(
                module.process_group, lambda group, bucket, m=module: getattr(m, _TIMER).hook(group, bucket)
            )
        except RuntimeError:  # a built-in hook of the user's (register_builtin_comm_hook)
            # DDP records the Python hook before its reducer refuses it.
            module._comm_hooks.pop()
            delattr(module, _TIMER)
            measured = False
    return measured


@dataclass(frozen=True)
class _Gathered:
    """One rank's row of the all-gather (`Telemetry._gather` lays it out)."""

    window: dict[str, float]
    """The sums since the last record."""
    total: dict[str, float]
    """The sums since warm-up."""
    barrier_s: float
    peak: float
    node: int
    """The rank's node in the step (SLURM_NODEID)."""

    @classmethod
    def of(cls, row: Sequence[float]) -> _Gathered:
        n = len(_SUMS)
        return cls(
            dict(zip(_SUMS, row[:n], strict=True)),
            dict(zip(_SUMS, row[n : 2 * n], strict=True)),
            row[2 * n],
            row[2 * n + 1],
            int(row[2 * n + 2]),
        )


class Telemetry:
    """One rank's measurements, the exchange of them, and rank 0's records."""

    def __init__(
        self,
        settings: schema.Telemetry,
        *,
        rank: int,
        world_size: int,
        device: Any,
        samples_per_step: int | None,
        backend: str,
        transport: str,
        log: Callable[..., None],
        node: int = 0,
        slow: Callable[[stragglers.Straggler | None, int], None] | None = None,
    ) -> None:
        self.settings = settings
        """The experiment's `telemetry:` section (warmup_steps, every_s)."""
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.samples_per_step = samples_per_step
        self.backend = backend
        self.transport = transport
        self._log = log
        self.node = node
        """This rank's node in the step."""
        self._slow = slow
        """Rank 0: told of the node named slow (or of none any more), with the step."""
        self._stragglers = stragglers.Watch()
        self.timer = CommTimer(device)
        self.comm_measured = False
        self._window = dict.fromkeys(_SUMS, 0.0)
        self._total = dict.fromkeys(_SUMS, 0.0)
        self._barrier_s = 0.0
        self._logged_at = time.monotonic()
        self._seen = 0
        self.summary: dict[str, Any] | None = None
        """The run's figures since warm-up (rank 0, after `finish`): result.json's `telemetry`."""

    def start(self, modules: Sequence[Any]) -> None:
        """Before the first step: hook the DDP modules, time a barrier."""
        self.comm_measured = attach(modules, self.timer) and bool(modules)
        self._barrier_s = barrier_latency(self.device)

    def due(self) -> bool:
        """Rank 0: time for a record (the loop's boundary all-reduce tells the other ranks)."""
        return time.monotonic() - self._logged_at >= self.settings.every_s

    def discard(self) -> None:
        self.timer.discard()

    def step(self, data_s: float, step_s: float) -> None:
        """One step done: its time and its wait for data; the hook's intervals are read here."""
        intervals = self.timer.take()
        self._seen += 1
        if self._seen <= self.settings.warmup_steps:
            return
        figures = {
            "steps": 1.0,
            "step_s": step_s,
            "data_s": data_s,
            "comm_s": busy_time(intervals),
            "exposed_s": exposed_time(intervals),
            "buckets": float(len(intervals)),
        }
        for key, value in figures.items():
            self._window[key] += value
            self._total[key] += value

    def exchange(self, step: int) -> None:
        """Collective: gather every rank's figures; rank 0 logs the window's. The same boundary on
        every rank (the loop's agreed flag), so the all-gather pairs up."""
        gathered = self._gather()
        started, self._logged_at = self._logged_at, time.monotonic()
        self._window = dict.fromkeys(_SUMS, 0.0)
        if self.rank == 0:
            self._record(step, gathered)
            self._watch(step, gathered, started)

    def finish(self, step: int) -> None:
        """Collective, at the end of the loop: the last record, and rank 0's summary."""
        gathered = self._gather()
        if self.rank != 0:
            return
        self._record(step, gathered)
        totals = [r.total for r in gathered]
        figures = self._figures(totals, [r.peak for r in gathered])
        if not figures:
            return
        steps = int(min(t["steps"] for t in totals))
        per_rank_step = [t["step_s"] / t["steps"] for t in totals]
        self.summary = {
            "steps": steps,
            **figures,
            "rank_samples_per_s": (
                [round(self.samples_per_step / self.world_size / s, 3) for s in per_rank_step]
                if self.samples_per_step
                else None
            ),
            "buckets": round(totals[0]["buckets"] / totals[0]["steps"]),
            "bucket_bytes": list(self.timer.bucket_bytes),
            "barrier_s": max(r.barrier_s for r in gathered),
            "backend": self.backend,
            "transport": self.transport,
            "comm_measured": self.comm_measured,
            "world_size": self.world_size,
            "samples_per_step": self.samples_per_step,
        }

    def _record(self, step: int, gathered: Sequence[_Gathered]) -> None:
        """Rank 0: log the figures of the steps since the last record as `perf/...` metrics."""
        figures = self._figures([r.window for r in gathered], [r.peak for r in gathered])
        peaks = figures.pop("peak_mem_bytes", None)
        if peaks:
            figures["peak_mem_gb"] = round(max(peaks) / 1e9, 3)
        if figures:
            self._log(step, **{f"{PERF}{key}": value for key, value in figures.items() if value is not None})

    def _watch(self, step: int, gathered: Sequence[_Gathered], started: float) -> None:
        """Rank 0: name a node that stays slow (job/train/stragglers.py), over the window's steps."""
        windows = [r.window for r in gathered]
        if self._slow is None or not self.comm_measured or any(w["steps"] == 0 for w in windows):
            return
        compute = [max(0.0, w["step_s"] - w["comm_s"]) / w["steps"] for w in windows]
        step_s = max(w["step_s"] / w["steps"] for w in windows)
        found = stragglers.slowest_node(compute, [r.node for r in gathered], step_s)
        if self._stragglers.seen(found, started, self._logged_at):
            self._slow(self._stragglers.named, step)

    def _figures(self, sums: Sequence[Mapping[str, float]], peaks: Sequence[float]) -> dict[str, Any]:
        """The figures of a stretch of steps, from every rank's sums: the pace is the slowest
        rank's (DDP keeps the ranks in step), fractions and communication are the ranks' mean."""
        if any(s["steps"] == 0 for s in sums):
            return {}
        step_s = max(s["step_s"] / s["steps"] for s in sums)
        comm_s = statistics.fmean(s["comm_s"] / s["steps"] for s in sums)
        exposed_s = statistics.fmean(s["exposed_s"] / s["steps"] for s in sums)
        return {
            "step_s": round(step_s, 6),
            "steps_per_s": round(1 / step_s, 3) if step_s > 0 else None,
            "samples_per_s": round(self.samples_per_step / step_s, 3)
            if self.samples_per_step and step_s > 0
            else None,
            "data_wait_frac": round(
                statistics.fmean(s["data_s"] / s["step_s"] for s in sums if s["step_s"] > 0), 4
            ),
            "comm_s": round(comm_s, 6) if self.comm_measured else None,
            # The rank that reached its buckets last waited for nobody: its time is the transfer,
            # and comm_s above it is the ranks' wait for one another.
            "comm_min_s": round(min(s["comm_s"] / s["steps"] for s in sums), 6)
            if self.comm_measured
            else None,
            "exposed_comm_s": round(exposed_s, 6) if self.comm_measured else None,
            "exposed_comm_frac": round(exposed_s / step_s, 4) if self.comm_measured and step_s > 0 else None,
            "peak_mem_bytes": [int(p) for p in peaks] if self.device.type == "cuda" else None,
        }

    def _gather(self) -> list[_Gathered]:
        import torch
        import torch.distributed as tdist

        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        mine = [*self._window.values(), *self._total.values(), self._barrier_s, float(peak), float(self.node)]
        local = torch.tensor(mine, dtype=torch.float64, device=self.device)
        rows = [torch.empty_like(local) for _ in range(self.world_size)]
        tdist.all_gather(rows, local)
        return [_Gathered.of(row.tolist()) for row in rows]


def barrier_latency(device: Any) -> float:
    """The median time of one barrier, once connections are up."""
    import torch
    import torch.distributed as tdist

    times = []
    for attempt in range(BARRIERS + 1):
        started = time.perf_counter()
        tdist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if attempt:
            times.append(time.perf_counter() - started)
    return statistics.median(times)
