"""The batch scripts of five representative experiments (CPU, GPU per node, a sweep, ranks in a
pyxis container and in an Apptainer one), compared
byte for byte with the files beside them: any change to what sbatch receives shows up as a diff
to review. The interpreter and the run directory vary by machine and are written as PYTHON and
RUN_DIR. After an intended change: SLURMDDP_UPDATE_GOLDEN=1 pytest tests/submit/test_golden.py."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurmddp.cluster import slurm
from slurmddp.experiment.load import PROFILE_PATH_ENV, expand, load_experiment
from slurmddp.submit.prepare import plan_for

GOLDEN = Path(__file__).resolve().parent / "golden"
REPO = Path(__file__).resolve().parents[2]
UPDATE_ENV = "SLURMDDP_UPDATE_GOLDEN"


@pytest.fixture(autouse=True)
def slurm_22_05(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripts are written for the release `sbatch --version` names: Debian 12's here."""
    monkeypatch.setattr(slurm, "version", lambda: (22, 5, 8))


def rendered(name: str, run_dir: Path) -> str:
    loaded = load_experiment(GOLDEN / f"{name}.yaml")
    elements = expand(loaded) if loaded.sweep is not None else []
    plan = plan_for(loaded, elements=elements, executor="slurm", run_dir=run_dir, workdir=REPO)
    script = plan.batch_script()
    script = script.replace(str(run_dir), "RUN_DIR").replace(shlex.quote(sys.executable), "PYTHON")
    return script.replace(str(REPO), "REPO")


@pytest.mark.parametrize("name", ["cpu", "gpu_node", "sweep", "pyxis", "apptainer"])
def test_batch_script_is_byte_for_byte_the_golden_one(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_PATH_ENV, str(REPO / "configs"))
    script = rendered(name, tmp_path / "run")
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get(UPDATE_ENV) == "1":
        golden.write_text(script)
    assert golden.read_text() == script, f"{golden} differs from the rendered script"
    # And it is a shell script bash can read.
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_the_sweep_script_is_one_array_limited_to_max_parallel() -> None:
    script = (GOLDEN / "sweep.sh").read_text()
    assert "#SBATCH --array=0-5%2" in script
    assert "-m slurmddp.job.allocation.attempts begin RUN_DIR --submission 0" in script


def test_from_23_11_srun_takes_the_cpus_per_task_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_PATH_ENV, str(REPO / "configs"))
    export = 'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"'
    assert export in rendered("cpu", tmp_path / "run")
    monkeypatch.setattr(slurm, "version", lambda: (24, 11, 5))
    newer = rendered("cpu", tmp_path / "run")
    assert export not in newer and "SRUN_CPUS_PER_TASK" not in newer
