"""A sweep's plan: one Slurm array whose script limits parallelism and finds its element, checked
for elements that would collide; and the dryrun that lists the elements."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, write_sweep

from slurmddp.cli.main import main
from slurmddp.defaults import VERSION
from slurmddp.errors import ConfigError, SubmitError
from slurmddp.experiment.load import expand, load_experiment
from slurmddp.rundir import records
from slurmddp.submit import submitter
from slurmddp.submit.plan import SubmissionPlan
from slurmddp.submit.prepare import plan_for

SWEEP = ROOT / "examples" / "sweep.yaml"


def sweep_plan(tmp_path: Path, exp: Path) -> SubmissionPlan:
    loaded = load_experiment(exp)
    return plan_for(loaded, elements=expand(loaded), executor="slurm", run_dir=tmp_path, workdir=tmp_path)


def test_a_shared_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.2]}}", extra="checkpoint: {dir: /shared/ckpt}\n")
    with pytest.raises(ConfigError, match="sweep elements 0 and 1 would share /shared/ckpt"):
        sweep_plan(tmp_path, exp)


def test_a_fixed_port_shared_by_elements_is_refused(tmp_path: Path) -> None:
    exp = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.2]}}", extra="dist: {port: 29500}\n")
    with pytest.raises(ConfigError, match="sweep elements 0 and 1 both use port 29500"):
        sweep_plan(tmp_path, exp)
    # Varied per element, the ports do not collide.
    varied = write_sweep(tmp_path, "{list: [{dist.port: 29500}, {dist.port: 29501}]}")
    assert [rank.dist.port for rank in sweep_plan(tmp_path, varied).array] == [29500, 29501]


def test_the_array_script_limits_parallelism_and_finds_its_element(tmp_path: Path) -> None:
    loaded = load_experiment(SWEEP)
    elements = expand(loaded)
    plan = plan_for(
        loaded,
        elements=elements,
        executor="slurm",
        run_dir=tmp_path,
        workdir=ROOT,
        submission=0,
        max_parallel=2,
    )
    script = plan.batch_script()
    assert "#SBATCH --array=0-5%2" in script
    assert f"-m slurmddp.job.allocation.attempts begin {tmp_path} --submission 0" in script
    assert f'-m slurmddp.job.allocation.attempts end {tmp_path} "$slurmddp_status" --submission 0' in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert [spec.run_dir for spec in plan.array] == [str(tmp_path / e.dir_name) for e in elements]
    assert [spec.config["train"]["lr"] for spec in plan.array] == [0.01, 0.01, 0.05, 0.05, 0.2, 0.2]
    # The array's parallelism is the sweep's unless the caller (a resubmission) says otherwise;
    # without Slurm the elements run one after another, each planned on its own.
    same = {"elements": elements, "run_dir": tmp_path, "workdir": ROOT}
    assert plan_for(loaded, executor="slurm", **same).parameters["array_parallelism"] == 2
    assert plan_for(loaded, executor="slurm", max_parallel=5, **same).parameters["array_parallelism"] == 5
    assert plan_for(loaded, executor="local", **same).array == ()

    # The batch side resolves SWEEP_DIR + submission + array task to the element's directory.
    manifest = {"elements": [{"dir": e.dir_name} for e in elements], "submissions": [{"elements": [5, 2]}]}
    (tmp_path / "sweep.json").write_text(json.dumps(manifest))
    found = records.element_dir(tmp_path, 0, {"SLURM_ARRAY_TASK_ID": "1"})
    assert found == tmp_path / elements[2].dir_name
    # A one-element resubmission is a plain job: no array task id.
    assert records.element_dir(tmp_path, 0, {}) == tmp_path / elements[5].dir_name


def test_an_array_over_max_array_size_is_refused() -> None:
    submitter.check_array_size(1001, 1001)
    with pytest.raises(SubmitError, match="1002 elements but this cluster's MaxArraySize is 1001"):
        submitter.check_array_size(1002, 1001)


def test_dryrun_of_a_sweep_lists_its_elements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dryrun", str(SWEEP), "executor=local", f"output_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "# ---- sweep: 6 elements (grid) ----" in out
    assert [line.split(": ")[1] for line in out.splitlines() if line.startswith("# 00")] == [
        f"lr={lr} width={width}" for lr in (0.01, 0.05, 0.2) for width in (128, 256)
    ]
    assert not tmp_path.joinpath("sweep").exists()


def test_one_container_shared_by_every_element_is_on_the_srun_line_itself(tmp_path: Path) -> None:
    shared = write_sweep(
        tmp_path, "{grid: {lr: [0.1, 0.2]}}", extra="container: {image: 'nvcr.io#nvidia/pytorch:24.10-py3'}\n"
    )
    plan = sweep_plan(tmp_path, shared)
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.10-py3'" in plan.batch_script()
    assert "slurmddp_container" not in plan.batch_script() and plan.containers == ("pyxis",)


def test_each_element_starts_in_its_own_container(tmp_path: Path) -> None:
    """Elements in different containers (one in none): each array task runs srun with its own
    options and interpreter, which the batch script picks by SLURM_ARRAY_TASK_ID."""
    sif = tmp_path / "torch.sif"
    sif.write_bytes(b"SIF")
    varied = write_sweep(
        tmp_path,
        f"{{list: [{{container.image: 'nvcr.io#a:1'}}, {{container.image: '{sif}', container.python: "
        "python3}, {container.image: null}]}",
    )
    plan = sweep_plan(tmp_path, varied)
    assert plan.containers == ("apptainer", "pyxis")
    script = plan.batch_script()
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert '--overlap "${slurmddp_container[@]}" -u -m slurmddp.job.launch.boot -u -m' in srun, srun
    # What each array task would hand srun: the table run by bash, as the batch script runs it.
    table = "\n".join(line for line in script.splitlines() if line.startswith(("case ", "  ", "esac")))
    words = {
        task: subprocess.run(
            ["bash", "-c", f'{table}\nprintf "%s\\n" "${{slurmddp_container[@]}}"'],
            env={"SLURM_ARRAY_TASK_ID": str(task), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        for task in range(3)
    }
    assert words[0][0] == "--container-image=nvcr.io#a:1" and words[0][-2].startswith("--export=ALL,")
    assert words[0][-1] == "python3" and not any(str(sif) in word for word in words[0])
    assert words[1][0] == f"--export=ALL,SLURMDDP_SUBMITTED_WITH={VERSION}" and words[1][2] == "exec"
    assert words[1][-2:] == [str(sif), "python3"] and f"{tmp_path}:{tmp_path}" in words[1]
    assert words[2] == [sys.executable]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def exported_by(script: str, task: int, name: str) -> str:
    """What the batch script's exports for a resident task (the lines after the launcher's own
    variable, up to the attempt's begin) leave in `name` for array task `task`, run by bash."""
    lines = script.splitlines()
    start = lines.index("export SLURMDDP_RESIDENT=1") + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("slurmddp_place="))
    return subprocess.run(
        ["bash", "-c", "\n".join([*lines[start:end], f'printf "%s" "${name}"'])],
        env={"SLURM_ARRAY_TASK_ID": str(task), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_each_array_task_imports_torch_with_its_own_elements_variables(tmp_path: Path) -> None:
    """A resident task imports torch before it forks the rank, so what torch reads at import
    (fabric.env: TORCH_LOGS, TORCHDYNAMO_*) must be each element's own, not the first one's."""
    varied = write_sweep(
        tmp_path,
        "{list: [{fabric.env: {TORCH_LOGS: '+dynamo'}}, {fabric.env: {TORCH_LOGS: 'recompiles'}}, "
        "{lr: 0.3}]}",
    )
    script = sweep_plan(tmp_path, varied).batch_script()
    assert [exported_by(script, task, "TORCH_LOGS") for task in range(3)] == ["+dynamo", "recompiles", ""]
    assert [exported_by(script, task, "OMP_NUM_THREADS") for task in range(3)] == ["1", "1", "1"]


def test_the_resident_launcher_cannot_vary_within_a_sweep(tmp_path: Path) -> None:
    varied = write_sweep(tmp_path, "{grid: {requeue.resident_launcher: [true, false]}}")
    with pytest.raises(ConfigError, match=r"'requeue\.resident_launcher' cannot vary within a sweep"):
        sweep_plan(tmp_path, varied)


def test_the_snapshot_folder_is_set_up_where_any_element_takes_snapshots(tmp_path: Path) -> None:
    varied = write_sweep(
        tmp_path,
        "{list: [{checkpoint.snapshot_every_steps: null}, {lr: 0.2}]}",
        extra="checkpoint: {snapshot_every_steps: 0}\n",
    )
    assert "--job-name=slurmddp-snapshots" in sweep_plan(tmp_path, varied).batch_script()
    none = write_sweep(tmp_path, "{grid: {lr: [0.1, 0.2]}}", extra="checkpoint: {snapshot_every_steps: 0}\n")
    assert "--job-name=slurmddp-snapshots" not in sweep_plan(tmp_path, none).batch_script()
