"""What `submit --wait` shows at one moment, read from the files rank 0 writes: progress.json
(every ~2 s, by ctx.loop) and metrics.jsonl (at every ctx.log).

The two are written at different times: at 60 steps/s the progress record can be 120 steps behind
the metrics (what showed `step 0/176` beside the validation of epoch 2, logged at step 65). So the
step shown is the later of the two, and the epoch goes with it: the step on the screen is never
behind the metrics beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmddp.cluster.slurm import JobState
from slurmddp.manage.tail import Tail
from slurmddp.rundir.layout import METRICS, PERF
from slurmddp.rundir.metrics import MetricRecord
from slurmddp.rundir.records import AttemptId, End, LoopProgress, Progress, begins, read_attempts

RATE_SMOOTHING = 0.3
"""Weight of the newest speed: rank 0 writes progress.json every ~2 s, so a few records' average
steadies the ETA without hiding a change of speed for long."""
# What the job is doing before its loop reports, from the first words of rank 0's own lines.
STARTING_PHASES = (
    ("slurmddp: rank 0 of ", "ranks started; importing torch, joining the process group"),
    ("slurmddp: preflight ok", "process group up, preflight passed; your code is setting up"),
    ("slurmddp: resumed from ", "checkpoint loaded; resuming"),
)
STARTING = "starting the ranks"


@dataclass(frozen=True)
class Snapshot:
    """The state, step, speed and metrics of a followed job, as of one read."""

    state: JobState | None
    """The scheduler's state now; None once the job has left."""
    elapsed_s: float
    """Since `submit` handed the job over."""
    step: int | None
    """Steps done as progress.json says, or the step of the latest metrics where that is later
    (and for a run without ctx.loop, which writes no progress.json)."""
    total_steps: int | None = None
    epoch: int | None = None
    """The epoch of the current step, counted from 0, as ctx.loop and its metrics count it."""
    epochs: int | None = None
    attempt: int | None = None
    """Counted from 1: attempt 1 is the first."""
    rate: float | None = None
    """Steps per second; None until two records of one attempt tell."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The latest value of each number logged, in the order the names first came."""
    starting: str | None = None
    """What the job is doing before its training loop reports; None once it does."""

    @property
    def eta_s(self) -> float | None:
        if not self.total_steps or not self.rate or self.step is None:
            return None
        return max(self.total_steps - self.step, 0) / self.rate


class StepRate:
    """Steps per second between successive progress records of one attempt, smoothed.

    It starts over with each attempt: a requeued or resumed one restarts at its checkpoint's step,
    behind the last record of the attempt before."""

    def __init__(self) -> None:
        self.value: float | None = None
        self._last: tuple[AttemptId, int, float] | None = None
        """(attempt, step, time) of the latest record."""

    def update(self, progress: Progress) -> float | None:
        """The speed after `progress`; reading the same record again changes nothing."""
        record = (progress.attempt, progress.step, progress.time)
        last, self._last = self._last, record
        if last is None or record[0] != last[0] or record[1] < last[1]:
            self.value = None
        elif record[2] > last[2]:
            now = (record[1] - last[1]) / (record[2] - last[2])
            before = now if self.value is None else self.value
            self.value = RATE_SMOOTHING * now + (1 - RATE_SMOOTHING) * before
        return self.value


class LatestMetrics:
    """The latest value of each metric in metrics.jsonl, in the order the names first came.

    Values, not the last record: a loop that logs `loss` every step and `val_acc` once an epoch
    writes them in separate records, and the display shows both. The file grows for the whole run,
    so it is read on from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self._tail = Tail(path)
        self.values: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        lines = self._tail.new_lines()
        if self._tail.rewound:
            # A resumed attempt rewrote the file without the records past its checkpoint.
            self.values = {}
        for line in lines:
            record = MetricRecord.from_line(line)
            if record is not None:
                self.values.update(record.to_json())
        return self.values


def shown_metrics(values: dict[str, Any]) -> dict[str, float]:
    """The numbers a user logged: not the record's step and time, nor telemetry's perf/ figures."""
    return {
        name: value
        for name, value in values.items()
        if name not in ("step", "time")
        and not name.startswith(PERF)
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }


class RunWatch:
    """Snapshots of one run directory, read on as its files grow."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.metrics = LatestMetrics(run_dir / METRICS)
        self.rate = StepRate()
        self.record: Progress | None = None
        self.phase = STARTING

    def note(self, line: str) -> None:
        """One of rank 0's lines: it tells how far the start has come."""
        for prefix, phase in STARTING_PHASES:
            if line.startswith(prefix):
                self.phase = phase

    def snapshot(self, state: JobState | None, elapsed_s: float) -> Snapshot:
        # Not written yet, or unreadable: the previous record stands.
        self.record = Progress.read(self.run_dir) or self.record
        values = self.metrics.read()
        logged = values.get("step")
        metrics = shown_metrics(values)
        record = self.record
        if record is None:
            return Snapshot(
                state,
                elapsed_s,
                logged if isinstance(logged, int) else None,
                metrics=metrics,
                starting=None if metrics else self.phase,
            )
        step = max(record.step, logged) if isinstance(logged, int) else record.step
        events = read_attempts(self.run_dir)
        if events and isinstance(events[-1], End) and events[-1].step is not None:
            # Between an attempt's end and the next begin: the step it stopped and saved at, which
            # the progress record, written every few seconds, may not have reached (600 of a stop
            # at 601 was shown while the job waited in the queue).
            step = max(step, events[-1].step)
        loop = record.loop
        return Snapshot(
            state,
            elapsed_s,
            step,
            total_steps=loop.total_steps if loop is not None else None,
            epoch=_epoch(loop, record.step, step) if loop is not None else None,
            epochs=loop.epochs if loop is not None else None,
            # Each attempt's begin is recorded; restarts inside an allocation leave Slurm's count as is.
            attempt=max(len(begins(events)), record.attempt.restart_count + 1),
            rate=self.rate.update(record),
            metrics=metrics,
        )


def _epoch(loop: LoopProgress, recorded_step: int, step: int) -> int | None:
    """The epoch of `step`, where the metrics are ahead of the progress record's own: epochs of
    equal length (a last one cut short is counted as if whole), never before the record's."""
    # The loop reports epoch 0 of no epochs when it is not given `data`.
    if loop.epoch is None or not loop.epochs:
        return None
    if step <= recorded_step or not loop.total_steps:
        return loop.epoch
    return max(loop.epoch, min(step * loop.epochs // loop.total_steps, loop.epochs - 1))
