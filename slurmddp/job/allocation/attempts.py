"""The batch script's side of requeueing: record every attempt, decide whether to requeue, requeue.

    python -m slurmddp.job.allocation.attempts begin RUN_DIR           (before srun)
    python -m slurmddp.job.allocation.attempts end RUN_DIR STATUS      (after srun, with srun's exit status)

`end` exits EXIT_RESTART_IN_JOB where a failed attempt goes around again inside the allocation
(requeue.in_job_restarts): the batch script runs `begin` and srun again, a new step, counting the
restarts in IN_JOB_RESTART_ENV.

A local run has no batch script: its rank 0 records each attempt itself (`begin_local`,
`end_local`), and submitit's local controller starts the ranks again when one exits with
LOCAL_REQUEUE_STATUS.

The batch script's side runs on the job's first node and outside any container the ranks may run
in, so `squeue`/`scontrol` are at hand even when the ranks' image lacks them. The history lives in
RUN_DIR/attempts.jsonl (rundir/records.py), not in a pickle: sacct shows only a job's last
allocation, and this log is what `status` and the budgets read. The policy is job/allocation/requeue.py.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from slurmddp.cluster import hostlist, slurm
from slurmddp.defaults import EXIT_FINISHED, EXIT_RESTART_IN_JOB, IN_JOB_RESTART_ENV
from slurmddp.files import write_atomic
from slurmddp.job.allocation.outcome import (
    FailedNodes,
    Local,
    PartitionNodes,
    PreemptTime,
    Settings,
    TimeLeft,
    leave_out_failed_nodes,
    progress_step,
    requeue_target,
    step_hosts,
)
from slurmddp.job.allocation.requeue import Decision, decide, decide_local
from slurmddp.rundir import records, watchkey
from slurmddp.rundir.layout import LOGS, STEP_HOSTS, SWEEP
from slurmddp.rundir.manifest import SweepManifest
from slurmddp.rundir.records import CANCELLED, AttemptEvent, AttemptId, Begin, End, Exclusions, Progress
from slurmddp.search import trial


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
    _record_killed(run_dir, events, now)
    leave_out_failed_nodes(run_dir, env, now, failed_nodes, partition_nodes)
    me = AttemptId.from_env(env)
    begun = records.latest_of_allocation(events, dataclasses.replace(me, in_job_restart=-1))
    if begun.in_job_restart >= me.in_job_restart:
        # A resident launcher restarted in the step after the batch script last counted: the ranks
        # of the step placed here are told the number that follows.
        me = dataclasses.replace(me, in_job_restart=begun.in_job_restart + 1)
        print(f"export {IN_JOB_RESTART_ENV}={me.in_job_restart}")
    settings = Settings.of_run(run_dir)
    nodes = env.get("SLURM_JOB_NODELIST", "")
    excluded = Exclusions.read(run_dir)
    # The step runs without this allocation's suspects too; the queue is asked to leave out only
    # the hosts left out for good.
    bad = set(excluded.applying_to(me)) | settings.user_excluded()
    lasting = set(excluded.hosts) | settings.user_excluded()
    if settings.resources.spare_nodes:
        hosts = step_hosts(env, settings, bad)
        if hosts is None:
            return _requeue_without(
                lasting, env, f"too few good nodes left in allocation {nodes} to train on"
            )
        nodes = ",".join(hosts)
        # The batch script evaluates this: srun then starts the step on these hosts only.
        print(place_step(run_dir, me, hosts, settings.resources.ranks_per_node))
    elif me.in_job_restart and bad & set(hostlist.expand(nodes)):
        # A node went down after the last attempt's end looked (Slurm's view lags a moment): a
        # new step here would start on it.
        return _requeue_without(
            lasting, env, f"{', '.join(sorted(bad & set(hostlist.expand(nodes))))} went down"
        )
    records.append_attempt(run_dir, Begin(started, now, socket.gethostname(), nodes, me))
    # Before any rank looks for it: on a shared file system a node that asked for the name before
    # it existed may be told it is missing for a while (NFS caches the answer).
    watchkey.run_key(run_dir)
    return 0


def claim_trial(run_dir: Path) -> int:
    """A search's element, before its ranks start: its trial, asked of the study on its first
    start (the ranks read its values from RUN_DIR/trial.json). A study that cannot be reached
    ends the attempt as a failure, before any rank started."""
    if not (run_dir.parent / SWEEP).is_file():
        return 0
    index = next(
        (e.index for e in SweepManifest.read(run_dir.parent).elements if e.dir == run_dir.name), None
    )
    try:
        claimed = trial.claim(run_dir.parent, run_dir, index if index is not None else 0)
    except Exception as exc:
        print(f"slurmddp: could not ask the search's study for this trial: {exc!r}", file=sys.stderr)
        return 1
    if claimed is not None:
        values = " ".join(f"{k.removeprefix('train.')}={v}" for k, v in claimed.params.items())
        print(f"slurmddp: trial {claimed.number}: {values}", file=sys.stderr)
    return 0


def _record_killed(run_dir: Path, events: list[AttemptEvent], now: float) -> None:
    """Record the end of the previous attempt where it has none."""
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
            attempt=len(records.begins(events)) - 1,
        )
        records.append_attempt(run_dir, killed)


def _requeue_without(bad: set[str], env: Mapping[str, str], why: str) -> int:
    """No step can start in this allocation: back to the queue, leaving out the `bad` nodes (none:
    the job's excluded nodes stay as they are). The batch script's status: EXIT_FINISHED (it
    exits, and the requeued job starts it again)."""
    target = requeue_target(env)
    without = f" without {', '.join(sorted(bad))}" if bad else ""
    print(f"slurmddp: {why}; requeueing {target}{without}", file=sys.stderr)
    refused = slurm.requeue_excluding(target, sorted(bad)) if bad else slurm.requeue(target)
    if refused is not None:
        print(f"slurmddp: scontrol requeue {target}: {refused}", file=sys.stderr)
        return 1
    return EXIT_FINISHED


def place_step(run_dir: Path, attempt: AttemptId, hosts: list[str], per_node: int) -> str:
    """Shell exports that make the batch script's srun run `per_node` tasks on each of `hosts`:
    a host file (srun reads SLURM_HOSTFILE as its --nodelist, one line a task) and the counts."""
    path = run_dir / STEP_HOSTS / f"{attempt.job_id}.{attempt.restart_count}.{attempt.in_job_restart}"
    write_atomic(path, "".join(f"{host}\n" * per_node for host in hosts))
    counts = {
        "SLURM_HOSTFILE": str(path),
        "SLURM_NNODES": str(len(hosts)),
        "SLURM_NTASKS": str(len(hosts) * per_node),
        # What srun checks --ntasks-per-node against ("can't honor --ntasks-per-node" otherwise);
        # the requeue policy reads the allocation's size from the config, not from here.
        "SLURM_JOB_NUM_NODES": str(len(hosts)),
    }
    return "export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in counts.items())


def end(
    run_dir: Path,
    status: int,
    env: Mapping[str, str],
    now: float,
    preempt_time: PreemptTime,
    time_left: TimeLeft = slurm.time_left,
    partition_nodes: PartitionNodes = slurm.partition_nodes,
    failed_nodes: FailedNodes = slurm.failed_nodes,
    logs: Path | None = None,
) -> int:
    """Record how this attempt ended and requeue it if it goes around again. Rank 0 calls this
    right after a stop; the batch script calls it after srun, and then only repeats the requeue
    if rank 0 already recorded one (the job being still alive means that requeue failed). `logs`:
    submitit's folder of the ranks' logs."""
    events = records.read_attempts(run_dir)
    final = records.final_end(events)
    if final is not None and final.reason == CANCELLED:
        # `slurmddp cancel` marked the run before scancel; requeueing now would revive it
        # (scontrol requeue takes a job cancelled a moment ago, seen on 22.05.8).
        print("slurmddp: the run was cancelled; not requeueing", file=sys.stderr)
        _finish_trial(run_dir, final.reason, final.message)
        if logs is not None and requeue_target(env):
            # The batch script (or a resident launcher's task 0) once every rank has ended: the
            # ranks stopped and saved for `cancel`, which scancels the job if it is still there;
            # the job ends itself first, so that Slurm accounts it CANCELLED and not FAILED.
            slurm.cancel_quietly(requeue_target(env))
        return 1
    me = records.latest_of_allocation(events, AttemptId.from_env(env))
    settings = Settings.of_run(run_dir)
    last = events[-1] if events else None
    if isinstance(last, End) and last.attempt_id == me:
        decision = Decision(last.reason, last.step, last.requeue, last.message, in_job=last.in_job)
    else:
        decision = decide(
            run_dir, status, env, settings, preempt_time, time_left, partition_nodes, failed_nodes, logs
        )
        _record_end(run_dir, events, me, status, decision, now)
        print(f"slurmddp: attempt ended: {decision.message}", file=sys.stderr)
    if decision.in_job:
        return EXIT_RESTART_IN_JOB
    if not decision.requeue:
        _finish_trial(run_dir, decision.reason, decision.message)
        return 0 if decision.reason in ("completed", "pruned") else 1
    return _requeue(run_dir, env, settings)


def _finish_trial(run_dir: Path, reason: str, message: str) -> None:
    """A search's element ended for good: its study is told how. The run's own end stands if the
    study cannot be reached (its trial then stays RUNNING there)."""
    try:
        trial.finish(run_dir, reason, message)
    except Exception as exc:
        print(f"slurmddp: warning: could not tell the study how the trial ended: {exc!r}", file=sys.stderr)


def restart_in_place(run_dir: Path, env: Mapping[str, str], now: float) -> int | None:
    """A resident launcher's task 0, once `end` decided on a restart in the allocation: where the
    next attempt runs on the nodes of the step that runs (no spares, which `begin` may place
    elsewhere), record its begin and return its number; None leaves the restart to the batch script."""
    if Settings.of_run(run_dir).resources.spare_nodes:
        return None
    following = AttemptId.from_env(env).in_job_restart + 1
    if begin(run_dir, {**env, IN_JOB_RESTART_ENV: str(following)}, now) != 0:
        return None
    return following


def _record_end(
    run_dir: Path, events: list[AttemptEvent], me: AttemptId, status: int, decision: Decision, now: float
) -> End:
    """Record how attempt `me` ended, and the hosts its decision leaves out or sets aside."""
    attempt = max(0, len(records.begins(events)) - 1)
    if decision.leave_out or decision.set_aside:
        excluded = Exclusions.read(run_dir).adding(decision.leave_out, attempt, now)
        excluded.setting_aside(decision.set_aside, attempt, now, me.allocation).write(run_dir)
    progress = Progress.read(run_dir)
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
        in_job=decision.in_job,
        signature=decision.signature,
        phases=progress.phases if progress is not None and progress.attempt == me else None,
    )
    records.append_attempt(run_dir, ended)
    return ended


def _requeue(run_dir: Path, env: Mapping[str, str], settings: Settings) -> int:
    """scontrol requeue, leaving out the hosts the run leaves out for good."""
    target = requeue_target(env)
    # Those left out for good, not this allocation's suspects: the next allocation may hold them.
    found = set(Exclusions.read(run_dir).hosts)
    # The user's resources.exclude too: the update replaces the job's list.
    hosts = sorted(found | settings.user_excluded()) if found else []
    refused = slurm.requeue_excluding(target, hosts) if hosts else slurm.requeue(target)
    # "Job is pending execution": it is on its way back already (rank 0's requeue, or a preemption in
    # REQUEUE mode, which requeues by itself).
    if refused is not None and "pending execution" not in refused:
        print(f"slurmddp: scontrol requeue {target}: {refused}", file=sys.stderr)
    return 0


LOCAL_STARTS = 6
"""How many times submitit's local controller starts a job's tasks at most (submitit 1.5's
`Controller.run(max_retry=6)`): a stop of the last start is not followed by another."""
LOCAL_TIME_SIGNAL = "SIGUSR2"
"""What submitit's local controller sends `requeue.signal_lead_s` before `resources.time`."""


def begin_local(run_dir: Path, attempt: AttemptId, host: str, now: float) -> None:
    """Rank 0 of a local run: record the start of `attempt` (records.local_attempt)."""
    started = len(records.begins(records.read_attempts(run_dir)))
    records.append_attempt(run_dir, Begin(started, now, host, host, attempt))


def end_local(run_dir: Path, attempt: AttemptId, status: int, now: float) -> End | None:
    """Rank 0 of a local run: record how `attempt` ended, from the status its rank leaves with (0,
    LOCAL_REQUEUE_STATUS after a stop, anything else a failure) and the attempt's records; returns
    the record, or None where the attempt was closed already (a cancel, or a second call)."""
    events = records.read_attempts(run_dir)
    final = records.final_end(events)
    if final is not None and final.reason == CANCELLED:
        return None
    if any(e.attempt_id == attempt for e in records.ends(events)):
        return None
    controller = Local(LOCAL_STARTS, LOCAL_TIME_SIGNAL)
    decision = decide_local(run_dir, attempt, status, records.current(events), controller)
    ended = _record_end(run_dir, events, attempt, status, decision, now)
    if not decision.requeue:
        _finish_trial(run_dir, decision.reason, decision.message)
    return ended


def main(argv: list[str]) -> int:
    # A sweep's batch script names the sweep directory and its submission; the array task picks
    # the element it runs from the sweep manifest. The logs folder is the named directory's either
    # way (plan.build).
    logs = Path(argv[1]) / LOGS if len(argv) > 1 else None
    if len(argv) in (4, 5) and argv[-2] == "--submission":
        run_dir = records.element_dir(Path(argv[1]), int(argv[-1]), os.environ)
        argv = [argv[0], str(run_dir), *argv[2:-2]]
    if len(argv) == 2 and argv[0] == "begin":
        began = begin(Path(argv[1]), os.environ, time.time())
        return claim_trial(Path(argv[1])) if began == 0 else began
    if len(argv) == 3 and argv[0] == "end":
        return end(Path(argv[1]), int(argv[2]), os.environ, time.time(), slurm.preempt_time, logs=logs)
    print(
        "usage: python -m slurmddp.job.allocation.attempts begin RUN_DIR | end RUN_DIR STATUS "
        "(each optionally followed by --submission N for a sweep)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
