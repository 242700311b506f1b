"""Why a run failed, in a few lines: which rank, what it raised, the user's own line that raised
it, and the log holding the whole traceback. Read from failure.json (job/process/crash.py writes it on
the rank), one reason for every failed attempt."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmddp.manage import logs, runs
from slurmddp.rundir.records import AttemptId, CodeSite, Failure


@dataclass(frozen=True)
class Reason:
    """Why one attempt failed."""

    attempt: AttemptId
    rank: int
    type: str | None
    """The exception's type name; None where no Python exception ended the rank (a script's exit
    status, a hang, a failed preflight)."""
    message: str
    """The first line of the exception's message, or of what else failed, as recorded."""
    where: CodeSite | None
    """The user's line that raised it; None where no frame of theirs was in the traceback."""
    log: Path | None
    """The log of the rank that failed, which holds the whole traceback."""

    @property
    def headline(self) -> str:
        """`TypeName: message`."""
        return self.message if self.type is None else f"{self.type}: {self.message}".rstrip(": ")

    def site(self, workdir: Path | None) -> str | None:
        """`train.py:12 in main`, the file relative to the submit directory when it is in it."""
        if self.where is None:
            return None
        path = Path(self.where.file)
        if workdir is not None and path.is_relative_to(workdir):
            path = path.relative_to(workdir)
        return f"{path}:{self.where.line} in {self.where.function}"

    def one_line(self, workdir: Path | None) -> str:
        """The reason as `status` shows it under the run's row."""
        job, restart, in_job = self.attempt.job_id, self.attempt.restart_count, self.attempt.in_job_restart
        attempt = f"job {job}" + (f" restart {restart}" if restart else "")
        attempt += f" (restart {in_job} in its allocation)" if in_job else ""
        site = self.site(workdir)
        at = f" at {site}" if site else ""
        log = f"; log {self.log}" if self.log else ""
        return f"{attempt} failed on rank {self.rank}: {self.headline}{at}{log}"

    def to_json(self) -> dict[str, Any]:
        return {
            **self.attempt.to_json(),
            "rank": self.rank,
            "type": self.type,
            "message": self.message,
            "where": None if self.where is None else dataclasses.asdict(self.where),
            "log": None if self.log is None else str(self.log),
        }


def reasons(element: runs.Run) -> list[Reason]:
    """Why each failed attempt of `element` failed, oldest first."""
    return [_reason(element, failure) for failure in Failure.read_all(element.dir)]


def _reason(element: runs.Run, failure: Failure) -> Reason:
    if failure.exception is not None:
        message = _first_line(failure.message or "")
    else:
        message = _first_line(failure.cause or failure.error)
    # An array task's own job id is not the name its logs go by: the element's current job's is.
    job = failure.attempt.job_id if failure.attempt.job_id in element.job_ids else element.job_id
    log = None
    if job is not None:
        log = logs.log_path(dataclasses.replace(element, job_ids=(job,)), failure.rank, "err")
    return Reason(
        failure.attempt,
        failure.rank,
        failure.exception,
        message,
        failure.where,
        log,
    )


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0]


def workdir(target: runs.Target) -> Path | None:
    known = target.manifest.workdir
    return Path(known) if known is not None else None


def summary(run_dir: Path) -> list[str]:
    """The lines that end a failed run's output: the latest failure, where, and its log."""
    target = runs.load(run_dir)
    found = reasons(target.element(None))
    if not found:
        return []
    reason = found[-1]
    world = target.manifest.world_size or 1
    rank = f"rank {reason.rank}" + (f", the first of {world} ranks to fail" if world > 1 else "")
    site = reason.site(workdir(target))
    lines = [f"slurmddp: {reason.headline}", f"  at {site} ({rank})" if site else f"  on {rank}"]
    if reason.log is not None:
        lines.append(f"  full traceback: {reason.log}")
    return lines
