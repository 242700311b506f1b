"""The ranks' stderr as srun wrote it: submitit's LOGS/JOB_TASK_log.err (LOGS/ARRAYJOB_TASK_TASK_log.err
in a sweep), read where a rank may have ended before any of slurmddp ran to record why."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

ERR_SUFFIX = "_log.err"
TAIL_BYTES = 4096
"""Enough for the few lines an interpreter or a container runtime prints before it gives up; the
logs of a long job's earlier attempts come before them."""


def stderr_tails(logs: Path, env: Mapping[str, str]) -> dict[int, str]:
    """The end of each task's stderr of the job the batch script in `env` runs, by task number."""
    array, index = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    prefix = f"{array}_{index}" if array and index else env.get("SLURM_JOB_ID", "")
    tails: dict[int, str] = {}
    for path in logs.glob(f"{prefix}_*{ERR_SUFFIX}"):
        task = path.name[len(prefix) + 1 : -len(ERR_SUFFIX)]
        if not task.isdigit():  # another array's task of the same job id
            continue
        try:
            with path.open("rb") as log:
                log.seek(max(0, log.seek(0, 2) - TAIL_BYTES))
                tails[int(task)] = log.read().decode(errors="replace")
        except OSError:
            continue
    return tails
