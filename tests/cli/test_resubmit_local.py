"""`resubmit RUN resources...` on this machine: a 3-rank quickstart cancelled at a step the test
draws at random, resubmitted onto 2 ranks, continues the same training: every step's samples are
the uninterrupted run's, and the final parameters equal its own to float64 rounding."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from conftest import QUICKSTART, only_run
from quickstart_runs import (
    assert_every_sample_once_per_epoch,
    global_batches,
    largest_parameter_difference,
    last_step,
    validation_history,
)

EPOCHS = 12
GLOBAL_BATCH = 60  # 20 a rank on 3, 30 on 2 (cut into 2 micro-batches of 15 by the resubmit)
SETTINGS = (
    str(QUICKSTART),
    "executor=local",
    "resources.nodes=1",
    "resources.tasks_per_node=3",
    f"train.global_batch={GLOBAL_BATCH}",
    f"train.epochs={EPOCHS}",
    "train.workers=1",
    "train.dropout=0",  # a sample's dropout mask depends on which rank draws it
    "train.dtype=float64",
    "train.record_samples=true",
)


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_a_cancelled_run_resubmitted_onto_fewer_ranks_continues_the_same_training(tmp_path: Path) -> None:
    reference = cli(tmp_path, "submit", *SETTINGS, f"output_dir={tmp_path / 'ref'}")
    assert reference.returncode == 0, reference.stdout + reference.stderr

    out = tmp_path / "resized"
    threshold = random.randrange(10, 80)
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", *SETTINGS, f"output_dir={out}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240
    while last_step(out) < threshold:
        assert proc.poll() is None and time.monotonic() < deadline, f"no step {threshold}"
        time.sleep(0.05)
    run = only_run(out)
    cancelled = cli(tmp_path, "cancel", str(run))
    assert cancelled.returncode == 0 and "cancelled job" in cancelled.stdout, cancelled.stdout
    followed, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "ended CANCELLED" in followed, followed
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert saved, "the cancelled ranks saved no checkpoint"
    stopped_at = int(saved[-1].name.split("-")[1])
    assert threshold <= stopped_at < EPOCHS * (1437 // GLOBAL_BATCH), (threshold, stopped_at)

    again = cli(tmp_path, "resubmit", str(run), "resources.tasks_per_node=2")
    said = again.stdout + again.stderr
    assert again.returncode == 0, said
    assert "3 ranks -> 2: ddp.accumulate 1 -> 2" in said, said
    assert "changed: ddp.accumulate, resources.tasks_per_node" in said, said
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    assert f"resumed from {saved[-1]} at step {stopped_at}" in log, log[-2000:]
    assert "the checkpoint was written by 3 ranks, this job has 2" in log

    # The same samples in the same steps, each step trained once by each rank that ran it: the
    # 3 ranks up to the stop, the 2 after it.
    ref = only_run(tmp_path / "ref")
    assert global_batches(run) == global_batches(ref)
    assert_every_sample_once_per_epoch(run, GLOBAL_BATCH, EPOCHS)
    last_of_rank2 = json.loads((run / "samples" / "rank-2.jsonl").read_text().splitlines()[-1])["step"]
    assert last_of_rank2 == stopped_at - 1
    # The same training: only the order of the sums differs (2 ranks, 2 micro-batches each).
    worst = largest_parameter_difference(run, ref)
    assert worst < 1e-9, worst
    print(f"stopped at step {stopped_at}, resumed on fewer ranks; largest parameter difference {worst:.3g}")
    history, ref_history = validation_history(run), validation_history(ref)
    assert [step for step, _, _ in history] == [step for step, _, _ in ref_history]
    for (_, acc, loss), (_, ref_acc, ref_loss) in zip(history, ref_history, strict=True):
        assert abs(acc - ref_acc) <= 1 / 360 and abs(loss - ref_loss) < 1e-9

    status = cli(tmp_path, "status", str(run), "--json")
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)["elements"][0]
    assert row["state"] == "COMPLETED", row
    assert cli(tmp_path, "resubmit", str(run)).returncode == 2  # completed: nothing to resume
