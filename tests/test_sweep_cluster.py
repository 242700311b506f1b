"""Sweeps as Slurm arrays on the real cluster, and managing them through `python -m slurmddp` only:
status, logs, list, results, cancel, resubmit, and a preemption that touches one element."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for_job

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "examples" / "sweep.yaml"

pytestmark = pytest.mark.slurm


def cli(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def user_env(slurm_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The lab's environment with this test's own index of submissions."""
    return {**slurm_env, "XDG_STATE_HOME": str(tmp_path / "state")}


def only_sweep(out: Path) -> Path:
    (manifest,) = out.glob("*/*/sweep.json")
    return manifest.parent


def manifest(sweep: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((sweep / "sweep.json").read_text())
    return data


def status(env: dict[str, str], cwd: Path, ref: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(ok(cli(env, cwd, "status", ref, "--json")))["elements"]
    return rows


def wait_until(what: str, check: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.3)


def begins(run: Path) -> int:
    path = run / "attempts.jsonl"
    if not path.is_file():
        return 0
    return sum(1 for line in path.read_text().splitlines() if json.loads(line)["event"] == "begin")


def running_tasks(env: dict[str, str], array_id: str) -> int:
    proc = subprocess.run(
        ["squeue", "-h", "-r", "-j", array_id, "-t", "RUNNING", "-o", "%i"],
        env=env,
        capture_output=True,
        text=True,
    )
    return len(proc.stdout.split())


def max_overlap(env: dict[str, str], array_id: str) -> int:
    """The most array tasks whose [Start, End] intervals (sacct, 1 s resolution) overlap."""
    proc = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--array", "-j", array_id, "-o", "JobID,Start,End"],
        env=env,
        capture_output=True,
        text=True,
    )
    events = []
    for line in proc.stdout.splitlines():
        _, start, end = line.split("|")
        # Half-open: an element that ends in the second the next one starts does not overlap it.
        events += [(start, 1), (end, -1)]
    running = most = 0
    for _, delta in sorted(events, key=lambda event: (event[0], event[1])):
        running += delta
        most = max(most, running)
    return most


def test_grid_of_six_runs_two_at_a_time_and_results_rank_them(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = user_env(slurm_env, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "quickstart_train.py").write_text((ROOT / "examples" / "quickstart_train.py").read_text())
    out = tmp_path / "runs"
    submitted = ok(
        cli(env, work, "submit", str(SWEEP), "train.steps=60", "train.log_every=20", f"output_dir={out}")
    )
    assert "6 elements" in submitted
    sweep = only_sweep(out)
    (submission,) = manifest(sweep)["submissions"]
    array_id = submission["job_id"]
    assert submission["elements"] == [0, 1, 2, 3, 4, 5]

    most = 0
    deadline = time.monotonic() + 300
    while True:
        most = max(most, running_tasks(env, array_id))
        queued = subprocess.run(["squeue", "-h", "-j", array_id], env=env, capture_output=True, text=True)
        if not queued.stdout.strip():
            break
        assert time.monotonic() < deadline, "the sweep did not finish in 300 s"
        time.sleep(0.3)
    assert 1 <= most <= 2, f"{most} elements ran at once with max_parallel 2"
    assert set(wait_for_job(array_id, env).split(",")) == {"COMPLETED"}
    assert max_overlap(env, array_id) <= 2, "sacct shows three elements running at the same time"

    # A new shell somewhere else, with only the sweep directory.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rows = status(env, elsewhere, str(sweep))
    assert [r["state"] for r in rows] == ["COMPLETED"] * 6
    assert all(r["step"] == 60 and r["attempts"] == 1 for r in rows), rows
    grid = [(lr, width) for lr in (0.01, 0.05, 0.2) for width in (128, 256)]
    assert [(r["overrides"]["train.lr"], r["overrides"]["train.width"]) for r in rows] == grid
    for row in rows:
        config = (Path(row["dir"]) / "config.yaml").read_text()
        assert (
            f"lr: {row['overrides']['train.lr']}" in config
            and f"width: {row['overrides']['train.width']}" in config
        )
        last = json.loads((Path(row["dir"]) / "metrics.jsonl").read_text().splitlines()[-1])
        assert row["metrics"]["loss"] == last["loss"] and last["step"] == 60
        result = json.loads((Path(row["dir"]) / "result.json").read_text())["result"]
        assert abs(result["final_loss"] - last["loss"]) < 1e-6

    table = ok(cli(env, elsewhere, "results", str(sweep), "--plot", str(tmp_path / "loss.png")))
    with (sweep / "results.csv").open() as handle:
        records = list(csv.DictReader(handle))
    assert len(records) == 6
    losses = [float(r["loss"]) for r in records]
    assert losses == sorted(losses), "results are not sorted best (lowest loss) first"
    by_index = {int(r["index"]): r for r in records}
    assert {(float(r["train.lr"]), int(r["train.width"])) for r in by_index.values()} == set(grid)
    assert str(records[0]["index"]) == table.splitlines()[1].split()[0]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # logs of one element and one rank; list from the index; provenance of the attempt.
    log = ok(cli(env, elsewhere, "logs", str(sweep), "--index", "3", "--rank", "0"))
    assert "step 0 loss" in log
    # torch prefixes its C++ warnings with the rank: this is rank 1's own stderr.
    assert "[rank1]" in ok(cli(env, elsewhere, "logs", str(sweep), "--index", "3", "--rank", "1", "--err"))
    listed = json.loads(ok(cli(env, elsewhere, "list", "--json")))
    assert listed[0]["dir"] == str(sweep) and listed[0]["kind"] == "sweep" and listed[0]["job_id"] == array_id
    assert status(env, elsewhere, array_id) == rows  # by job id, through the index
    (record,) = (Path(rows[2]["dir"]) / "provenance").glob("*.json")
    prov = json.loads(record.read_text())
    version = subprocess.run(["scontrol", "--version"], env=env, capture_output=True, text=True).stdout
    assert prov["slurm"] == version.strip() and prov["packages"]["torch"].startswith("2.")
    assert prov["nodes"] and prov["config"]["train"]["lr"] == rows[2]["overrides"]["train.lr"]
