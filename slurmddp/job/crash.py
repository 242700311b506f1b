"""A rank's crash, recorded for the requeue decision (job/requeue.py): where the attempt crashed,
and whether the node's device is to blame."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from slurmddp.job.distenv import DistEnv
from slurmddp.job.records import AttemptId, Failure

DEVICE_FAULTS = (
    "uncorrectable ECC error",
    "CUDA-capable device(s) is/are busy or unavailable",
    "GPU has fallen off the bus",
    "cudaErrorDevicesUnavailable",
    "NVML",
)
"""Words of an error that blame the node's GPU, not the code: the node is left out next time."""


def record(run_dir: Path, dist: DistEnv, step: int | None, error: str) -> None:
    """Where the attempt crashed, for the failure budget (a crash at the same step twice stops),
    and that it crashed: the other ranks then get srun's SIGTERM, which is no stop request. A
    device fault names this host, which the requeued job then leaves out. The attempt's first
    record stands (Failure.write)."""
    fault = next((words for words in DEVICE_FAULTS if words.lower() in error.lower()), None)
    host = socket.gethostname()
    Failure(
        step=step,
        rank=dist.rank,
        error=error,
        attempt=AttemptId(dist.job_id, dist.restart_count),
        time=time.time(),
        bad_hosts={host: f"rank {dist.rank}: {fault}: {error[:300]}"} if fault else {},
    ).write(run_dir)
