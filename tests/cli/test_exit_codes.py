"""The CLI's exit statuses tell the user's mistakes (2) from Slurm failing on its own (3), with fake
Slurm commands on PATH (the real-cluster tests cover the commands working)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurmddp.cli.main import main
from slurmddp.errors import EXIT_SLURM_ERROR, EXIT_USER_ERROR


def fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A submitted run whose job 4242 squeue says is running; scancel refuses to cancel it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir, "squeue", 'echo "4242|RUNNING"')
    fake_tool(bin_dir, "sacct", "exit 0")
    fake_tool(
        bin_dir, "scancel", 'echo "scancel: error: Kill job error on job id 4242: Access denied" >&2; exit 1'
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run = tmp_path / "run"
    run.mkdir()
    manifest = {"executor": "slurm", "job_id": "4242", "logs": str(run / "logs"), "world_size": 1}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


@pytest.mark.process  # the fake scancel on PATH
def test_a_failing_scancel_is_a_slurm_error_not_a_user_error(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cancel", str(run_dir)]) == EXIT_SLURM_ERROR
    err = capsys.readouterr().err
    assert "scancel 4242: scancel: error: Kill job error on job id 4242: Access denied" in err
    assert "Traceback" not in err


def test_a_run_that_does_not_exist_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", str(tmp_path / "nowhere")]) == EXIT_USER_ERROR
    assert "is neither a run or sweep directory nor a job id" in capsys.readouterr().err
