"""`slurmddp logs`: print a rank's log, or follow it until the job ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from slurmddp.cluster import slurm
from slurmddp.errors import SlurmddpError
from slurmddp.manage import runs
from slurmddp.manage.runs import RunState

FOLLOW_POLL_S = 1.0
WRITING_STATES: frozenset[slurm.JobState] = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
"""Slurm states in which a job's processes may still write to its logs."""


def log_path(element: runs.Run, rank: int, stream: str) -> Path:
    """submitit's per-task log of the element's current job: LOGS/JOBID_RANK_log.{out,err}."""
    if element.job_id is None:
        raise SlurmddpError(f"{element.dir} has not been submitted: there is no log yet")
    return element.logs / f"{element.job_id}_{rank}_log.{stream}"


def show(target: runs.Target, element: runs.Run, rank: int, stream: str, follow: bool, out: TextIO) -> None:
    world = target.manifest.world_size or 1
    if not 0 <= rank < world:
        raise SlurmddpError(f"--rank {rank}: the job has ranks 0-{world - 1}")
    path = log_path(element, rank, stream)
    position = 0
    while True:
        position = _copy_new(path, position, out)
        if not follow or not _active(target, element):
            break
        time.sleep(FOLLOW_POLL_S)
    _copy_new(path, position, out)
    if position == 0 and not path.is_file():
        state = _state(target, element)
        raise SlurmddpError(f"no log at {path} (the job is {state}; a pending job has none yet)")


def _copy_new(path: Path, position: int, out: TextIO) -> int:
    try:
        with path.open("rb") as handle:
            handle.seek(position)
            data = handle.read()
    except FileNotFoundError:
        return position
    out.write(data.decode(errors="replace"))
    out.flush()
    return position + len(data)


def _slurm_states(target: runs.Target, element: runs.Run) -> dict[str, slurm.JobState]:
    return target.backend.job_states([element.job_id]) if element.job_id else {}


def _state(target: runs.Target, element: runs.Run) -> RunState:
    return runs.element_state(target, element, _slurm_states(target, element))


def _active(target: runs.Target, element: runs.Run) -> bool:
    known = _slurm_states(target, element)
    # The run's final record is written by its batch script, which can be before slurmstepd has
    # written its last lines (the "CANCELLED AT" notice) into the rank logs: follow until Slurm,
    # too, says the job's processes are gone.
    still_writing = element.job_id is not None and known.get(element.job_id) in WRITING_STATES
    return still_writing or runs.element_state(target, element, known) in runs.ACTIVE_STATES
