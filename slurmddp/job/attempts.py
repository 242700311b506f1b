"""The batch script's side of requeueing: record every attempt, decide whether to requeue, requeue.

    python -m slurmddp.job.attempts begin RUN_DIR           (before srun)
    python -m slurmddp.job.attempts end RUN_DIR STATUS      (after srun, with srun's exit status)

It runs in the batch script, on the job's first node and outside any container the ranks may run
in, so `squeue`/`scontrol` are at hand even when the ranks' image lacks them. The history lives in
RUN_DIR/attempts.jsonl (job/records.py), not in a pickle: sacct shows only a job's last
allocation, and this log is what `status` and the budgets read. The policy is job/requeue.py.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from slurmddp.cluster import slurm
from slurmddp.defaults import EXIT_FINISHED
from slurmddp.job import records
from slurmddp.job.records import CANCELLED, AttemptId, Begin, End, Exclusions
from slurmddp.job.requeue import (
    Decision,
    FailedNodes,
    PartitionNodes,
    PreemptTime,
    Settings,
    TimeLeft,
    decide,
    leave_out_failed_nodes,
    progress_step,
    requeue_target,
)


def begin(
    run_dir: Path,
    env: Mapping[str, str],
    now: float,
    failed_nodes: FailedNodes = slurm.failed_nodes,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
) -> int:
    """Record the start of an attempt (and the silent end of a previous one that was killed), and
    leave out the nodes that went down under the previous attempt (Slurm's NODE_FAIL)."""
    events = records.read_attempts(run_dir)
    final = records.final_end(events)
    if final is not None:
        print(f"slurmddp: this run already ended ({final.message}); not starting again", file=sys.stderr)
        return EXIT_FINISHED
    started = len(records.begins(events))
    era = records.current(events)
    if len(records.begins(era)) > len(records.ends(era)):
        # The previous attempt's batch script was killed before it could say how it ended
        # (e.g. preempted past GraceTime): Slurm requeued it by itself.
        killed = End(
            "killed",
            progress_step(run_dir),
            now,
            requeue=True,
            final=False,
            message="the batch script was killed before the attempt ended",
            attempt=started - 1,
        )
        records.append_attempt(run_dir, killed)
    leave_out_failed_nodes(run_dir, env, now, failed_nodes, partition_nodes)
    records.append_attempt(
        run_dir,
        Begin(started, now, socket.gethostname(), env.get("SLURM_JOB_NODELIST", ""), AttemptId.from_env(env)),
    )
    return 0


def end(
    run_dir: Path,
    status: int,
    env: Mapping[str, str],
    now: float,
    preempt_time: PreemptTime,
    time_left: TimeLeft = slurm.time_left,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
    failed_nodes: FailedNodes = slurm.failed_nodes,
) -> int:
    """Record how this attempt ended and requeue it if it goes around again. Rank 0 calls this
    right after a stop; the batch script calls it after srun, and then only repeats the requeue
    if rank 0 already recorded one (the job being still alive means that requeue failed)."""
    events = records.read_attempts(run_dir)
    final = records.final_end(events)
    if final is not None and final.reason == CANCELLED:
        # `slurmddp cancel` marked the run before scancel; requeueing now would revive it
        # (scontrol requeue takes a job cancelled a moment ago, seen on 22.05.8).
        print("slurmddp: the run was cancelled; not requeueing", file=sys.stderr)
        return 1
    me = AttemptId.from_env(env)
    settings = Settings.of_run(run_dir)
    last = events[-1] if events else None
    if isinstance(last, End) and last.attempt_id == me:
        decision = Decision(last.reason, last.step, last.requeue, last.message)
    else:
        decision = decide(
            run_dir, status, env, settings, preempt_time, time_left, partition_nodes, failed_nodes
        )
        attempt = max(0, len(records.begins(events)) - 1)
        if decision.leave_out:
            Exclusions.read(run_dir).adding(decision.leave_out, attempt, now).write(run_dir)
        ended = End(
            decision.reason,
            decision.step,
            now,
            requeue=decision.requeue,
            final=not decision.requeue,
            message=decision.message,
            attempt=attempt,
            status=status,
            attempt_id=me,
        )
        records.append_attempt(run_dir, ended)
        print(f"slurmddp: attempt ended: {decision.message}", file=sys.stderr)
    if not decision.requeue:
        return 0 if decision.reason == "completed" else 1
    target = requeue_target(env)
    found = set(Exclusions.read(run_dir).hosts)
    # The user's resources.exclude too: the update replaces the job's list.
    hosts = sorted(found | settings.user_excluded()) if found else []
    refused = slurm.requeue_excluding(target, hosts) if hosts else slurm.requeue(target)
    if refused is not None:
        # The job may already be on its way back (a preemption in REQUEUE mode requeues by itself).
        print(f"slurmddp: scontrol requeue {target}: {refused}", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    # A sweep's batch script names the sweep directory and its submission; the array task picks
    # the element it runs from the sweep manifest.
    if len(argv) in (4, 5) and argv[-2] == "--submission":
        run_dir = records.element_dir(Path(argv[1]), int(argv[-1]), os.environ)
        argv = [argv[0], str(run_dir), *argv[2:-2]]
    if len(argv) == 2 and argv[0] == "begin":
        return begin(Path(argv[1]), os.environ, time.time())
    if len(argv) == 3 and argv[0] == "end":
        return end(Path(argv[1]), int(argv[2]), os.environ, time.time(), slurm.preempt_time)
    print(
        "usage: python -m slurmddp.job.attempts begin RUN_DIR | end RUN_DIR STATUS "
        "(each optionally followed by --submission N for a sweep)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
