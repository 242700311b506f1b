"""The quickstart as a user runs it first, on this machine: it learns, and a run stopped twice at
moments the test draws at random ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import QUICKSTART, ROOT, only_run, rank_pids
from quickstart_runs import assert_every_sample_once_per_epoch, last_step, result, validation_history

# 3 ranks: with two, a + b == b + a and a changed summation order would go unseen.
EPOCHS = 5
GLOBAL_BATCH = 66
SETTINGS = (
    "resources.nodes=1",
    "resources.tasks_per_node=3",
    f"train.global_batch={GLOBAL_BATCH}",
    f"train.epochs={EPOCHS}",
    "train.workers=2",
    "train.record_samples=true",
    "precision.autocast=bfloat16",
    "ddp.accumulate=2",
)


def submit(out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", *args, "executor=local", f"output_dir={out}"],
        cwd=out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def resumes(out: Path) -> int:
    """Attempts that resumed from a checkpoint so far (the local executor keeps no restart count)."""
    logs = out.glob("quickstart/*/logs/*_0_log.out")
    return sum(path.read_text().count("slurmddp: resumed from") for path in logs)


def test_the_default_quickstart_learns_the_digits(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = submit(out, str(QUICKSTART))
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    outcome = result(only_run(out))["result"]
    assert outcome["val_acc"] > 0.8, outcome  # chance is 0.1
    history = validation_history(only_run(out))
    assert len(history) == 8 and history[-1][1] > history[0][1]


def test_the_template_trains(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = submit(out, str(ROOT / "templates" / "experiment.yaml"), "train.epochs=2")
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    history = [json.loads(line) for line in (only_run(out) / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in history if "val_loss" in r]
    assert len(val) == 2 and math.isfinite(val[0]) and val[1] < val[0]


def test_stopped_twice_at_random_steps_it_ends_on_the_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    reference = submit(tmp_path / "ref", str(QUICKSTART), *SETTINGS)
    # Both stops well before the last of the 105 steps, so each is seen before the run ends, and
    # each a few steps into an epoch (21 steps each), so that a stop a few steps late (the signal
    # goes once progress.json shows the step, and a rank spends longest at an epoch's start, where
    # its loader workers start) still stops mid-epoch: in CI, stops asked at 17 and 60 came at 21
    # and 63, both epoch ends, and the run proved nothing of a mid-epoch resume.
    epoch = 1437 // GLOBAL_BATCH
    into = random.randrange(0, 2)
    stops = [epoch * into + random.randrange(3, 10), epoch * (into + 2) + random.randrange(3, 10)]
    out = tmp_path / "stopped"
    proc = submit(out, str(QUICKSTART), *SETTINGS)
    for attempt, threshold in enumerate(stops):
        deadline = time.monotonic() + 240
        # A resumed attempt starts at its checkpoint, below the next threshold: a step at or past
        # it was written by this attempt.
        while not (resumes(out) == attempt and last_step(out) >= threshold):
            assert proc.poll() is None and time.monotonic() < deadline, f"no step {threshold} (stops {stops})"
            time.sleep(0.05)
        for pid in rank_pids(only_run(out)):
            os.kill(pid, signal.SIGUSR2)
        while resumes(out) == attempt:
            assert proc.poll() is None and time.monotonic() < deadline, f"no resume (stops {stops})"
            time.sleep(0.05)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    ref_out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, ref_out

    run, ref = only_run(out), only_run(tmp_path / "ref")
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    stopped = [int(part.split()[0]) for part in log.split("stopped at step ")[1:]]
    assert len(stopped) == 2 and any(s % (1437 // GLOBAL_BATCH) for s in stopped), (stops, stopped)
    for step in stopped:
        assert f"resumed from {run / 'checkpoints'}/step-{step:08d} at step {step}" in log, (
            step,
            log[-2000:],
        )
    assert result(run)["result"]["param_sha256"] == result(ref)["result"]["param_sha256"], (stops, stopped)
    assert validation_history(run) == validation_history(ref)
    assert len(validation_history(run)) == EPOCHS
    assert_every_sample_once_per_epoch(run, GLOBAL_BATCH, EPOCHS)
