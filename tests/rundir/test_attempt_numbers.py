"""The records users read through `status`: which attempt of the run an attempt is, and the
count of checkpoints skipped for want of space."""

from __future__ import annotations

import json
from pathlib import Path

from slurmddp.rundir import records
from slurmddp.rundir.records import AttemptId, Begin, End, Resubmit, SkippedSaves


def test_an_attempt_is_numbered_from_1_over_every_job_of_the_run(tmp_path: Path) -> None:
    first, second, again = AttemptId("7", 0), AttemptId("7", 1), AttemptId("8", 0)
    for number, attempt in enumerate((first, second)):
        records.append_attempt(tmp_path, Begin(number, 1.0, "n1", "n1", attempt))
    records.append_attempt(tmp_path, End("failure", 3, 2.0, requeue=False, final=True, message="failed"))
    records.append_attempt(tmp_path, Resubmit(3.0, ["resubmit"]))
    events = records.read_attempts(tmp_path)
    assert records.attempt_number(events, first) == 1
    assert records.attempt_number(events, second) == 2
    # Not begun yet (a local rank 0 records its begin as its ranks start): the next one.
    assert records.attempt_number(events, again) == 3
    records.append_attempt(tmp_path, Begin(2, 4.0, "n1", "n1", again))
    assert records.attempt_number(records.read_attempts(tmp_path), again) == 3
    # The record itself keeps its own count, from 0.
    assert json.loads((tmp_path / "attempts.jsonl").read_text().splitlines()[-1])["attempt"] == 2


def test_skipped_checkpoints_are_counted_over_the_run(tmp_path: Path) -> None:
    assert SkippedSaves.read(tmp_path) is None
    SkippedSaves.add(tmp_path, 4, "no space left", AttemptId("7", 0), 1.0)
    SkippedSaves.add(tmp_path, 8, "no space left on /x", AttemptId("7", 1), 2.0)
    assert SkippedSaves.read(tmp_path) == SkippedSaves(2, 8, "no space left on /x", AttemptId("7", 1), 2.0)
    assert json.loads((tmp_path / "skipped_checkpoints.json").read_text()) == {
        "count": 2,
        "step": 8,
        "why": "no space left on /x",
        "time": 2.0,
        "job_id": "7",
        "restart_count": 1,
    }
