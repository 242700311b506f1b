"""What a rank says and records of its attempt for the user: the banner's attempt number (the one
`status` and the progress line show), a stop that is a cancel, and the checkpoints the loop
skipped for want of space."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from dist_envs import dist_env
from test_loop import make_loop

from slurmddp.job.checkpoint import store as checkpoint_store
from slurmddp.job.checkpoint.space import bytes_on_disk
from slurmddp.job.launch import runtime
from slurmddp.job.process.stop import StopForRequeue
from slurmddp.rundir import records
from slurmddp.rundir.records import CANCELLED, AttemptId, Begin, End, Resubmit, SkippedSaves


def test_the_banner_counts_the_attempts_of_the_run_across_a_resubmit(tmp_path: Path) -> None:
    records.append_attempt(tmp_path, Begin(0, 1.0, "node1", "node1", AttemptId("7", 0)))
    records.append_attempt(
        tmp_path, End(CANCELLED, None, 2.0, requeue=False, final=True, message="cancelled")
    )
    records.append_attempt(tmp_path, Resubmit(3.0, ["resubmit"]))
    # The resubmitted job's first attempt: its job's restart count is 0, the run's second attempt.
    assert runtime.banner(dist_env(job_id="8"), tmp_path).endswith(", job 8, attempt 2")
    records.append_attempt(tmp_path, Begin(1, 4.0, "node1", "node1", AttemptId("8", 0)))
    assert runtime.banner(dist_env(job_id="8", rank=0), tmp_path).endswith(", job 8, attempt 2")


def test_a_stop_for_a_cancel_says_it_saved_and_the_run_ends(tmp_path: Path) -> None:
    stop = StopForRequeue(478, signal.SIGTERM)
    assert runtime.stop_message(tmp_path, stop) == "stopped at step 478 on SIGTERM; the job will be requeued"
    records.append_attempt(
        tmp_path, End(CANCELLED, None, 2.0, requeue=False, final=True, message="cancelled by the user")
    )
    said = runtime.stop_message(tmp_path, stop)
    assert said == (
        "stopped at step 478 for the cancel and saved a checkpoint there; the run ends "
        "(`resubmit` resumes from that checkpoint)"
    )
    assert "requeued" not in said


def test_rank_0_counts_the_checkpoints_skipped_for_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = make_loop(tmp_path, torch.nn.Linear(2, 2))
    loop.step = 2
    loop.save()
    needed = bytes_on_disk(tmp_path / "checkpoints" / "step-00000002")
    monkeypatch.setattr(checkpoint_store, "free_bytes", lambda path: needed - 1)
    for step in (4, 6):
        loop.step = step
        loop.save()
    skipped = SkippedSaves.read(tmp_path)
    assert skipped is not None
    assert (skipped.count, skipped.step, skipped.attempt) == (2, 6, AttemptId("1", 0))
    assert skipped.why.startswith(f"no space left on {tmp_path / 'checkpoints'}: ")
