"""What `submit --wait` prints once the job ended: its final metrics, the time it took and its
attempts, where its files are, and the commands to go on with."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from slurmddp.cluster.slurm import JobState
from slurmddp.manage import goodput, numbers, report, runs
from slurmddp.manage.snapshot import shown_metrics
from slurmddp.rundir.layout import RESULT
from slurmddp.rundir.metrics import latest_values, read_metrics
from slurmddp.submit.submitter import Submission

COMMAND = "python -m slurmddp"


@dataclass(frozen=True)
class Outcome:
    rows: list[tuple[str, str | list[str]]]
    """(what, value): the metrics (one item each), the time, and where each of the run's files is."""
    next_steps: list[tuple[str, str]]
    """(command, what it does)."""


def outcome(sub: Submission, state: JobState, wall_s: float) -> Outcome:
    """The block for a run that ended in `state`, `wall_s` after it was submitted."""
    run_dir = sub.plan.run_dir
    row = runs.rows(runs.load(run_dir), with_usage=False)[0]
    values, _ = latest_values(read_metrics(run_dir))
    metrics = shown_metrics(values)
    rows: list[tuple[str, str | list[str]]] = []
    if metrics:
        rows.append(("metrics", [f"{name}={numbers.metric(v)}" for name, v in metrics.items()]))
    rows.append(("time", time_text(row, wall_s)))
    if row.goodput is not None:
        rows.append(("goodput", goodput.describe(row.goodput).removeprefix("goodput ")))
    rows.append(("run dir", str(run_dir)))
    if (run_dir / RESULT).is_file():
        rows.append(("result", str(run_dir / RESULT)))
    rows.append(("logs", f"{sub.log_path(0)} (rank 0; one file per rank)"))
    rows.append(("checkpoints", checkpoints_text(sub.plan.rank.checkpoint_dir, row)))
    return Outcome(rows, next_steps(str(run_dir), state, row.resume))


def time_text(row: runs.Row, wall_s: float) -> str:
    """The time in attempts (what `status` shows as elapsed) and the time from submission to the
    end (which adds the queue, the ranks' start before their attempt is recorded, and their exit)."""
    attempts = f"{row.attempts} attempt{'s' if row.attempts != 1 else ''}"
    return (
        f"{numbers.duration(row.elapsed_s)} in {attempts} (status's elapsed), "
        f"{numbers.duration(wall_s)} from submission to the end"
    )


def checkpoints_text(folder: str, row: runs.Row) -> str:
    """Where the checkpoints are, the newest complete one's step, and any skipped."""
    saves = row.resume.saves
    if saves and row.resume.checkpoint is not None:
        text = (
            f"{saves} saved by the script with torch.distributed.checkpoint (newest: step "
            f"{row.resume.step}, {row.resume.checkpoint})"
        )
    elif row.resume.checkpoint is not None:
        text = f"{folder} (newest complete: step {row.resume.step})"
    elif any(_entries(folder)):
        text = f"{folder} (none complete)"
    else:
        text = f"none saved (in {folder})"
    return text if row.skipped is None else f"{text}; {report.skipped_saves(row.skipped)}"


def next_steps(
    run_dir: str, state: JobState | None, resume: runs.Resume | None = None
) -> list[tuple[str, str]]:
    """The commands to try next on a run in `state` (None: still running); `resume`: where its
    resubmit would start."""
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
    steps.append((f"{COMMAND} resubmit {ref}", _resubmit_text(resume)))
    return steps


def _resubmit_text(resume: runs.Resume | None) -> str:
    if resume is None:
        return "run it again from its newest complete checkpoint"
    if resume.checkpoint is None:
        return "run it again from step 0: it saved no complete checkpoint"
    if resume.saves:
        return f"run it again: the script resumes from its newest checkpoint, step {resume.step}"
    return f"run it again from step {resume.step}, its newest complete checkpoint"


def _entries(path: str) -> list[str]:
    try:
        return [entry.name for entry in Path(path).iterdir()]
    except OSError:
        return []
