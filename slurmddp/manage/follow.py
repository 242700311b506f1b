"""`submit --wait`: follow a job to its end, showing its state changes and rank 0's output."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from submitit.core.utils import pickle_load

from slurmddp.cluster import slurm
from slurmddp.cluster.slurm import JobState
from slurmddp.submit.submitter import Submission

# The one end state that counts as success (sacct's spelling); every other end state fails `--wait`.
FINAL_OK: JobState = "COMPLETED"


def follow(sub: Submission, out: TextIO, poll_s: float = 1.0) -> JobState:
    """Block until the job ends; return its final state (COMPLETED on success)."""
    tails = [_Tail(sub.log_path(0, "out")), _Tail(sub.log_path(0, "err"))]
    started = time.monotonic()
    last = ""
    state_of: Callable[[], JobState | None] = (
        _local_state(sub) if sub.plan.executor == "local" else lambda: slurm.queue_state(sub.job_id)
    )
    while True:
        state = state_of()
        for tail in tails:
            for line in tail.new_lines():
                out.write(f"  [rank 0] {line}\n")
        if state is None:
            break
        if state != last:
            out.write(f"slurmddp: job {sub.job_id} {state} ({time.monotonic() - started:.0f}s)\n")
            last = state
        out.flush()
        time.sleep(poll_s)
    final = slurm.final_state(sub.job_id) if sub.plan.executor == "slurm" else "UNKNOWN"
    if final == "UNKNOWN":
        final = _from_results(sub)
    out.write(f"slurmddp: job {sub.job_id} ended {final} ({time.monotonic() - started:.0f}s)\n")
    out.flush()
    return final


def _local_state(sub: Submission) -> Callable[[], JobState | None]:
    def state() -> JobState | None:
        return None if sub.job.done() else "RUNNING"

    return state


def _from_results(sub: Submission) -> JobState:
    """The end state from the result pickle each task writes, where accounting cannot tell:
    the local executor, or a cluster without slurmdbd."""
    for task in range(sub.plan.world_size):
        path = sub.plan.folder / f"{sub.job_id}_{task}_result.pkl"
        try:
            outcome = pickle_load(path)[0]
        except (OSError, EOFError, pickle.UnpicklingError):
            return "FAILED"
        if outcome != "success":
            return "FAILED"
    return FINAL_OK


class _Tail:
    """New complete lines of a file that may not exist yet."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open() as handle:
                handle.seek(self.offset)
                chunk = handle.read()
                self.offset = handle.tell()
        except FileNotFoundError:
            return []
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = lines.pop()
        return lines
