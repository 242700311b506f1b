"""On the real lab with its slurmctld stopped, `submit` with `executor: auto` (the quickstart as
shipped) refuses: it exits non-zero, says what `scontrol ping` said and how to go on, trains
nothing on this machine, and leaves no run directory and no entry in the user's list of runs.
slurmctld is started again afterwards, however the test ends, so the lab is left sound."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_job_id, slurm_command, slurmddp, submit_run, wait_for_job
from lab_control import LabDaemons, wait_gone

from slurmddp.errors import EXIT_SLURM_ERROR

pytestmark = pytest.mark.slurm


def start_slurmctld(lab: LabDaemons, registered: bool = True) -> None:
    """As tests/slurm_lab/up starts it; returns once `scontrol ping` says it is UP and, with
    `registered`, every node registered again (UNKNOWN until then: the next test on this lab was
    refused its submission)."""
    with (lab.state_dir / "log" / "slurmctld.log").open("a") as log:
        subprocess.run(
            ["slurmctld", "-f", str(lab.conf)],
            env=lab.daemon_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            check=True,
        )
    deadline = time.monotonic() + 30
    while "is UP" not in slurm_command(["scontrol", "ping"], lab.env).stdout:
        if time.monotonic() > deadline:
            raise TimeoutError(f"slurmctld does not answer 30 s after its start: see {lab.state_dir}/log")
        time.sleep(0.2)
    if registered:
        wait_registered(lab)


def wait_registered(lab: LabDaemons) -> None:
    deadline = time.monotonic() + 60
    while nodes_unknown(lab.env):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not registered 60 s after slurmctld answered: see {lab.state_dir}/log")
        time.sleep(0.5)


def nodes_unknown(env: dict[str, str]) -> bool:
    return "unknown" in slurm_command(["sinfo", "-h", "-N", "-o", "%T"], env).stdout.lower()


def stop_slurmctld(lab: LabDaemons) -> None:
    """SIGTERM: it saves its state."""
    pid = lab.pid("slurmctld")
    os.kill(pid, signal.SIGTERM)
    wait_gone(pid)


@pytest.fixture
def controller_down(slurm_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The lab with its slurmctld stopped (SIGTERM: it saves its state), started again after."""
    lab = LabDaemons(slurm_env)
    stop_slurmctld(lab)
    try:
        yield slurm_env
    finally:
        start_slurmctld(lab)


def test_submit_refuses_when_no_controller_answers(controller_down: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = slurmddp(controller_down, tmp_path, "submit", str(QUICKSTART), f"output_dir={out}", timeout=120)
    assert proc.returncode == EXIT_SLURM_ERROR, proc.stdout + proc.stderr
    assert "no Slurm controller answers (scontrol ping: " in proc.stderr, proc.stderr
    assert "is DOWN" in proc.stderr and "executor=local" in proc.stderr and "SLURM_CONF=" in proc.stderr
    assert "Traceback" not in proc.stderr and "ranks on this machine" not in proc.stdout, proc.stdout
    assert not out.exists(), f"a refused submission left {sorted(out.rglob('*'))}"
    index = Path(controller_down["XDG_STATE_HOME"]) / "slurmddp" / "runs.jsonl"
    assert not index.exists() or index.read_text() == "", index.read_text()


@pytest.mark.lab_generation("22.05")
def test_submit_right_after_slurmctld_started_is_queued(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """A just-started slurmctld holds its nodes UNKNOWN until their slurmd registers, and `sbatch
    --test-only` refuses every job meanwhile while sbatch itself would queue it (seen on this lab):
    a submit made the moment `scontrol ping` says UP waits for the nodes and is queued."""
    lab = LabDaemons(slurm_env)
    stop_slurmctld(lab)
    try:
        start_slurmctld(lab, registered=False)
        unknown = nodes_unknown(slurm_env)
        run = submit_run(slurm_env, tmp_path / "runs", "train.steps=1")
    finally:
        wait_registered(lab)
    job = run_job_id(run)
    slurm_command(["scancel", job], slurm_env, check=True)
    wait_for_job(job, slurm_env)
    assert unknown, "the nodes registered before the submit began: nothing was waited for"
