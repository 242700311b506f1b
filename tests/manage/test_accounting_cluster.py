"""Accounting on the real cluster: a job preempted and requeued once; the CPU and GPU hours that
`status --json` shows are sacct's own sums over both allocations, and the time lost is the wait
between them plus at most a few seconds after the checkpointed stop."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SYNTHETIC, only_run, progress_step, slurmddp, wait_for_job, wait_until

pytestmark = pytest.mark.slurm

# From rank 0's end record (written once the stop's checkpoint is durable) to the allocation's end:
# scontrol requeue, then the job's processes are killed; sacct's End has a 1 s resolution.
STOP_TO_END_S = 10.0


def end_reasons(run: Path) -> list[str]:
    path = run / "attempts.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["reason"] for r in records if r["event"] == "end"]


def sacct_allocations(env: dict[str, str], job: str) -> list[dict[str, str]]:
    """sacct's own lines for every allocation of `job`, read here without slurmddp's parser."""
    fields = ["JobIDRaw", "State", "Start", "End", "ElapsedRaw", "CPUTimeRAW", "AllocTRES"]
    proc = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", "-j", job, "-o", ",".join(fields)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [dict(zip(fields, line.split("|"), strict=True)) for line in proc.stdout.splitlines() if line]


def gpus(alloc_tres: str) -> int:
    tres = dict(item.split("=", 1) for item in alloc_tres.split(",") if "=" in item)
    return int(tres.get("gres/gpu", "0"))


def test_status_hours_are_sacct_sums_over_every_allocation_of_a_requeued_job(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**slurm_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    out = tmp_path / "runs"
    submitted = subprocess.run(
        [sys.executable, "-m", "slurmddp", "submit", str(SYNTHETIC), "train.steps=600", f"output_dir={out}"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    (manifest,) = out.glob("*/*/manifest.json")
    run = manifest.parent
    job = str(json.loads(manifest.read_text())["job_id"])

    wait_until("step 100", lambda: progress_step(run) >= 100)
    interrupted = slurmddp(env, tmp_path, "interrupt", job, "--preempt", timeout=60)
    assert interrupted.returncode == 0, interrupted.stderr
    assert wait_for_job(job, env, timeout=300) == "COMPLETED"
    assert end_reasons(run) == ["preemption", "completed"]

    allocations = sacct_allocations(env, job)
    assert len(allocations) == 2, allocations
    first, second = sorted(allocations, key=lambda a: a["Start"])
    assert second["State"] == "COMPLETED"
    cpu_hours = sum(int(a["CPUTimeRAW"]) for a in allocations) / 3600
    gpu_hours = sum(int(a["ElapsedRaw"]) * gpus(a["AllocTRES"]) for a in allocations) / 3600
    wait_s = (
        dt.datetime.fromisoformat(second["Start"]) - dt.datetime.fromisoformat(first["End"])
    ).total_seconds()

    shown = json.loads(slurmddp(env, tmp_path, "status", str(run), "--json").stdout)
    (row,) = shown["elements"]
    lost_s = row["lost_hours"] * 3600
    print(
        f"\njob {job}: sacct {cpu_hours:.6f} CPU h, {gpu_hours:.6f} GPU h, wait {wait_s} s, first allocation "
        f"{first['ElapsedRaw']} s; status {row['cpu_hours']:.6f} CPU h, {row['gpu_hours']:.6f} GPU h, "
        f"lost {lost_s:.1f} s"
    )
    assert row["cpu_hours"] == pytest.approx(cpu_hours, abs=1e-9) and cpu_hours > 0
    assert row["gpu_hours"] == pytest.approx(gpu_hours, abs=1e-9)
    assert wait_s <= lost_s <= wait_s + STOP_TO_END_S
    assert {k: shown["total"][k] for k in ("cpu_hours", "gpu_hours", "lost_hours")} == {
        k: row[k] for k in ("cpu_hours", "gpu_hours", "lost_hours")
    }
    table = slurmddp(env, tmp_path, "status", str(run)).stdout
    assert f"{cpu_hours:.2f}" in table.splitlines()[2].split()


def test_gpu_hours_are_sacct_sums_of_the_gpus_each_allocation_held(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """The lab's fake GPUs (2 of each node's 4, on 2 nodes) under a torchrun-style script that
    does not touch them: the lab records gres/gpu in AllocTRES, as a GPU site does."""
    env = {**slurm_env, "XDG_STATE_HOME": str(tmp_path / "state")}
    out = tmp_path / "runs"
    proc = slurmddp(
        env,
        tmp_path,
        "submit",
        str(ROOT / "examples" / "torchrun_script.yaml"),
        f"output_dir={out}",
        "resources.gpus_per_node=2",
        "resources.tasks_per_node=null",
        "--wait",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = only_run(out)
    job = str(json.loads((run / "manifest.json").read_text())["job_id"])
    allocations = sacct_allocations(env, job)
    # One allocation unless an attempt was requeued (each holds the same 4 GPUs; all count).
    assert allocations and {gpus(a["AllocTRES"]) for a in allocations} == {4}, allocations
    gpu_hours = sum(int(a["ElapsedRaw"]) * gpus(a["AllocTRES"]) for a in allocations) / 3600
    (row,) = json.loads(slurmddp(env, tmp_path, "status", str(run), "--json").stdout)["elements"]
    print(f"\njob {job}: sacct {gpu_hours:.6f} GPU h; status {row['gpu_hours']:.6f} GPU h")
    assert gpu_hours > 0 and row["gpu_hours"] == pytest.approx(gpu_hours, abs=1e-9)
