"""Runs that wait for runs: `submit EXP --after RUN` (Slurm's afterok: starts once RUN completed)
and `--after-any RUN` (afterany: once RUN ended, however). RUN is anything `status` takes: a run
or sweep directory, a job id, a folder of runs; a sweep is waited for as a whole (every array
task). A wait that could never end is refused at submit, or named by `status` once it is so."""

from __future__ import annotations

from pathlib import Path

from slurmddp.errors import SlurmddpError
from slurmddp.manage import runs
from slurmddp.rundir.manifest import Dependency

KINDS = {"after": "afterok", "after_any": "afterany"}


def dependency(ref: str, kind: str) -> Dependency | None:
    """What a submission waits for behind `ref`; None where there is nothing left to wait for
    (every job of it completed: Slurm may have forgotten them)."""
    flag = "--after" if kind == "afterok" else "--after-any"
    target = runs.resolve(ref)
    if target.backend.runs_here:
        raise SlurmddpError(
            f"{flag} {ref}: {target.dir} ran here without Slurm; only Slurm's queue can hold a job "
            "until another ends: submit once it has"
        )
    jobs = _jobs(target)
    rows = runs.rows(target, with_usage=False)
    ended = [row for row in rows if row.state not in runs.ACTIVE_STATES]
    failed = [row for row in ended if row.state != "COMPLETED"]
    if kind == "afterok" and failed:
        which = f"element {failed[0].index}" if failed[0].index is not None else "it"
        raise SlurmddpError(
            f"--after {ref}: {which} ended {failed[0].state}, so a job after it would never start; "
            f"resubmit it first, or queue with --after-any {ref} to start however it ended"
        )
    if len(ended) == len(rows):
        return None
    return Dependency(kind, str(target.dir), jobs)


def _jobs(target: runs.Target) -> list[str]:
    if target.sweep is not None:
        return [s.job_id for s in target.sweep.submissions if s.job_id is not None]
    return list(target.elements[0].job_ids[-1:])


def note(target: runs.Target, row: runs.Row) -> str | None:
    """What a run waiting for another is doing: waiting (and for what), or never to start."""
    after = target.manifest.after
    if after is None or row.attempts > 0:
        return None
    try:
        waited = runs.load(Path(after.dir))
    except SlurmddpError:
        return f"waits for {after.dir} ({after.sbatch}), which cannot be read"
    states = {r.state for r in runs.rows(waited, with_usage=False)}
    if states & runs.ACTIVE_STATES:
        return f"waits for {after.dir} to {'complete' if after.kind == 'afterok' else 'end'} ({after.sbatch})"
    if after.kind == "afterok" and states != {"COMPLETED"}:
        ended = ", ".join(sorted(states - {"COMPLETED"}))
        return (
            f"never starts: it was to run after {after.dir} completed, which ended {ended}; resubmit "
            "that, then this"
        )
    return None
