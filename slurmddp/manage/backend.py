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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from slurmddp.cluster import slurm
from slurmddp.cluster.slurm import Allocation, JobState
from slurmddp.defaults import RunExecutor
from slurmddp.layout import FAILURE, RESULT
from slurmddp.submit import submitter
from slurmddp.submit.plan import SubmissionPlan


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

    def cancel(self, job_ids: Sequence[str], array_ids: Sequence[str] = ()) -> None:
        """Stop the jobs `job_ids`; `array_ids`: when a whole sweep is cancelled, its submissions."""

    def check_schedulable(self, plan: SubmissionPlan) -> None:
        """Refuse, before anything is submitted, a plan the scheduler would refuse."""

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
        # again beside its last attempt's.
        if job_id is not None and job_id.isdigit() and Path(f"/proc/{job_id}").exists():
            return "RUNNING"
        if (run_dir / FAILURE).is_file():
            return "FAILED"
        return "UNKNOWN" if job_id is None else "FAILED"

    def live_state(self, sub: submitter.Submission) -> JobState | None:
        return None if sub.job.done() else "RUNNING"

    def final_state(self, sub: submitter.Submission) -> JobState:
        return "UNKNOWN"

    def cancel(self, job_ids: Sequence[str], array_ids: Sequence[str] = ()) -> None:
        # Only the runs still going: an element that ended long ago may have its process id
        # taken by another process by now.
        for job_id in job_ids:
            if job_id.isdigit():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(job_id), signal.SIGTERM)

    def check_schedulable(self, plan: SubmissionPlan) -> None:
        return None

    def partition_nodes(self, partition: str | None) -> int | None:
        # Every size runs on this machine.
        return None


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

    def cancel(self, job_ids: Sequence[str], array_ids: Sequence[str] = ()) -> None:
        # A whole sweep by its array ids, so that its pending tasks go too.
        slurm.cancel(array_ids or job_ids)

    def check_schedulable(self, plan: SubmissionPlan) -> None:
        submitter.check_schedulable(plan)

    def partition_nodes(self, partition: str | None) -> int | None:
        return slurm.partition_nodes(partition)


LOCAL = LocalBackend()
SLURM = SlurmBackend()
_BY_EXECUTOR: dict[str, Backend] = {"local": LOCAL, "slurm": SLURM}


def for_executor(executor: RunExecutor) -> Backend:
    return _BY_EXECUTOR[executor]


def for_manifest(manifest: Mapping[str, object]) -> Backend:
    """A run's backend from its manifest; runs written before manifests named the executor ran
    on Slurm."""
    return _BY_EXECUTOR.get(str(manifest.get("executor")), SLURM)
