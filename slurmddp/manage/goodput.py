"""A run's goodput: the share of its allocated time that trained, and where the rest went (in the
spirit of Google's ML Goodput split), worked out from its attempt records alone: each attempt's
begin and end in RUN_DIR/attempts.jsonl, and the phases its rank 0 recorded (records.Phases,
copied into the end record; progress.json for the attempt still running).

    allocated    every attempt's begin to its end, and the restarts between them: the allocations'
                 time (the batch script's own second before the first begin is not counted)
    training     an attempt's first step's end to its last recorded step, less its checkpoint
                 stalls and the steps it made again
    starts       an attempt's begin to its first step's end (the interpreter, imports, process
                 group, checkpoint load); all of an attempt that made no step (or recorded none)
    checkpoints  the seconds saves held the training up
    redone       the steps an attempt made that an earlier one had made (a crash resumes from the
                 last checkpoint), at that attempt's mean step time
    stops        the last recorded step to the attempt's end: a stop's save, the time to find a
                 crash out, the ranks' exit (and up to PROGRESS_EVERY_S of steps not yet recorded)
    restarts     an attempt's end to the next attempt's begin inside the same allocation
    idle spares  the spare nodes' share of every allocation (resources.spare_nodes)
    queue        not allocated: submission (or a resubmit) to the first begin, and each requeue's
                 wait; while the run waits, until now

The parts of `allocated` add up to it; goodput = training / allocated x (1 - the spares' share).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from slurmddp.manage.numbers import duration
from slurmddp.rundir.records import AttemptEvent, Begin, End, Phases, Progress, Resubmit


@dataclass(frozen=True)
class Goodput:
    """Seconds of a run (summed over a sweep's elements) by where they went."""

    allocated_s: float = 0.0
    training_s: float = 0.0
    starts_s: float = 0.0
    checkpoints_s: float = 0.0
    redone_s: float = 0.0
    stops_s: float = 0.0
    restarts_s: float = 0.0
    spares_s: float = 0.0
    """Node-time of the idle spares, in seconds of the whole allocation (spares' share x allocated)."""
    queue_s: float = 0.0

    @property
    def share(self) -> float | None:
        """The share of the allocated node-time that trained; None before any allocation."""
        if self.allocated_s <= 0:
            return None
        return max(0.0, self.training_s * (1 - self.spares_s / self.allocated_s) / self.allocated_s)

    def __add__(self, other: Goodput) -> Goodput:
        return Goodput(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def total(parts: Iterable[Goodput | None]) -> Goodput | None:
    """A sweep's: the sum of its elements' seconds (None where no element has any)."""
    known = [part for part in parts if part is not None]
    return sum(known[1:], known[0]) if known else None


def of_run(
    records: Sequence[AttemptEvent],
    submitted_at: float | None,
    progress: Progress | None,
    running: bool,
    now: float,
    spare_share: float = 0.0,
) -> Goodput | None:
    """The goodput of a run from its attempt records, submitted at `submitted_at`; `progress`
    (progress.json) stands for the end record of an attempt still `running`; `spare_share`: the
    spare nodes' share of the allocation's nodes. None before its first attempt began, and for a
    run whose records keep no phases (written by a version before them)."""
    parts = dict.fromkeys((f.name for f in fields(Goodput)), 0.0)
    waiting_since = submitted_at
    begun: Begin | None = None
    ended: End | None = None
    reached = 0  # the furthest step any earlier attempt made
    for record in records:
        if isinstance(record, Resubmit):
            waiting_since, ended = record.time, None
        elif isinstance(record, Begin):
            if ended is not None and ended.in_job:
                parts["restarts_s"] += max(0.0, record.time - ended.time)
            elif waiting_since is not None:
                parts["queue_s"] += max(0.0, record.time - waiting_since)
            begun, ended, waiting_since = record, None, None
        elif isinstance(record, End) and begun is not None:
            phases, step = record.phases, record.step
            if phases is None and progress is not None and progress.attempt == begun.attempt_id:
                # An end record written from outside the job (a cancel's) knows no phases: the
                # attempt's progress.json does, up to the ranks' stop.
                phases, step = progress.phases, progress.step
            reached = _attempt(parts, begun, record.time, phases, step, reached)
            begun, ended = None, record
            waiting_since = record.time if record.requeue and not record.in_job else None
    if begun is not None and running:
        mine = progress if progress is not None and progress.attempt == begun.attempt_id else None
        _attempt(parts, begun, now, mine.phases if mine else None, mine.step if mine else None, reached)
    elif waiting_since is not None and running:
        parts["queue_s"] += max(0.0, now - waiting_since)
    allocated = sum(parts[name] for name in _ALLOCATED)
    ends = [record for record in records if isinstance(record, End)]
    if allocated <= 0 or (_unphased(ends) and (progress is None or progress.phases is None)):
        return None
    return Goodput(**{**parts, "allocated_s": allocated, "spares_s": allocated * spare_share})


def _unphased(ends: Sequence[End]) -> bool:
    """Records of a version that kept no phases: steps were made, but no attempt says when."""
    return any(end.step for end in ends) and not any(end.phases for end in ends)


_ALLOCATED = ("training_s", "starts_s", "checkpoints_s", "redone_s", "stops_s", "restarts_s")


def _attempt(
    parts: dict[str, float],
    begun: Begin,
    end: float,
    phases: Phases | None,
    step: int | None,
    reached: int,
) -> int:
    """Add one attempt's seconds to `parts`; the furthest step made after it."""
    span = max(0.0, end - begun.time)
    if phases is None or phases.first_step_at is None or step is None:
        parts["starts_s"] += span
        return max(reached, step or 0)
    first = min(max(phases.first_step_at, begun.time), end)
    last = min(max(phases.last_step_at, first), end)
    steady = last - first
    saves = min(phases.save_s, steady)
    # Steps after the first one, which ended at `first`: those the steady part ran.
    after_first = step - phases.started_step - 1
    mean = (steady - saves) / after_first if after_first > 0 else 0.0
    redone = min(max(0, reached - phases.started_step - 1), max(after_first, 0)) * mean
    parts["starts_s"] += first - begun.time
    parts["checkpoints_s"] += saves
    parts["redone_s"] += redone
    parts["training_s"] += steady - saves - redone
    parts["stops_s"] += end - last
    return max(reached, step)


def describe(goodput: Goodput) -> str:
    """One line: "goodput 87.1% of 312.0 s allocated: training 271.8 s; starts 12.0 s (3.8%), ...;
    queue 70.2 s (not allocated)"."""
    allocated = goodput.allocated_s
    lost = [
        ("starts", goodput.starts_s),
        ("checkpoint stalls", goodput.checkpoints_s),
        ("steps redone", goodput.redone_s),
        ("stops", goodput.stops_s),
        ("restarts", goodput.restarts_s),
    ]
    where = [
        f"{label} {_span(seconds)} ({100 * seconds / allocated:.1f}%)" for label, seconds in lost if seconds
    ]
    if goodput.spares_s:
        where.append(f"idle spares {100 * goodput.spares_s / allocated:.1f}% of the nodes' time")
    return (
        f"goodput {100 * (goodput.share or 0.0):.1f}% of {_span(allocated)} allocated: training "
        f"{_span(goodput.training_s)}; {', '.join(where) or 'nothing else'}; queue "
        f"{_span(goodput.queue_s)} (not allocated)"
    )


def _span(seconds: float) -> str:
    """Tenths of a second up to ten minutes (a restart's cost shows), then H:MM:SS."""
    return f"{seconds:.1f} s" if seconds < 600 else duration(seconds)
