"""Runs that wait for runs on the real cluster: `submit --after RUN` starts only once RUN completed
(scontrol shows the dependency), and behind a run that failed it is named as never starting:
refused at submit where RUN failed already, cancelled by Slurm and said by `status` where RUN
fails while it waits."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, wait_for_job, wait_until
from conftest import slurmddp as cli

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("22.05")]

SYNTHETIC = ROOT / "examples" / "synthetic.yaml"
ONE_NODE = ("resources.nodes=1", "resources.tasks_per_node=1")
BOOM = """\
import time
def main(ctx):
    time.sleep(4)
    raise RuntimeError("this run fails")
"""


def submitted(env: dict[str, str], work: Path, out: Path, *args: str) -> tuple[Path, str]:
    before = set(out.glob("*/*/manifest.json"))
    proc = cli(env, work, "submit", *args, f"output_dir={out}", "--no-wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (manifest,) = set(out.glob("*/*/manifest.json")) - before
    return manifest.parent, str(json.loads(manifest.read_text())["job_id"])


def times(run: Path, event: str) -> list[float]:
    lines = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
    return [line["time"] for line in lines if line["event"] == event]


def test_a_run_after_another_starts_once_it_completed_and_never_after_a_failure(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    work = tmp_path / "work"
    work.mkdir()
    (work / "synthetic_train.py").write_text((ROOT / "examples" / "synthetic_train.py").read_text())
    (work / "boom.py").write_text(BOOM)
    (work / "boom.yaml").write_text(
        "entrypoint: boom.py:main\nresources: {nodes: 1, tasks_per_node: 1, time: '00:05:00'}\n"
        "requeue: {max_failures: 0}\n"
    )
    out = tmp_path / "runs"
    first, first_job = submitted(env, work, out, str(SYNTHETIC), *ONE_NODE, "train.steps=600")
    second, second_job = submitted(
        env, work, out, str(SYNTHETIC), *ONE_NODE, "train.steps=20", "--after", str(first)
    )
    shown = subprocess.run(
        ["scontrol", "show", "job", second_job], env=env, capture_output=True, text=True
    ).stdout
    assert f"Dependency=afterok:{first_job}" in shown, shown
    said = cli(env, work, "status", str(second)).stdout
    assert f"waits for {first} to complete (afterok:{first_job})" in said, said

    failing, failing_job = submitted(env, work, out, "boom.yaml")
    waiting, waiting_job = submitted(env, work, out, str(SYNTHETIC), *ONE_NODE, "--after", failing_job)
    assert wait_for_job(first_job, env) == "COMPLETED"
    assert wait_for_job(second_job, env) == "COMPLETED"
    assert min(times(second, "begin")) >= max(times(first, "end")) - 1  # sacct's 1 s resolution
    assert wait_for_job(failing_job, env) == "FAILED"
    # Slurm cancels the job whose dependency can never be met (--kill-on-invalid-dep).
    assert wait_for_job(waiting_job, env, timeout=180) == "CANCELLED"
    wait_until(
        "status names why it never starts",
        lambda: "never starts" in cli(env, work, "status", str(waiting)).stdout,
    )
    said = cli(env, work, "status", str(waiting)).stdout
    assert f"it was to run after {failing} completed, which ended FAILED" in said, said

    # Behind a run that failed already: refused, nothing submitted.
    runs_before = sorted(out.glob("*/*"))
    refused = cli(
        env, work, "submit", str(SYNTHETIC), *ONE_NODE, f"output_dir={out}", "--after", str(failing)
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "ended FAILED, so a job after it would never start" in refused.stderr
    assert f"--after-any {failing}" in refused.stderr
    assert sorted(out.glob("*/*")) == runs_before
