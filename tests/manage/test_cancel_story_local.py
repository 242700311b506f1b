"""A local quickstart cancelled mid-training, then resubmitted, as a user reads it: rank 0 says it
stopped for the cancel (not that it will be requeued), `status` and the ending block say where a
resubmit resumes, and every place numbers the attempts alike."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, only_run
from quickstart_runs import last_step
from test_status_story import cancelled_at, local_run, save_checkpoint

SETTINGS = (
    str(QUICKSTART),
    "executor=local",
    "resources.nodes=1",
    "resources.tasks_per_node=2",
    "train.epochs=60",
    "train.workers=1",
    "train.record_samples=true",
    "checkpoint.every_steps=5",
)


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def rank0_log(run: Path) -> str:
    return "".join(path.read_text() for path in sorted((run / "logs").glob("*_0_log.*")))


@pytest.mark.process
def test_a_cancelled_run_says_where_it_resumes_and_its_resubmit_is_attempt_2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", *SETTINGS, f"output_dir={out}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240
    while last_step(out) < 12:
        assert proc.poll() is None and time.monotonic() < deadline, "no step 12"
        time.sleep(0.05)
    run = only_run(out)
    assert cli(tmp_path, "cancel", str(run)).returncode == 0
    followed, _ = proc.communicate(timeout=120)
    stopped_at = int(sorted((run / "checkpoints").glob("step-*"))[-1].name.split("-")[1])
    log = rank0_log(run)
    assert f"stopped at step {stopped_at} for the cancel and saved a checkpoint there" in log, log[-2000:]
    assert "will be requeued" not in log and "already ended" not in log, log[-2000:]
    assert f"run it again from step {stopped_at}, its newest complete checkpoint" in followed, followed

    status = cli(tmp_path, "status", str(run), "--json")
    row = json.loads(status.stdout)["elements"][0]
    assert row["resume"]["step"] == stopped_at and row["step"] == stopped_at, row
    assert [(end["attempt"], end["reason"], end["step"]) for end in row["ended"]] == [
        (1, "cancelled", stopped_at)
    ], row

    again = cli(tmp_path, "resubmit", str(run))
    assert again.returncode == 0, again.stdout + again.stderr
    assert ", attempt 2\n" in rank0_log(run)
    text = cli(tmp_path, "status", str(run)).stdout
    assert f"run: attempt 1: cancelled at step {stopped_at}; attempt 2: completed" in text, text


@pytest.mark.process
def test_status_finds_the_resume_point_without_importing_torch(tmp_path: Path) -> None:
    run = local_run(tmp_path)
    cancelled_at(run, stopped=478, progressed=450)
    save_checkpoint(run, 478)
    code = (
        "import sys\nfrom slurmddp.cli.main import main\ncode = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules, 'status imported torch'\nraise SystemExit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "status", str(run)], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "run: a resubmit resumes from step 478" in done.stdout, done.stdout
