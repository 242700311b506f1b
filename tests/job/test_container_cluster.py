"""Ranks in a container for real: the lab's OCI bundle (tests/slurm_lab/bundle: a Debian root with
python3, torch and this project) run by Slurm's own OCI support (`srun --container`, runc, the
oci.conf tests/slurm_lab/up writes), on both Slurm generations. The quickstart, submitted with
`container.image=BUNDLE`, is preempted by a real `high` job and ends with the parameters of the same
run uninterrupted; so does a plain torchrun script; a rank killed inside the container is restarted
in the allocation; a sweep starts each element in its own bundle; an interpreter that is missing
from the image, or has no slurmddp, ends the run at once with its words. `doctor` names the
runtimes the lab has (OCI) and has not (pyxis, Apptainer), and a `.sif` is refused.

Slurm 22.05 runs one task per node in a bundle (plan.OCI_TASKS_PER_NODE_UNTIL), so there the
quickstart runs 2 nodes x 1 rank; 24.11 runs it as shipped, 2 x 2. On 22.05 the container gets
srun's environment with the PATH of the submitting shell, so the interpreter is named by its path
inside the image."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    QUICKSTART,
    ROOT,
    preempt_with_high_job,
    progress_step,
    rank_mains,
    run_job_id,
    slurmddp,
    submit_run,
    wait_for_job,
    wait_until,
)
from quickstart_runs import result

from slurmddp.errors import EXIT_USER_ERROR

pytestmark = pytest.mark.slurm

BUNDLE_SCRIPT = ROOT / "tests" / "slurm_lab" / "bundle"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("oci") / "bundle"
    built = subprocess.run([str(BUNDLE_SCRIPT), str(where)], capture_output=True, text=True, timeout=900)
    if built.returncode == 77:
        pytest.skip(built.stderr.strip().splitlines()[-1])
    assert built.returncode == 0, built.stderr[-3000:]
    return where


def settings(bundle: Path, generation: str) -> tuple[str, ...]:
    shape = ("resources.tasks_per_node=1",) if generation == "22.05" else ()
    return (
        f"container.image={bundle}",
        "container.python=/opt/venv/bin/python",
        "train.epochs=30",
        "train.record_samples=true",
        "checkpoint.every_steps=100",
        *shape,
    )


def submit(env: dict[str, str], out: Path, *overrides: str, experiment: Path = QUICKSTART) -> Path:
    return submit_run(env, out, *overrides, experiment=experiment)


def ends(run: Path) -> list[dict[str, Any]]:
    lines = (run / "attempts.jsonl").read_text().splitlines() if (run / "attempts.jsonl").exists() else []
    return [record for line in lines if (record := json.loads(line))["event"] == "end"]


def param_hash(run: Path) -> str:
    return str(result(run)["ranks"][0]["param_sha256"])


@pytest.fixture(scope="module")
def reference(
    slurm_lab: dict[str, str], slurm_generation: str, bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> str:
    run = submit(
        slurm_lab, tmp_path_factory.mktemp("reference") / "runs", *settings(bundle, slurm_generation)
    )
    assert wait_for_job(run_job_id(run), slurm_lab, timeout=300) == "COMPLETED"
    log = "".join(path.read_text() for path in (run / "logs").glob("*_0_log.*"))
    assert "/opt/venv/bin/python" in (run / "logs" / f"{run_job_id(run)}_submission.sh").read_text()
    assert "--container=" in (run / "logs" / f"{run_job_id(run)}_submission.sh").read_text(), log
    # TensorBoard, the tracker every run writes to, wrote from inside the container.
    assert list((run / "tensorboard").glob("events.out.tfevents.*")), list(run.iterdir())
    return param_hash(run)


# One generation each for the two preemptions in a bundle (the torchrun script's on 22.05): each
# generation's container path is preempted, resumed and checked bit-exact once, not twice.
@pytest.mark.lab_generation("24.11")
def test_the_quickstart_in_a_bundle_is_preempted_and_ends_as_if_never_stopped(
    slurm_env: dict[str, str], slurm_generation: str, bundle: Path, reference: str, tmp_path: Path
) -> None:
    run = submit(slurm_env, tmp_path / "runs", *settings(bundle, slurm_generation))
    wait_until("step 150", lambda: progress_step(run) >= 150, timeout=240)
    preempt_with_high_job(slurm_env, tmp_path)
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "COMPLETED"
    assert [end["reason"] for end in ends(run)] == ["preemption", "completed"], ends(run)
    assert param_hash(run) == reference


# Beside the preemption on the same generation, which makes the reference both compare with.
@pytest.mark.lab_generation("24.11")
def test_a_rank_killed_inside_the_container_restarts_in_the_allocation(
    slurm_env: dict[str, str], slurm_generation: str, bundle: Path, reference: str, tmp_path: Path
) -> None:
    run = submit(
        slurm_env, tmp_path / "runs", *settings(bundle, slurm_generation), "requeue.in_job_restarts=1"
    )
    wait_until("step 150", lambda: progress_step(run) >= 150, timeout=240)
    # Any rank: on 22.05 every container starts with srun's SLURM_PROCID=0, so /proc cannot tell
    # which rank a process is (it works its own out at start).
    ranks = rank_mains(run)
    assert len(ranks) == (2 if slurm_generation == "22.05" else 4), ranks
    killed_at = time.time()
    os.kill(max(ranks), signal.SIGKILL)
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "COMPLETED"
    failed, completed = ends(run)
    assert failed["reason"] == "failure" and failed.get("in_job") is True, failed
    assert failed["time"] - killed_at < 30, "the surviving ranks hung"
    assert completed["reason"] == "completed"
    assert param_hash(run) == reference


def second_bundle(bundle: Path, where: Path) -> Path:
    """Another bundle: the first's root filesystem (a copy of hard links: runc refuses a symlinked
    root) with a folder mounted at /opt/alt holding a `python` of its own, found nowhere else."""
    alt = where / "alt"
    alt.mkdir(parents=True)
    (alt / "python").write_text('#!/bin/sh\nexec /opt/venv/bin/python "$@"\n')
    (alt / "python").chmod(0o755)
    other = where / "bundle-b"
    other.mkdir()
    subprocess.run(["cp", "-al", str(bundle / "rootfs"), str(other / "rootfs")], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["mounts"].append(
        {"destination": "/opt/alt", "type": "bind", "source": str(alt), "options": ["rbind"]}
    )
    (other / "config.json").write_text(json.dumps(config))
    return other


def test_a_sweep_starts_each_element_in_its_own_container(
    slurm_env: dict[str, str], slurm_generation: str, bundle: Path, tmp_path: Path
) -> None:
    """Element 1's interpreter exists in its own bundle only: it trains only if its array task
    started in that bundle, while element 0 starts in the first."""
    other = second_bundle(bundle, tmp_path)
    sweep = (
        f"sweep={{list: [{{container.image: {bundle}, container.python: /opt/venv/bin/python}}, "
        f"{{container.image: {other}, container.python: /opt/alt/python}}]}}"
    )
    shape = ("resources.tasks_per_node=1",) if slurm_generation == "22.05" else ()
    out = tmp_path / "runs"
    done = slurmddp(
        slurm_env,
        tmp_path,
        "submit",
        str(QUICKSTART),
        "train.epochs=2",
        *shape,
        sweep,
        f"output_dir={out}",
        "--wait",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    elements = sorted(path.parent for path in out.glob("*/*/*/result.json"))
    assert len(elements) == 2 and param_hash(elements[0]) == param_hash(elements[1]), done.stdout
    (script,) = out.glob("*/*/logs/*_submission.sh")
    assert f"--container={other}" in script.read_text() and "/opt/alt/python" in script.read_text()


@pytest.mark.parametrize(
    ("python", "said"),
    [
        # The image's own Python, beside the venv: it has no slurmddp.
        ("/usr/bin/python3", "No module named 'slurmddp'"),
        ("/opt/missing/python", "/opt/missing/python: no such file or directory"),
    ],
)
def test_an_interpreter_that_cannot_start_the_ranks_ends_the_run_at_once_saying_why(
    slurm_env: dict[str, str], slurm_generation: str, bundle: Path, tmp_path: Path, python: str, said: str
) -> None:
    run = submit(
        slurm_env,
        tmp_path / "runs",
        *settings(bundle, slurm_generation),
        f"container.python={python}",
        "requeue.in_job_restarts=2",
    )
    assert wait_for_job(run_job_id(run), slurm_env, timeout=120) == "FAILED"
    (end,) = ends(run)
    assert end["final"] and not end["requeue"] and end["step"] is None, end
    assert said in end["message"] and "container.python" in end["message"], end["message"]
    status = slurmddp(slurm_env, tmp_path, "status", str(run))
    assert "never started" in status.stdout and said in status.stdout, status.stdout


TORCHRUN_LOOP = ROOT / "examples" / "frameworks" / "torchrun.yaml"


def loop_steps(run: Path) -> list[int]:
    """The optimizer steps rank 0 of the torchrun loop made, in order (RUN_DIR/steps-0.log)."""
    path = run / "steps-0.log"
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


# The quickstart's preemption in a bundle is 24.11's (above).
@pytest.mark.lab_generation("22.05")
def test_a_torchrun_script_in_a_bundle_is_preempted_and_ends_as_if_never_stopped(
    slurm_env: dict[str, str], slurm_generation: str, bundle: Path, tmp_path: Path
) -> None:
    """A framework's script (a plain torchrun loop made preemption-safe, examples/frameworks/)
    behaves inside the container as outside: preempted, it loses and redoes no step and ends
    with the parameters of the same script run uninterrupted in the same bundle."""
    shape = ("resources.tasks_per_node=1",) if slurm_generation == "22.05" else ()
    common = (
        f"container.image={bundle}",
        "container.python=/opt/venv/bin/python",
        "entrypoint.args=[--epochs,6,--step-sleep,0.03]",
        *shape,
    )
    whole = submit(slurm_env, tmp_path / "whole" / "runs", *common, experiment=TORCHRUN_LOOP)
    assert wait_for_job(run_job_id(whole), slurm_env, timeout=300) == "COMPLETED"
    total = len(loop_steps(whole))
    run = submit(slurm_env, tmp_path / "stopped" / "runs", *common, experiment=TORCHRUN_LOOP)
    wait_until(f"step {total // 3}", lambda: len(loop_steps(run)) >= total // 3, timeout=240)
    preempt_with_high_job(slurm_env, tmp_path)
    assert wait_for_job(run_job_id(run), slurm_env, timeout=300) == "COMPLETED"
    assert [end["reason"] for end in ends(run)] == ["preemption", "completed"], ends(run)
    assert sorted(loop_steps(run)) == list(range(1, total + 1))
    digest = json.loads((run / "final.json").read_text())["digest"]
    assert digest == json.loads((whole / "final.json").read_text())["digest"]


def test_doctor_names_the_runtimes_and_submit_refuses_a_missing_one(
    slurm_env: dict[str, str], bundle: Path, tmp_path: Path
) -> None:
    doctor = subprocess.run(
        [sys.executable, "-m", "slurmddp", "doctor"],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = {line.split()[2]: line.split()[3] for line in doctor.stdout.splitlines() if "container:" in line}
    assert rows == {"pyxis": "absent", "apptainer": "absent", "oci": "offered"}, doctor.stdout
    image = tmp_path / "torch.sif"
    image.write_bytes(b"SIF")
    out = tmp_path / "runs"
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmddp",
            "submit",
            str(QUICKSTART),
            f"container.image={image}",
            f"output_dir={out}",
        ],
        env=slurm_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == EXIT_USER_ERROR, refused.stdout + refused.stderr
    assert "container.runtime: apptainer is not offered here" in refused.stderr, refused.stderr
    assert "this cluster offers oci" in refused.stderr and not list(out.glob("*/*")), refused.stderr
