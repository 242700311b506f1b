"""`executor: auto` takes Slurm only where a controller answers, and says why when it does not; dryrun
warns when it cannot tell the Slurm release. Fake sbatch and scontrol on PATH play the cluster."""

from __future__ import annotations

import io
import shutil
import stat
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT

from slurmddp.cli import dryrun
from slurmddp.experiment.load import load_experiment
from slurmddp.submit.plan import build
from slurmddp.submit.prepare import ExecutorChoice, choose_executor, plan_for

# What scontrol ping says where no controller can be reached (Slurm 22.05, no SLURM_CONF).
DEAD = """echo 'scontrol: error: _establish_config_source: failed to fetch config' >&2
echo 'scontrol: fatal: Could not establish a configuration source' >&2
exit 1"""
UP = "echo 'Slurmctld(primary) at ctl is UP'"
BACKUP_UP = "echo 'Slurmctld(primary) at ctl is DOWN'; echo 'Slurmctld(backup) at ctl2 is UP'; exit 1"


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scontrol: str | None) -> None:
    """Only these tools on PATH: sbatch, and scontrol running `scontrol` (None: no scontrol)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {"sbatch": "exit 0", **({"scontrol": scontrol} if scontrol is not None else {})}
    for name, script in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))


@pytest.mark.process  # scontrol ping
def test_auto_runs_locally_when_no_controller_answers_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_slurm(tmp_path, monkeypatch, DEAD)
    choice = choose_executor("auto")
    assert choice == ExecutorChoice(
        "local",
        "sbatch is on PATH but no Slurm controller answers (scontrol ping: scontrol: fatal: Could not "
        "establish a configuration source); running locally. Set executor=slurm to insist.",
    )
    plan = plan_for(load_experiment(QUICKSTART, []), run_dir=tmp_path / "run")
    assert plan.executor == "local" and plan.notes[0] == choice.why
    assert choose_executor("slurm") == ExecutorChoice("slurm")


@pytest.mark.process  # scontrol ping
@pytest.mark.parametrize("scontrol", [UP, BACKUP_UP], ids=["primary", "backup"])
def test_auto_takes_slurm_when_a_controller_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scontrol: str
) -> None:
    fake_slurm(tmp_path, monkeypatch, scontrol)
    assert choose_executor("auto") == ExecutorChoice("slurm")


@pytest.mark.process  # scontrol ping
def test_a_ping_that_hangs_is_given_up_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_slurm(tmp_path, monkeypatch, f"exec {shutil.which('sleep')} 30")
    monkeypatch.setattr("slurmddp.cluster.slurm.PING_TIMEOUT_S", 0.5)
    choice = choose_executor("auto")
    assert choice.executor == "local" and "(scontrol ping: no answer within 0.5 s)" in (choice.why or "")


def test_without_sbatch_auto_is_local_and_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert choose_executor("auto") == ExecutorChoice("local")


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ((24, 11, 5), "# slurmddp: written for Slurm 24.11.5 (sbatch --version)\n"),
        (
            None,
            "# slurmddp: warning: the Slurm release could not be found (sbatch --version printed none); "
            "written for any release from 22.05 on: the script exports SRUN_CPUS_PER_TASK, which 22.05 "
            "and 23.02 need and later releases ignore\n",
        ),
    ],
)
def test_dryrun_says_which_slurm_release_the_script_is_for(
    tmp_path: Path, version: tuple[int, int, int] | None, said: str
) -> None:
    loaded = load_experiment(QUICKSTART, [])
    plan = build(
        loaded, executor="slurm", workdir=ROOT, run_dir=tmp_path, interpreter="python3", slurm_version=version
    )
    out = io.StringIO()
    dryrun.show(loaded, [], plan, out)
    assert said in out.getvalue()
    assert ("export SRUN_CPUS_PER_TASK" in plan.batch_script()) is (version is None)
