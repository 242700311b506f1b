"""What `status` and `submit --wait`'s ending block tell of a run's attempts: one numbering of them
(the Nth attempt of the run, from 1), the step each reached, where a resubmit would start, the
checkpoints skipped for want of space, and numbers in --json as numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurmddp.experiment.schema import Checkpoint
from slurmddp.job.checkpoint import CheckpointStore
from slurmddp.manage import outcome, report, runs
from slurmddp.rundir import records
from slurmddp.rundir.records import CANCELLED, AttemptId, Begin, End, Progress, Resubmit, SkippedSaves, Stop

JOB = "999999999"
"""A local job's id is its process id: this one is no process, so the run reads as ended."""
AGAIN = "999999998"
"""The job of its resubmit."""


def local_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "exp" / "1"
    (run / "logs").mkdir(parents=True)
    manifest = {
        "job_id": JOB,
        "logs": str(run / "logs"),
        "executor": "local",
        "world_size": 1,
        "name": "exp",
        "workdir": str(tmp_path),
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def cancelled_at(run: Path, stopped: int, progressed: int) -> AttemptId:
    """The run's first attempt, cancelled: the ranks stopped at `stopped`, the last progress
    record (written every few seconds) says `progressed`."""
    first = AttemptId(JOB, 0)
    records.append_attempt(run, Begin(0, 100.0, "node1", "node1", first))
    Progress(progressed, first, 110.0).write(run)
    records.append_attempt(
        run, End(CANCELLED, None, 112.0, requeue=False, final=True, message="cancelled by the user")
    )
    Stop(stopped, "SIGTERM", 111.0, first, 113.0).write(run)
    return first


def resubmitted_and_completed(run: Path, step: int) -> None:
    again = AttemptId(AGAIN, 0)
    records.append_attempt(run, Resubmit(120.0, ["resubmit"]))
    records.append_attempt(run, Begin(1, 130.0, "node1", "node1", again))
    Progress(step, again, 140.0).write(run)
    records.append_attempt(
        run,
        End(
            "completed",
            step,
            144.0,
            requeue=False,
            final=True,
            message="completed",
            attempt=1,
            attempt_id=again,
        ),
    )


def save_checkpoint(run: Path, step: int) -> None:
    store = CheckpointStore(run / "checkpoints", rank=0, world_size=1, settings=Checkpoint(), attempt="a")
    store.save(step, {"model": {}, "extra": {}, "loop": {}}, {"rng": {}})


def status(run: Path) -> tuple[str, dict[str, Any]]:
    target = runs.load(run)
    rows = runs.rows(target)
    given = json.loads(json.dumps(report.status_json(target, rows)))
    return report.status_table(target, rows, None), given["elements"][0]


def test_each_attempt_is_named_by_its_number_with_how_it_ended(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    cancelled_at(run, stopped=478, progressed=450)
    resubmitted_and_completed(run, 500)
    text, _ = status(run)
    assert "\nrun: attempt 1: cancelled at step 478; attempt 2: completed" in text


def test_a_cancelled_attempt_shows_the_step_it_stopped_at_and_where_a_resubmit_resumes(
    tmp_path: Path,
) -> None:
    run = local_run(tmp_path)
    cancelled_at(run, stopped=478, progressed=450)
    save_checkpoint(run, 450)
    save_checkpoint(run, 478)
    text, given = status(run)
    assert given["step"] == 478
    assert [(end["attempt"], end["step"]) for end in given["ended"]] == [(1, 478)]
    assert given["resume"] == {
        "step": 478,
        "checkpoint": str(run / "checkpoints" / "step-00000478"),
        "saves": 0,
    }
    assert f"\nrun: a resubmit resumes from step 478 (checkpoint {run}/checkpoints/step-00000478)" in text
    assert "  478  " in text.splitlines()[2]


def test_a_run_without_a_complete_checkpoint_is_said_to_start_from_step_0(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    cancelled_at(run, stopped=12, progressed=10)
    (run / "checkpoints" / "step-00000012").mkdir(parents=True)  # a save that never finished
    text, given = status(run)
    assert given["resume"] == {"step": 0, "checkpoint": None, "saves": 0}
    assert "\nrun: a resubmit starts from step 0: no complete checkpoint was saved" in text
    said = dict(outcome.next_steps(str(run), "FAILED", runs.rows(runs.load(run))[0].resume))
    assert (
        said[f"python -m slurmddp resubmit {run}"]
        == "run it again from step 0: it saved no complete checkpoint"
    )


def test_a_failed_runs_next_step_names_the_step_its_resubmit_resumes_at(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    cancelled_at(run, stopped=30, progressed=30)
    save_checkpoint(run, 20)
    said = dict(outcome.next_steps(str(run), "FAILED", runs.rows(runs.load(run))[0].resume))
    assert (
        said[f"python -m slurmddp resubmit {run}"]
        == "run it again from step 20, its newest complete checkpoint"
    )


def test_checkpoints_skipped_for_a_full_disk_are_counted_with_why(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    resubmitted_and_completed(run, 40)
    why = "no space left on /ckpt: 1.0 kB free, a checkpoint needs 2.0 MB"
    SkippedSaves.add(run, 20, why, AttemptId(AGAIN, 0), 135.0)
    SkippedSaves.add(run, 40, why, AttemptId(AGAIN, 0), 143.0)
    text, given = status(run)
    assert f"\nrun: 2 checkpoints skipped, not saved (the latest at step 40): {why}" in text
    assert given["skipped"] == {"count": 2, "step": 40, "why": why}
    row = runs.rows(runs.load(run))[0]
    assert outcome.checkpoints_text(str(run / "checkpoints"), row) == (
        f"none saved (in {run}/checkpoints); 2 checkpoints skipped, not saved (the latest at step 40): {why}"
    )


def test_throughput_in_json_is_a_number_with_its_unit_in_the_key(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    resubmitted_and_completed(run, 40)
    with (run / "metrics.jsonl").open("w") as handle:
        handle.write(json.dumps({"step": 40, "time": 1.0, "perf/samples_per_s": 7359.2}) + "\n")
    text, given = status(run)
    assert given["throughput_samples_per_s"] == 7359.2
    assert given["throughput_steps_per_s"] is None
    assert "throughput" not in given
    assert "7,359 samples/s" in text


def test_the_ending_block_says_what_each_time_measures(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    resubmitted_and_completed(run, 40)
    row = runs.rows(runs.load(run))[0]
    # status's elapsed: the attempt's 14 s from its begin to its end (130 -> 144).
    assert report.status_table(runs.load(run), [row], None).splitlines()[2].split()[7] == "0:00:14"
    assert outcome.time_text(row, 20.0) == (
        "0:00:14 in 1 attempt (status's elapsed), 0:00:20 from submission to the end"
    )


def test_a_requeued_attempt_shows_its_own_step_not_the_one_before(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    first, second = AttemptId(JOB, 0), AttemptId(JOB, 1)
    records.append_attempt(run, Begin(0, 100.0, "node1", "node1", first))
    records.append_attempt(
        run, End("preemption", 500, 110.0, requeue=True, final=False, message="preempted", attempt_id=first)
    )
    records.append_attempt(run, Begin(1, 120.0, "node1", "node1", second))
    Progress(480, second, 125.0).write(run)
    _, given = status(run)
    assert given["step"] == 480
