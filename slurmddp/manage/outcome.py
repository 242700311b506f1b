"""What `submit --wait` prints once the job ended: its final metrics, the time it took and its
attempts, where its files are, and the commands to go on with."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from slurmddp.cluster.slurm import JobState
from slurmddp.manage import numbers, runs
from slurmddp.manage.snapshot import shown_metrics
from slurmddp.rundir.layout import RESULT
from slurmddp.rundir.metrics import latest_values, read_metrics
from slurmddp.rundir.records import Progress, read_attempts
from slurmddp.submit.submitter import Submission

COMMAND = "python -m slurmddp"


@dataclass(frozen=True)
class Outcome:
    rows: list[tuple[str, str | list[str]]]
    """(what, value): the metrics (one item each), the time, and where each of the run's files is."""
    next_steps: list[tuple[str, str]]
    """(command, what it does)."""


def outcome(sub: Submission, state: JobState, wall_s: float) -> Outcome:
    run_dir = sub.plan.run_dir
    run = runs.load(run_dir).elements[0]
    values, _ = latest_values(read_metrics(run_dir))
    metrics = shown_metrics(values)
    attempts = runs.attempts_ran(run, read_attempts(run_dir), Progress.read(run_dir))
    rows: list[tuple[str, str | list[str]]] = []
    if metrics:
        rows.append(("metrics", [f"{name}={numbers.metric(v)}" for name, v in metrics.items()]))
    rows.append(("time", f"{numbers.duration(wall_s)}, {attempts} attempt{'s' if attempts != 1 else ''}"))
    rows.append(("run dir", str(run_dir)))
    if (run_dir / RESULT).is_file():
        rows.append(("result", str(run_dir / RESULT)))
    rows.append(("logs", f"{sub.log_path(0)} (rank 0; one file per rank)"))
    checkpoints = sub.plan.rank.checkpoint_dir
    rows.append(
        ("checkpoints", checkpoints if any(_entries(checkpoints)) else f"none saved (in {checkpoints})")
    )
    return Outcome(rows, next_steps(str(run_dir), state))


def next_steps(run_dir: str, state: JobState | None) -> list[tuple[str, str]]:
    """The commands to try next on a run in `state` (None: still running)."""
    ref = shlex.quote(run_dir)
    steps = [(f"{COMMAND} status {ref}", "its state, step, metrics and time")]
    if state is None:
        steps.append((f"{COMMAND} logs -f {ref}", "follow rank 0's output"))
        steps.append((f"{COMMAND} cancel {ref}", "stop it (the ranks save a checkpoint first)"))
        return steps
    if state == "COMPLETED":
        steps.append((f"{COMMAND} results {ref}", "its metrics as a table and a CSV"))
        steps.append((f"{COMMAND} logs {ref}", "rank 0's output"))
        return steps
    steps.append((f"{COMMAND} logs --err {ref}", "rank 0's errors (--rank N for another rank)"))
    steps.append((f"{COMMAND} resubmit {ref}", "run it again from its latest checkpoint"))
    return steps


def _entries(path: str) -> list[str]:
    try:
        return [entry.name for entry in Path(path).iterdir()]
    except OSError:
        return []
