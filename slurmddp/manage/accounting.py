"""What a run cost: CPU hours, GPU hours and the time lost to requeues, over every allocation of
every job it had. Pure: the allocations come from sacct --duplicates (slurm.allocations), the
attempt records from RUN_DIR/attempts.jsonl.

    cpu_hours   the sum over all allocations of CPUTimeRAW (elapsed x allocated CPUs) / 3600.
    gpu_hours   the sum over all allocations of elapsed x the gres/gpu count in AllocTRES / 3600
                (0 on a cluster whose AccountingStorageTRES lacks gres/gpu: sacct lists no GPUs).
    lost_hours  for each allocation that ended in a requeue (another allocation of the same job
                followed it, or Slurm holds the job pending again):
                  the work redone: from the attempt's last durable checkpoint to the allocation's
                    end. An attempt that stopped for a preemption or its time limit saved a
                    checkpoint before it wrote its end record, so only the time after that record
                    counts; for any other (a crash, a killed batch script, a requeue from outside
                    slurmddp) checkpoint times are not kept, and its whole elapsed time counts;
                  plus the wait: from its end to the next allocation's start (to now while pending).
                The restart of the next attempt (imports, loading the checkpoint) is not counted,
                nor anything about a job that ended for good (a resubmit starts a new job).

Local runs have no allocations: their figures are None, not zero.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from slurmddp.cluster.slurm import Allocation, JobState
from slurmddp.rundir.records import AttemptEvent, End

PENDING_AGAIN: frozenset[JobState] = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
"""squeue states of a job whose last allocation has ended and that is waiting to run again."""
# The end records this many seconds around an allocation's [Start, End] belong to it: sacct's
# times have a resolution of one second.
CLOCK_SLACK_S = 2.0
# A job id submitted this long before the run's own submission is another job that had the same
# id (ids restart on a new cluster; `sacct -D` lists them all).
SUBMIT_SLACK_S = 300.0
_STOPPED_AT_CHECKPOINT = frozenset({"preemption", "timeout"})


@dataclass(frozen=True)
class Usage:
    cpu_hours: float
    gpu_hours: float
    lost_hours: float


def usage(
    allocations: Sequence[Allocation],
    records: Sequence[AttemptEvent],
    now: float,
    pending: Collection[str] = (),
) -> Usage:
    """The figures of one run from its allocations (of all its jobs), its attempt records and the
    job ids Slurm has pending now."""
    cpu = gpu = lost = 0.0
    for job, ordered in _by_job(allocations).items():
        for position, allocation in enumerate(ordered):
            cpu += allocation.cpu_seconds
            gpu += allocation.gpu_seconds
            following = ordered[position + 1] if position + 1 < len(ordered) else None
            requeued = following is not None or allocation.state == "REQUEUED" or job in pending
            if not requeued or allocation.end is None:
                continue
            lost += _redone_s(allocation, allocation.end, records)
            resumed = None if following is None else following.start or following.end
            lost += max(0.0, (now if resumed is None else resumed) - allocation.end)
    return Usage(cpu / 3600, gpu / 3600, lost / 3600)


def total(usages: Iterable[Usage | None]) -> Usage | None:
    """The sum over a sweep's elements; None when no element has figures (a local sweep)."""
    known = [u for u in usages if u is not None]
    if not known:
        return None
    return Usage(
        sum(u.cpu_hours for u in known), sum(u.gpu_hours for u in known), sum(u.lost_hours for u in known)
    )


def submitted_since(allocations: Iterable[Allocation], since: float | None) -> list[Allocation]:
    """The allocations not submitted before the run was (minus a slack for clocks): older ones are
    other jobs that had the same id."""
    if since is None:
        return list(allocations)
    return [a for a in allocations if a.submit is None or a.submit >= since - SUBMIT_SLACK_S]


def _by_job(allocations: Iterable[Allocation]) -> dict[str, list[Allocation]]:
    """Each job's allocations in the order they ran; one that has not started goes last."""
    jobs: dict[str, list[Allocation]] = {}
    for allocation in allocations:
        jobs.setdefault(allocation.job_id, []).append(allocation)
    for ordered in jobs.values():
        ordered.sort(key=lambda a: (a.start is None, a.start or 0.0, a.submit or 0.0))
    return jobs


def _redone_s(allocation: Allocation, end: float, records: Sequence[AttemptEvent]) -> float:
    """Seconds of the allocation (which ended at `end`) after its last durable checkpoint (see the
    module docstring)."""
    began = allocation.start if allocation.start is not None else end
    for record in records:
        stopped = (
            isinstance(record, End)
            and record.requeue
            and record.reason in _STOPPED_AT_CHECKPOINT
            and record.step is not None
            and record.attempt_id is not None
            and record.attempt_id.job_id == allocation.raw_id
        )
        if stopped and began - CLOCK_SLACK_S <= record.time <= end + CLOCK_SLACK_S:
            return max(0.0, end - record.time)
    return float(allocation.elapsed_s)
