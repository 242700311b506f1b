"""`submit --wait`: follow a job to its end, showing its state changes and rank 0's output."""

from __future__ import annotations

import pickle
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from submitit.core.utils import pickle_load

from slurmddp.submitter import Submission

# The one end state that counts as success (sacct's spelling); every other end state fails `--wait`.
FINAL_OK = "COMPLETED"


def follow(sub: Submission, out: TextIO, poll_s: float = 1.0) -> str:
    """Block until the job ends; return its final state (COMPLETED on success)."""
    tails = [_Tail(sub.log_path(0, "out")), _Tail(sub.log_path(0, "err"))]
    started = time.monotonic()
    last = ""
    state_of: Callable[[], str | None] = (
        _local_state(sub) if sub.plan.executor == "local" else _squeue(sub.job_id)
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
    final = sacct_state(sub.job_id) if sub.plan.executor == "slurm" else "UNKNOWN"
    if final == "UNKNOWN":
        final = _from_results(sub)
    out.write(f"slurmddp: job {sub.job_id} ended {final} ({time.monotonic() - started:.0f}s)\n")
    out.flush()
    return final


def _squeue(job_id: str) -> Callable[[], str | None]:
    def state() -> str | None:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
        text = proc.stdout.strip()
        # squeue exits non-zero with "Invalid job id" once the job has aged out of slurmctld.
        return text.splitlines()[0] if proc.returncode == 0 and text else None

    return state


def sacct_state(job_id: str, attempts: int = 10) -> str:
    """The job's final state from accounting, which lags the job's end by a moment."""
    for _ in range(attempts):
        proc = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
        )
        states = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode == 0 and states and states[-1] not in ("RUNNING", "PENDING", "COMPLETING"):
            return states[-1]
        time.sleep(1)
    return "UNKNOWN"


def _local_state(sub: Submission) -> Callable[[], str | None]:
    def state() -> str | None:
        return None if sub.job.done() else "RUNNING"

    return state


def _from_results(sub: Submission) -> str:
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
