"""Why a run failed, as `submit` ends, `status` shows and `status --json` gives it: every failed
attempt's rank, exception, the user's line and the rank's log, read from failure.json."""

from __future__ import annotations

import json
from pathlib import Path

from slurmddp.manage import explain, report, runs
from slurmddp.rundir.records import AttemptId, CodeSite, Failure

JOB = "999999999"
"""A local job's id is its process id: this one is no process, so the run reads as ended."""


def failed_run(tmp_path: Path, world_size: int = 4) -> Path:
    """A local run whose first attempt raised in the user's train.py on rank 1, and whose second
    (a requeue) hung."""
    run = tmp_path / "runs" / "exp" / "1"
    (run / "logs").mkdir(parents=True)
    manifest = {
        "job_id": JOB,
        "logs": str(run / "logs"),
        "executor": "local",
        "world_size": world_size,
        "name": "exp",
        "workdir": str(tmp_path),
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    Failure(
        None,
        1,
        'ConfigAttributeError("Missing key lrr\\n    full_key: train.lrr")',
        AttemptId(JOB, 0),
        1.0,
        exception="ConfigAttributeError",
        message="Missing key lrr\n    full_key: train.lrr",
        where=CodeSite(str(tmp_path / "train.py"), 12, "main"),
    ).write(run)
    return run


def test_the_summary_names_the_error_the_users_line_the_rank_and_its_log(tmp_path: Path) -> None:
    run = failed_run(tmp_path)
    assert explain.summary(run) == [
        "slurmddp: ConfigAttributeError: Missing key lrr",
        "  at train.py:12 in main (rank 1, the first of 4 ranks to fail)",
        f"  full traceback: {run}/logs/{JOB}_1_log.err",
    ]


def test_the_summary_says_the_latest_failure_without_a_frame_of_the_users(tmp_path: Path) -> None:
    run = failed_run(tmp_path, world_size=1)
    Failure(5, 0, "hung", AttemptId(JOB, 1), 2.0, cause="rank 0 waits in all_reduce\nmore").write(run)
    assert explain.summary(run) == [
        "slurmddp: rank 0 waits in all_reduce",
        "  on rank 0",
        f"  full traceback: {run}/logs/{JOB}_0_log.err",
    ]


def test_a_run_that_recorded_no_failure_has_no_summary(tmp_path: Path) -> None:
    run = failed_run(tmp_path)
    (run / "failure.json").unlink()
    assert explain.summary(run) == []


def test_status_shows_and_gives_every_failed_attempt(tmp_path: Path) -> None:
    run = failed_run(tmp_path)
    Failure(5, 2, "hung", AttemptId(JOB, 1), 2.0, cause="rank 2 waits in all_reduce").write(run)
    target = runs.load(run)
    rows = runs.rows(target)
    log = f"{run}/logs/{JOB}"
    lines = report.status_table(target, rows, None).splitlines()
    assert lines[-2:] == [
        f"run: job {JOB} failed on rank 1: ConfigAttributeError: Missing key lrr at train.py:12 in main; "
        f"log {log}_1_log.err",
        f"run: job {JOB} restart 1 failed on rank 2: rank 2 waits in all_reduce; log {log}_2_log.err",
    ]
    given = json.loads(json.dumps(report.status_json(target, rows)))
    assert given["elements"][0]["failures"] == [
        {
            "job_id": JOB,
            "restart_count": 0,
            "rank": 1,
            "type": "ConfigAttributeError",
            "message": "Missing key lrr",
            "where": {"file": str(tmp_path / "train.py"), "line": 12, "function": "main"},
            "log": f"{log}_1_log.err",
        },
        {
            "job_id": JOB,
            "restart_count": 1,
            "rank": 2,
            "type": None,
            "message": "rank 2 waits in all_reduce",
            "where": None,
            "log": f"{log}_2_log.err",
        },
    ]
