"""Preflight, doctor and the MPI launcher on the real 3-node lab cluster, through `python -m slurmddp`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, mpi_library_error, only_run, slurmddp, wait_for_job

from slurmddp.rundir import records
from slurmddp.rundir.records import End

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("22.05")]
DIST_TIMEOUT_S = 300


def final_attempt(run: Path) -> End:
    ends = records.ends(records.read_attempts(run))
    assert ends, f"no attempt ended in {run}"
    return ends[-1]


def test_forced_preflight_failure_stops_the_job_fast_naming_the_node(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    started = time.monotonic()
    proc = slurmddp(
        slurm_env,
        tmp_path,
        "submit",
        str(QUICKSTART),
        "preflight.fail_on_host=node2",
        # Pinned so node2 is one of the job's nodes (another job may hold a node).
        'resources.sbatch.nodelist="node[1-2]"',
        "train.steps=5",
        f"dist.timeout_s={DIST_TIMEOUT_S}",
        f"output_dir={out}",
        "--wait",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "preflight failed: node2: failed on purpose" in proc.stdout
    assert "ended FAILED" in proc.stdout
    run = only_run(out)
    end = final_attempt(run)
    (begin,) = records.begins(records.read_attempts(run))
    ran = end.time - begin.time
    # Most of it is four `import torch` on two cores; nothing waits for the distributed timeout.
    assert ran < DIST_TIMEOUT_S / 5, f"the attempt took {ran:.0f} s"
    print(f"forced preflight failure: attempt {ran:.1f} s, submit to end {time.monotonic() - started:.1f} s")
    assert end.requeue is False and end.final is True
    assert end.message.startswith("preflight failed: node2")
    record = json.loads((run / "preflight.json").read_text())
    assert record["suspects"] == ["node2"] and {r["host"] for r in record["ranks"]} == {"node1", "node2"}
    assert not (run / "result.json").exists()


def test_an_unreachable_bandwidth_floor_fails_with_the_measured_link(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    proc = slurmddp(
        slurm_env,
        tmp_path,
        "submit",
        str(QUICKSTART),
        "resources.tasks_per_node=1",
        "preflight.min_bus_gbps=100000",
        f"output_dir={out}",
        "--wait",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # Two nodes: the one link between them is slow, and its two ends cannot be told apart.
    assert "preflight failed: node1, node2: all-reduce bus bandwidth" in proc.stdout
    record = json.loads((only_run(out) / "preflight.json").read_text())
    assert {(link["src"], link["dst"]) for link in record["links"]} == {
        ("node1", "node2"),
        ("node2", "node1"),
    }
    assert all(link["gbps"] > 0 for link in record["links"]) and record["bus_gbps"] > 0


def test_doctor_reports_the_lab_settings(slurm_env: dict[str, str], tmp_path: Path) -> None:
    proc = slurmddp(slurm_env, tmp_path, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = subprocess.run(
        ["scontrol", "show", "config"], env=slurm_env, capture_output=True, text=True, check=True
    ).stdout
    real = {
        key.strip(): value.strip()
        for key, sep, value in (line.partition("=") for line in shown.splitlines())
        if sep
    }
    lines = proc.stdout.splitlines()
    assert lines[0] == f"slurmddp doctor: Slurm {real['SLURM_VERSION']}, cluster {real['ClusterName']}"
    expected = {
        # Slurm 23.02 moved it to PreemptParameters (the 24.11 lab sets that one); doctor shows both.
        "preempt_send_user_signal": f"SlurmctldParameters={real['SlurmctldParameters']}"
        + (f" PreemptParameters={real['PreemptParameters']}" if "PreemptParameters" in real else ""),
        "PreemptMode/PreemptType": f"PreemptType={real['PreemptType']} PreemptMode={real['PreemptMode']}",
        "JobRequeue": real["JobRequeue"],
        "MaxArraySize": real["MaxArraySize"],
        "AccountingStorageType": real["AccountingStorageType"],
    }
    for name, value in expected.items():
        (line,) = [line for line in lines if line.split()[1:2] == [name]]
        assert line.split(None, 2) == ["OK", name, value], line
    for tool in ("sbatch", "squeue", "sacct", "scontrol", "scancel"):
        assert any(line.split()[:2] == ["OK", tool] for line in lines), tool


def test_doctor_probe_sees_the_stop_signal_on_every_rank(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "runs"
    started = time.monotonic()
    proc = slurmddp(
        slurm_env, tmp_path, "doctor", "--probe", "resources.tasks_per_node=2", f"output_dir={out}"
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok = [line for line in proc.stdout.splitlines() if line.startswith("  OK    rank ")]
    assert len(ok) == 4 and all("got SIGUSR2" in line for line in ok), proc.stdout
    assert {line.split()[4].rstrip(":") for line in ok} == {"node1", "node2"}
    assert "the stop signal reached every rank" in proc.stdout
    job_id = proc.stdout.split("probe job ")[1].split(",")[0]
    # Ended by itself and will not come back: no run directory left for a requeued copy to start in.
    # In CI, with four labs on two cores, it once stayed COMPLETING over 30 s: the default wait.
    assert wait_for_job(job_id, slurm_env) in ("COMPLETED", "CANCELLED")
    assert not list(out.glob("doctor-probe/*"))
    # The probe job's time limit is 5 min: it ended by itself, not there (63 s once in CI, four
    # labs on two cores).
    assert elapsed < 200, f"the probe took {elapsed:.0f} s"


def test_mpi_launcher_on_slurm_runs_ddp_across_two_nodes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    listed = subprocess.run(["srun", "--mpi=list"], env=slurm_env, capture_output=True, text=True)
    plugins = listed.stdout + listed.stderr  # Slurm 22.05 prints the list on stderr
    if "pmi2" not in plugins.split():
        pytest.skip(f"this Slurm build has no mpi/pmi2 plugin (srun --mpi=list: {plugins.split()})")
    problem = mpi_library_error()
    if problem is not None:
        pytest.skip(f"mpi4py cannot load an MPI library: {problem}")
    out = tmp_path / "runs"
    proc = slurmddp(
        slurm_env,
        tmp_path,
        "submit",
        str(QUICKSTART),
        "dist.launcher=mpi",
        "train.steps=10",
        f"output_dir={out}",
        "--wait",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks from MPI (MPICH" in proc.stdout and ": 4 on 2 node(s)" in proc.stdout
    run = only_run(out)
    submitted = next((run / "logs").glob("*_submission.sh")).read_text()
    assert "--mpi=pmi2" in submitted
    result = json.loads((run / "result.json").read_text())
    assert (result["world_size"], result["num_nodes"]) == (4, 2)
    assert len({r["param_sha256"] for r in result["ranks"]}) == 1
    assert len(records.begins(records.read_attempts(run))) == 1
