"""A rank whose peer watch could not start or stopped (job/process/peerwatch.py records it): `status` says
so for the latest attempt, and what that costs."""

from __future__ import annotations

import json
from pathlib import Path

from slurmddp.manage import report, runs
from slurmddp.rundir import records
from slurmddp.rundir.records import AttemptId, Begin, Unwatched

JOB = "999999999"
"""A local job's id is its process id: this one is no process, so the run reads as ended."""
STOPPED = "stopped (OSError(9, 'Bad file descriptor'))"


def run_with_attempts(tmp_path: Path, *attempts: AttemptId) -> Path:
    run = tmp_path / "runs" / "exp" / "1"
    (run / "logs").mkdir(parents=True)
    manifest = {
        "job_id": JOB,
        "logs": str(run / "logs"),
        "executor": "local",
        "world_size": 4,
        "name": "exp",
        "workdir": str(tmp_path),
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    for number, attempt in enumerate(attempts):
        records.append_attempt(run, Begin(number, 1.0, "node1", "node1", attempt))
    return run


def test_status_names_the_latest_attempts_ranks_without_a_watch(tmp_path: Path) -> None:
    first, second = AttemptId(JOB, 0), AttemptId(JOB, 1)
    run = run_with_attempts(tmp_path, first, second)
    Unwatched(1, "could not start: the store has no watch address (RuntimeError())", first, 1.0).write(run)
    Unwatched(3, STOPPED, second, 2.0).write(run)
    target = runs.load(run)
    rows = runs.rows(target)
    text = report.status_table(target, rows, None)
    assert (
        f"\nrun: rank 3's peer watch {STOPPED}: a rank dying without a word is found there only by srun "
        "and the collectives' timeouts, not within a second"
    ) in text
    assert "rank 1's" not in text  # the attempt before's
    given = json.loads(json.dumps(report.status_json(target, rows)))
    assert given["elements"][0]["unwatched"] == {"3": STOPPED}


def test_status_of_watched_ranks_says_nothing_of_the_watch(tmp_path: Path) -> None:
    run = run_with_attempts(tmp_path, AttemptId(JOB, 0))
    target = runs.load(run)
    rows = runs.rows(target)
    assert "peer watch" not in report.status_table(target, rows, None) and rows[0].unwatched == {}
