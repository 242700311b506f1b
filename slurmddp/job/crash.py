"""A rank's crash, recorded for the requeue decision (job/requeue.py): where the attempt crashed,
and whether the node's device is to blame; and, for the user, what their code raised and where."""

from __future__ import annotations

import site
import socket
import sysconfig
import time
import traceback
from pathlib import Path

from slurmddp.job.distenv import DistEnv
from slurmddp.job.records import AttemptId, CodeSite, Failure

DEVICE_FAULTS = (
    "uncorrectable ECC error",
    "CUDA-capable device(s) is/are busy or unavailable",
    "GPU has fallen off the bus",
    "cudaErrorDevicesUnavailable",
    "NVML",
)
"""Words of an error that blame the node's GPU, not the code: the node is left out next time."""
MESSAGE_CHARS = 2000
"""Enough for any message worth reading; a tensor's repr in one is cut."""


def record(
    run_dir: Path, dist: DistEnv, step: int | None, error: str, exc: BaseException | None = None
) -> None:
    """Where the attempt crashed, for the failure budget (a crash at the same step twice stops),
    and that it crashed: the other ranks then get srun's SIGTERM, which is no stop request. A
    device fault names this host, which the requeued job then leaves out. `exc`, the exception
    that ended the rank, is recorded as its type, message and the user's line that raised it.
    The attempt's first record stands (Failure.write)."""
    fault = next((words for words in DEVICE_FAULTS if words.lower() in error.lower()), None)
    host = socket.gethostname()
    Failure(
        step=step,
        rank=dist.rank,
        error=error,
        attempt=AttemptId.of(dist),
        time=time.time(),
        bad_hosts={host: f"rank {dist.rank}: {fault}: {error[:300]}"} if fault else {},
        exception=None if exc is None else type(exc).__name__,
        message=None if exc is None else str(exc)[:MESSAGE_CHARS],
        where=None if exc is None else users_frame(exc),
    ).write(run_dir)


def users_frame(exc: BaseException) -> CodeSite | None:
    """The innermost frame of the traceback in the user's own code: not in Python's standard
    library (runpy included), an installed library (submitit, torch, omegaconf: their frames say
    how a mistake was noticed, not where it was made), or slurmddp."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.lineno is not None and not _foreign(frame.filename):
            return CodeSite(frame.filename, frame.lineno, frame.name)
    return None


def _foreign(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen runpy>, <string>
        return True
    path = Path(filename).resolve()
    return any(path.is_relative_to(root) for root in _not_users())


def _not_users() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += [*site.getsitepackages(), site.getusersitepackages(), str(Path(__file__).parents[1])]
    return [Path(root).resolve() for root in roots]
