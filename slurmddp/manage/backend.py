"""What differs between a run on this machine (submitit's local executor) and a run on Slurm, as
the login-node commands see it: how a job's state is known, what its allocations cost, how it is
stopped, whether it is checked before submission. One class per executor, as submitit has one per
backend; a run's backend is chosen once, from its manifest's executor, so the rest of `manage`
asks it instead of testing the executor's name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slurmddp.cluster import slurm
from slurmddp.cluster.slurm import Allocation, JobState
from slurmddp.defaults import RequeueReason, RunExecutor
from slurmddp.errors import SlurmddpError
from slurmddp.manage import local_ranks
from slurmddp.rundir import records
from slurmddp.rundir.layout import FAILURE, LOGS, RESULT
from slurmddp.rundir.manifest import Submitted
from slurmddp.rundir.records import AttemptId, Interrupt
from slurmddp.submit import submitter
from slurmddp.submit.plan import SubmissionPlan


@dataclass(frozen=True)
class SaveFirst:
    """How a cancel lets the running ranks save before their jobs end."""

    signal: str
    """The run's stop signal (requeue.signal)."""
    wait_s: float
    """How long to wait for the ranks to save and their jobs to end (requeue.signal_lead_s, the
    lead a save is given before a time limit); then scancel."""
    waiting: Callable[[Sequence[str]], None] = lambda jobs: None
    """Told the running jobs that were sent the stop signal, before the wait."""


CANCEL_POLL_S = 1.0
"""How often a cancel looks whether the stopped jobs have left the queue."""


class Backend(Protocol):
    executor: RunExecutor
    runs_here: bool
    """Whether jobs run on this machine, one after another, each followed to its end before the
    next (a sweep or study); otherwise they are queued all at once and waited for."""
    resubmits_arrays: bool
    """Whether a sweep's failed elements can be submitted again as one job array."""
    signals_ahead: bool
    """Whether the scheduler sends the stop signal requeue.signal_lead_s before the time limit,
    a lead that must cover a save."""

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """What the scheduler says of each job it knows (the local executor knows none)."""

    def allocations(self, job_ids: Sequence[str]) -> list[Allocation] | None:
        """Every allocation the jobs had, for the hours they cost; None where nothing counts them."""

    def state(self, run_dir: Path, job_id: str | None, states: Mapping[str, JobState]) -> JobState | None:
        """The state of a run without a final attempt record, given `job_states`' answer; None when
        it was never submitted."""

    def live_state(self, sub: submitter.Submission) -> JobState | None:
        """A followed job's state now; None once it has left (the queue, or this machine)."""

    def final_state(self, sub: submitter.Submission) -> JobState:
        """A followed job's end state as the scheduler accounts it; UNKNOWN where none does."""

    def cancel(
        self, job_ids: Sequence[str], array_ids: Sequence[str] = (), save: SaveFirst | None = None
    ) -> list[str]:
        """Stop the jobs `job_ids`; `array_ids`: when a whole sweep is cancelled, its submissions.
        `save`: the running ranks first stop at an agreed step and save, as on a preemption.
        Returns the jobs whose ranks saved and ended before this returned."""

    def check_schedulable(self, plan: SubmissionPlan) -> None:
        """Refuse, before anything is submitted, a plan the scheduler would refuse."""

    def interrupt(
        self,
        run_dir: Path,
        job_id: str | None,
        logs: Path,
        reason: RequeueReason,
        name: str,
        script: bool = False,
    ) -> str:
        """Send the ranks of the running job what Slurm sends on a preemption or near its time
        limit (the stop signal SIG`name`), having recorded which of the two it stands for under
        the ids its ranks see (interrupt.json); what was done. Refuses a job that is not running.
        `script`: its ranks run a script (or module) entrypoint, as their children."""

    def partition_nodes(self, partition: str | None) -> int | None:
        """The nodes a job may span in `partition` (None: the default one); None where unknown
        or where there is no cluster to outgrow."""


class LocalBackend:
    executor: RunExecutor = "local"
    runs_here = True
    resubmits_arrays = False
    signals_ahead = False

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        return {}

    def allocations(self, job_ids: Sequence[str]) -> list[Allocation] | None:
        return None

    def state(self, run_dir: Path, job_id: str | None, states: Mapping[str, JobState]) -> JobState | None:
        if (run_dir / RESULT).is_file():
            return "COMPLETED"
        # A local job's id is its process id. Before the failure record: a resubmitted run runs
        # again beside its last attempt's. The process must be the run's controller: the system
        # gives an old run's id to other processes.
        if job_id is not None and local_ranks.controller(job_id, run_dir / LOGS) is not None:
            return "RUNNING"
        if (run_dir / FAILURE).is_file():
            return "FAILED"
        return "UNKNOWN" if job_id is None else "FAILED"

    def live_state(self, sub: submitter.Submission) -> JobState | None:
        return None if sub.job.done() else "RUNNING"

    def final_state(self, sub: submitter.Submission) -> JobState:
        return "UNKNOWN"

    def cancel(
        self, job_ids: Sequence[str], array_ids: Sequence[str] = (), save: SaveFirst | None = None
    ) -> list[str]:
        # The controller passes SIGTERM on to the ranks, which take it as a stop signal and save:
        # `save` is always so here. Only a controller of submitit's: an element that ended long
        # ago may have its process id taken by another process by now (the caller also checked
        # that it is the run's own).
        for job_id in job_ids:
            if local_ranks.is_controller(job_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(job_id), signal.SIGTERM)
        return []  # the ranks are saving still

    def check_schedulable(self, plan: SubmissionPlan) -> None:
        return None

    def interrupt(
        self,
        run_dir: Path,
        job_id: str | None,
        logs: Path,
        reason: RequeueReason,
        name: str,
        script: bool = False,
    ) -> str:
        # Slurm signals every task of the step; here the ranks are the controller's tasks
        # (manage/local_ranks.py). A script rank passes the signal on to its script as SIGTERM.
        if job_id is None:
            raise SlurmddpError(f"{run_dir} was not submitted: only a running job can be interrupted")
        final = records.final_end(records.read_attempts(run_dir))
        if final is not None:
            raise SlurmddpError(
                f"local job {job_id} is not running: the run ended ({final.message}); only a running "
                "job can be interrupted"
            )
        signum = local_ranks.signal_number(name)
        attempt, ranks = _ready_ranks(run_dir, job_id, logs, signum, script, LOCAL_READY_WAIT_S)
        Interrupt(reason, attempt).write(run_dir)
        sent = local_ranks.send([task.pid for task in ranks], signum)
        pids = ", ".join(map(str, sent))
        return (
            f"sent SIG{name} to the {len(sent)} ranks of local job {job_id} (processes {pids}), "
            f"attempt {records.attempt_number(records.read_attempts(run_dir), attempt)}, as a {reason}"
        )

    def partition_nodes(self, partition: str | None) -> int | None:
        # Every size runs on this machine.
        return None


LOCAL_READY_WAIT_S = 30.0
"""How long `interrupt` waits for every rank of a local job to be ready for the stop signal
(between two attempts, or while a rank starts, some are missing or would die of it)."""


def _ready(task: local_ranks.Task, signum: int, script: bool) -> bool:
    """Whether the rank runs with its stop-signal handler and, for a script, has started its
    script with its own: the rank passes the signal on to the script only once it runs, and a
    script stopped before every rank reached the rank 0's store leaves the late ones waiting
    on it (dist.timeout_s)."""
    if signum not in task.catches:
        return False
    return not script or (task.script_catches is not None and signal.SIGTERM in task.script_catches)


def _ready_ranks(
    run_dir: Path, job_id: str, logs: Path, signum: int, script: bool, wait_s: float
) -> tuple[AttemptId, list[local_ranks.Task]]:
    """The attempt that runs now and its ranks, once every rank is ready for the stop signal and
    the attempt has begun: after its rank 0 recorded an attempt's end, the ranks still there are
    that attempt's, on their way out; the next attempt's rank 0 records its begin first thing."""
    deadline = time.monotonic() + wait_s
    while True:
        world = local_ranks.world_size(job_id, logs)
        if world is None:
            raise SlurmddpError(
                f"local job {job_id} is not running: its controller (process {job_id}, submitit's "
                f"local executor for {logs}) has ended; only a running job can be interrupted"
            )
        events = records.read_attempts(run_dir)
        # The ids every rank of the attempt counted when it started (records.local_attempt).
        attempt = records.local_attempt(events, job_id)
        begun = any(b.attempt_id == attempt for b in records.begins(records.current(events)))
        ready = [task for task in local_ranks.tasks(job_id, logs) if _ready(task, signum, script)]
        if begun and len(ready) == world:
            return attempt, ready
        if time.monotonic() >= deadline:
            raise SlurmddpError(
                f"local job {job_id}: {len(ready)} of its {world} ranks are ready for the stop "
                f"signal after {wait_s:.0f} s (they are starting or ending); try again"
            )
        time.sleep(0.1)


class SlurmBackend:
    executor: RunExecutor = "slurm"
    runs_here = False
    resubmits_arrays = True
    signals_ahead = True

    def job_states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        return slurm.job_states(job_ids)

    def allocations(self, job_ids: Sequence[str]) -> list[Allocation] | None:
        return slurm.allocations(job_ids)

    def state(self, run_dir: Path, job_id: str | None, states: Mapping[str, JobState]) -> JobState | None:
        if job_id is None:
            return None
        return states.get(job_id, "UNKNOWN")

    def live_state(self, sub: submitter.Submission) -> JobState | None:
        return slurm.queue_state(sub.job_id)

    def final_state(self, sub: submitter.Submission) -> JobState:
        return slurm.final_state(sub.job_id)

    def cancel(
        self, job_ids: Sequence[str], array_ids: Sequence[str] = (), save: SaveFirst | None = None
    ) -> list[str]:
        # A plain scancel would SIGTERM every process of the step at once: the DataLoader workers
        # die of it before their rank can save (torch's workers leave only on their parent's
        # SIGTERM). The stop signal instead, as on a preemption; scancel once they ended or the
        # wait is over. A whole sweep by its array ids, so that its pending tasks go too.
        running = [job for job in job_ids if slurm.queue_state(job) == "RUNNING"] if save else []
        if save is not None and running:
            # No pending task starts (to be stopped at once) while the running ones save.
            slurm.cancel_pending(array_ids)
            for job in running:
                slurm.signal(job, save.signal)
            save.waiting(running)
            deadline = time.monotonic() + save.wait_s
            while time.monotonic() < deadline and any(_still_running(job) for job in running):
                time.sleep(CANCEL_POLL_S)
        left = [job for job in running if _still_running(job)]
        slurm.cancel_queued(array_ids or job_ids)
        return [job for job in running if job not in left]

    def check_schedulable(self, plan: SubmissionPlan) -> None:
        submitter.check_schedulable(plan)

    def interrupt(
        self,
        run_dir: Path,
        job_id: str | None,
        logs: Path,
        reason: RequeueReason,
        name: str,
        script: bool = False,
    ) -> str:
        state = (slurm.queue_state(job_id) or "no longer in the queue") if job_id else "not submitted"
        if job_id is None or state != "RUNNING":
            raise SlurmddpError(f"job {job_id} is {state}: only a running job can be interrupted")
        fields = slurm.job_fields(job_id)
        # An array task's own job id is what its ranks see as SLURM_JOB_ID.
        if "JobId" not in fields or not fields.get("Restarts", "").isdigit():
            raise SlurmddpError(f"scontrol show job {job_id} names no JobId and Restarts; has it just ended?")
        attempt = records.running_attempt(
            records.read_attempts(run_dir), AttemptId(fields["JobId"], int(fields["Restarts"]))
        )
        Interrupt(reason, attempt).write(run_dir)
        slurm.signal(job_id, name)
        return f"sent SIG{name} to the ranks of job {job_id} as a {reason}"

    def partition_nodes(self, partition: str | None) -> int | None:
        return slurm.partition_nodes(partition)


LOCAL = LocalBackend()
SLURM = SlurmBackend()
_BY_EXECUTOR: dict[str, Backend] = {"local": LOCAL, "slurm": SLURM}


def for_executor(executor: RunExecutor) -> Backend:
    return _BY_EXECUTOR[executor]


def for_manifest(manifest: Submitted) -> Backend:
    """A run's backend from its manifest; runs written before manifests named the executor ran
    on Slurm."""
    return _BY_EXECUTOR.get(str(manifest.executor), SLURM)


def _still_running(job_id: str) -> bool:
    """The job's processes may still be at work: COMPLETING is a job whose batch script and steps
    have ended, held in the queue while its nodes are cleaned up (a job stayed COMPLETING over
    30 s in CI, four labs on two cores): its ranks are done, saved or not, and a resubmit goes on
    from what the run directory holds."""
    return slurm.queue_state(job_id) not in (None, "COMPLETING")
