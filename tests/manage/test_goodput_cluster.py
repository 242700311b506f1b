"""Goodput on the real cluster: the quickstart as shipped (loader workers on) has a rank SIGKILLed
(restarted in its allocation, redoing its steps: no checkpoint yet), is preempted by a real
`high` job (requeued through the queue), and completes. `status` shows its goodput and the split,
and each part is what the attempt records (RUN_DIR/attempts.jsonl) say, worked out here by hand:
the phases the ranks recorded, the begins and ends the batch script recorded."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    QUICKSTART,
    preempt_with_high_job,
    progress_step,
    rank_pid,
    run_job_id,
    slurmddp,
    submit_run,
    wait_for_job,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("22.05")]

EVERY = 300
"""Past the kill (rank 0's step at 150 or a little later): the restart redoes every step from 0,
never none, whatever step the kill lands on."""


def events(run: Path) -> list[dict[str, Any]]:
    path = run / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def by_hand(run: Path) -> dict[str, float]:
    """The split from the records, as manage/goodput.py's docstring defines it."""
    submitted = dt.datetime.fromisoformat(json.loads((run / "manifest.json").read_text())["submitted_at"])
    parts = dict.fromkeys(("starts", "checkpoints", "redone", "stops", "restarts", "queue", "training"), 0.0)
    waiting, ended, began, reached = submitted.timestamp(), None, 0.0, 0
    for event in events(run):
        if event["event"] == "begin":
            began = event["time"]
            if ended is not None and ended.get("in_job"):
                parts["restarts"] += began - ended["time"]
            else:
                parts["queue"] += max(0.0, began - waiting)
        else:
            phases = event["phases"]
            first, last, saves = phases["first_step_at"], phases["last_step_at"], phases["save_s"]
            made_after_first = event["step"] - phases["started_step"] - 1
            mean = (last - first - saves) / made_after_first
            redone = max(0, reached - phases["started_step"] - 1) * mean
            parts["starts"] += first - began
            parts["checkpoints"] += saves
            parts["redone"] += redone
            parts["training"] += last - first - saves - redone
            parts["stops"] += event["time"] - last
            reached = max(reached, event["step"])
            ended, waiting = event, event["time"]
    return parts


def test_status_shows_the_goodput_and_its_split_as_the_attempt_records_say(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    run = submit_run(
        slurm_env,
        tmp_path / "runs",
        "train.epochs=30",
        f"checkpoint.every_steps={EVERY}",
        # No in-memory snapshots either: the steps redone are then every step before the kill.
        "checkpoint.snapshot_every_steps=0",
        "requeue.in_job_restarts=1",
        experiment=QUICKSTART,
    )
    wait_until("step 150", lambda: progress_step(run) >= 150, timeout=240)
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    wait_until("the restart", lambda: len([e for e in events(run) if e["event"] == "begin"]) == 2)
    wait_until("step 450", lambda: progress_step(run) >= 450, timeout=240)
    preempt_with_high_job(slurm_env, tmp_path)
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "COMPLETED"
    ends = [e for e in events(run) if e["event"] == "end"]
    assert [(e["reason"], bool(e.get("in_job"))) for e in ends] == [
        ("failure", True),
        ("preemption", False),
        ("completed", False),
    ], ends
    # No checkpoint before the kill: the restart started from step 0 and redid every step since.
    crashed, restarted = ends[0], ends[1]["phases"]
    assert restarted["started_step"] == 0 < crashed["step"] < EVERY, (crashed, restarted)

    shown = json.loads(slurmddp(slurm_env, tmp_path, "status", str(run), "--json").stdout)
    (row,) = shown["elements"]
    got = row["goodput"]
    expected = by_hand(run)
    print(f"\ngoodput {got}\nby hand {expected}")
    for part in ("starts", "checkpoints", "redone", "stops", "restarts", "training"):
        assert got[f"{part}_s"] == pytest.approx(expected[part], abs=1e-3), part
    assert got["queue_s"] == pytest.approx(expected["queue"], abs=1.0)  # submitted_at: whole seconds
    assert got["redone_s"] > 0 and got["restarts_s"] > 0 and got["queue_s"] > 0
    allocated = sum(expected[part] for part in expected if part != "queue")
    assert got["allocated_s"] == pytest.approx(allocated, abs=1e-3)
    table = slurmddp(slurm_env, tmp_path, "status", str(run)).stdout
    share = f"{100 * got['training_s'] / allocated:.1f}%"
    assert share in table.splitlines()[2].split(), table
    assert f"run: goodput {share} of " in table and "steps redone" in table, table
