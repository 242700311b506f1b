"""`cancel` then `resubmit RUN resources.nodes=1` on the real lab: a 2-node quickstart (loader
workers on) cancelled while it trains stops at an agreed step and saves there, as on a preemption;
its resubmit continues on 1 node in its own directory, on the same samples in the same steps, to
the parameters of the uninterrupted 2-node run within float64 rounding."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, only_run, slurmddp, wait_for_job
from quickstart_runs import (
    TRAIN_SAMPLES,
    assert_every_sample_once_per_epoch,
    global_batches,
    largest_parameter_difference,
    last_step,
    validation_history,
)

pytestmark = pytest.mark.slurm

# Steps take ~10 ms here: 30 epochs leave over 600 steps (>6 s) after the stop is asked for at a
# step under 44, time for `cancel` to start and signal (6 epochs left 1 s: seen too short on 24.11).
EPOCHS = 30
GLOBAL_BATCH = 64
SETTINGS = (
    "profile=lab",
    "resources.nodes=2",
    "resources.tasks_per_node=1",
    f"train.global_batch={GLOBAL_BATCH}",
    f"train.epochs={EPOCHS}",
    "train.dropout=0",  # a sample's dropout mask depends on which rank draws it
    "train.dtype=float64",
    "train.record_samples=true",
)
TIMEOUT_S = 400


def submit(env: dict[str, str], out: Path) -> tuple[Path, str]:
    out.parent.mkdir(parents=True)
    proc = slurmddp(env, out.parent, "submit", str(QUICKSTART), *SETTINGS, f"output_dir={out}", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = only_run(out)
    return run, str(json.loads((run / "manifest.json").read_text())["job_id"])


# slurmddp's own stop and resume: `cancel` on both generations is test_sweep_cluster.py's cancel
# of one element.
@pytest.mark.lab_generation("24.11")
def test_a_cancelled_two_node_run_saved_and_resumes_on_one_node_on_the_same_samples(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    reference, reference_job = submit(slurm_env, tmp_path / "reference" / "runs")
    run, job = submit(slurm_env, tmp_path / "resized" / "runs")
    steps_per_epoch = TRAIN_SAMPLES // GLOBAL_BATCH
    threshold = random.randrange(5, 2 * steps_per_epoch)
    deadline = time.monotonic() + TIMEOUT_S
    while last_step(run) < threshold:
        assert time.monotonic() < deadline, f"no step {threshold}"
        time.sleep(0.2)
    cancelled = slurmddp(slurm_env, tmp_path, "cancel", str(run))
    said = cancelled.stdout + cancelled.stderr
    assert cancelled.returncode == 0, said
    # The ranks saved, then the job ended itself: Slurm accounts it as the user asked.
    assert wait_for_job(job, slurm_env, timeout=60) == "CANCELLED"
    stop_step = json.loads((run / "stop.json").read_text())["step"]
    assert threshold <= stop_step < EPOCHS * steps_per_epoch
    assert "its ranks stop at an agreed step and save first" in said, said
    assert f"a resubmit resumes from step {stop_step} (checkpoint " in said, said
    status = json.loads(slurmddp(slurm_env, tmp_path, "status", str(run), "--json").stdout)
    element = status["elements"][0]
    assert element["state"] == "CANCELLED" and element["resume"]["step"] == stop_step, element
    # Nothing failed: the loader workers lived until their rank had saved (a plain scancel's
    # SIGTERM killed them first: "DataLoader worker (pid N) is killed by signal: Terminated").
    assert not (run / "failure.json").exists(), (run / "failure.json").read_text()
    assert status["total"]["goodput"]["training_s"] > 0, status["total"]  # it read 0.0 s
    log = "".join(p.read_text() for p in sorted((run / "logs").glob(f"{job}_0_log.out")))
    assert f"stopped at step {stop_step} for the cancel and saved a checkpoint there" in log, log[-2000:]

    again = slurmddp(slurm_env, tmp_path, "resubmit", str(run), "resources.nodes=1")
    said = again.stdout + again.stderr
    assert again.returncode == 0, said
    assert "2 ranks -> 1: ddp.accumulate 1 -> 2" in said, said
    new_job = str(json.loads((run / "manifest.json").read_text())["job_id"])
    assert new_job != job and f"resubmitted slurm job {new_job} (1 ranks)" in said, said
    assert wait_for_job(new_job, slurm_env, timeout=TIMEOUT_S) == "COMPLETED"
    assert wait_for_job(reference_job, slurm_env, timeout=TIMEOUT_S) == "COMPLETED"

    log = "".join(p.read_text() for p in sorted((run / "logs").glob(f"{new_job}_0_log.out")))
    assert f"at step {stop_step}" in log and "the checkpoint was written by 2 ranks, this job has 1" in log
    # Counted: every step's global batch is the uninterrupted run's; each rank trained each of its
    # steps once; node2's rank stopped at the stop.
    assert global_batches(run) == global_batches(reference)
    assert_every_sample_once_per_epoch(run, GLOBAL_BATCH, EPOCHS)
    rank1 = (run / "samples" / "rank-1.jsonl").read_text().splitlines()
    assert json.loads(rank1[-1])["step"] == stop_step - 1
    worst = largest_parameter_difference(run, reference)
    assert worst < 1e-9, worst
    print(f"stopped at step {stop_step}, resumed on fewer ranks; largest parameter difference {worst:.3g}")
    history, ref_history = validation_history(run), validation_history(reference)
    assert [s for s, _, _ in history] == [s for s, _, _ in ref_history]
    assert abs(history[-1][2] - ref_history[-1][2]) < 1e-9, (history[-1], ref_history[-1])

    status = json.loads(slurmddp(slurm_env, tmp_path, "status", str(run), "--json").stdout)["elements"][0]
    assert status["state"] == "COMPLETED", status
    # The hours count both jobs' allocations: the first attempt's 2 nodes and the second's 1.
    assert status["cpu_hours"] > 0 and status["job_id"] == new_job
