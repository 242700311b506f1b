"""`list`: the newest submissions of the user's index, each with its state now.

Kept fast for scripts: the run directories are read as `status` reads them, and the scheduler is
asked once for every Slurm job listed (one squeue, and one sacct for those that left the queue)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from slurmddp.cluster.slurm import JobState
from slurmddp.errors import SlurmddpError
from slurmddp.manage import report, runs
from slurmddp.manage.backend import Backend

UNKNOWN = "-"
"""The state of a submission whose directory cannot be read, or whose scheduler did not answer."""


def with_states(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The index's records, each with a "state": a run's, or a sweep's elements counted by state."""
    targets = [_target(record) for record in records]
    known = _scheduler_states([target for target in targets if target is not None])
    return [
        {**record, "state": _state(target, known)} for record, target in zip(records, targets, strict=True)
    ]


def table(records: list[dict[str, Any]]) -> str:
    """The records of `with_states` as a table, newest first."""
    header = ["submitted", "kind", "name", "job", "state", "dir"]
    body = [
        [
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r["time"])),
            r["kind"],
            r["name"],
            r["job_id"],
            r["state"],
            r["dir"],
        ]
        for r in records
    ]
    return report.table(header, body)


def _target(record: dict[str, Any]) -> runs.Target | None:
    try:
        return runs.resolve(record["dir"])
    except (SlurmddpError, OSError, ValueError):
        return None


def _scheduler_states(targets: list[runs.Target]) -> dict[str, dict[str, JobState]]:
    """What each scheduler says of its jobs, by executor; None where one did not answer."""
    ids: dict[str, list[str]] = {}
    backends: dict[str, Backend] = {}
    for target in targets:
        backends[target.backend.executor] = target.backend
        ids.setdefault(target.backend.executor, []).extend(e.job_id for e in target.elements if e.job_id)
    known: dict[str, dict[str, JobState]] = {}
    for executor, backend in backends.items():
        try:
            known[executor] = backend.job_states(ids[executor])
        except SlurmddpError:
            continue  # no Slurm here, or it failed: those states are UNKNOWN
    return known


def _state(target: runs.Target | None, known: dict[str, dict[str, JobState]]) -> str:
    states = known.get(target.backend.executor) if target is not None else None
    if target is None or states is None:
        return UNKNOWN
    counted = Counter(str(runs.element_state(target, element, states)) for element in target.elements)
    if target.kind == "run":
        return next(iter(counted))
    return ", ".join(f"{count} {state}" for state, count in counted.most_common())
