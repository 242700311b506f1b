"""Sweeps as Slurm arrays on the real cluster, and managing them through `python -m slurmddp` only:
status, logs, list, results, cancel, resubmit, and a preemption that touches one element."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, wait_for_job, wait_until
from conftest import slurmddp as cli

SWEEP = ROOT / "examples" / "sweep.yaml"

pytestmark = pytest.mark.slurm


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def user_env(slurm_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The lab's environment with this test's own index of submissions."""
    return {**slurm_env, "XDG_STATE_HOME": str(tmp_path / "state")}


def workdir(tmp_path: Path) -> Path:
    """A submit directory holding the synthetic example's training code."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "synthetic_train.py").write_text((ROOT / "examples" / "synthetic_train.py").read_text())
    return work


def only_sweep(out: Path) -> Path:
    (manifest,) = out.glob("*/*/sweep.json")
    return manifest.parent


def manifest(sweep: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((sweep / "sweep.json").read_text())
    return data


def status(env: dict[str, str], cwd: Path, ref: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(ok(cli(env, cwd, "status", ref, "--json")))["elements"]
    return rows


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
        ["sacct", "-X", "-n", "-P", "-j", array_id, "-o", "JobID,Start,End"],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 6, f"sacct lists {len(lines)} tasks of {array_id}: {proc.stdout}{proc.stderr}"
    events = []
    for line in lines:
        _, start, end = line.split("|")
        # Half-open: an element that ends in the second the next one starts does not overlap it.
        events += [(start, 1), (end, -1)]
    running = most = 0
    for _, delta in sorted(events, key=lambda event: (event[0], event[1])):
        running += delta
        most = max(most, running)
    return most


# The throttle (%2) is Slurm's in both generations and the ranking is slurmddp's own: one run, on
# 24.11; 22.05's arrays run two at a time in test_search_cluster.py and are cancelled element by
# element below.
@pytest.mark.lab_generation("24.11")
def test_grid_of_six_runs_two_at_a_time_and_results_rank_them(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = user_env(slurm_env, tmp_path)
    work = workdir(tmp_path)
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
    # Each rank's stderr opens by naming the rank: this is rank 1's own.
    err = ok(cli(env, elsewhere, "logs", str(sweep), "--index", "3", "--rank", "1", "--err"))
    assert err.startswith("slurmddp: rank 1 of 2 "), err
    listed = json.loads(ok(cli(env, elsewhere, "list", "--json")))
    assert listed[0]["dir"] == str(sweep) and listed[0]["kind"] == "sweep" and listed[0]["job_id"] == array_id
    assert status(env, elsewhere, array_id) == rows  # by job id, through the index
    (record,) = (Path(rows[2]["dir"]) / "provenance").glob("*.json")
    prov = json.loads(record.read_text())
    version = subprocess.run(["scontrol", "--version"], env=env, capture_output=True, text=True).stdout
    assert prov["slurm"] == version.strip() and prov["packages"]["torch"].startswith("2.")
    assert prov["nodes"] and prov["config"]["train"]["lr"] == rows[2]["overrides"]["train.lr"]


def final_hash(run: Path) -> str:
    result = json.loads((run / "result.json").read_text())
    hashes = {r["param_sha256"] for r in result["ranks"]}
    assert len(hashes) == 1, "ranks disagree"
    return hashes.pop()


# One element of an array preempted and requeued alone: 24.11 here, 22.05 in
# test_search_cluster.py (its trials are an array's elements, one preempted by a `high` job).
@pytest.mark.lab_generation("24.11")
def test_a_preempted_element_alone_is_requeued_and_resumes_exactly(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = user_env(slurm_env, tmp_path)
    work = workdir(tmp_path)
    # Three elements that train identically (train.tag is read by nobody), each filling a node.
    # 1500 steps, ~25 s on the lab: 300 (~5 s) could end before the scheduler's next pass
    # preempted anything, and the element then completed unstopped.
    (work / "same.yaml").write_text(
        "entrypoint: synthetic_train.py:train\n"
        "resources: {nodes: 1, tasks_per_node: 2, cpus_per_task: 2, time: '00:10:00'}\n"
        "train: {steps: 1500, global_batch: 64, width: 128, classes: 10, lr: 0.05, momentum: 0.9,\n"
        "        seed: 0, dtype: float32, log_every: 500}\n"
        "sweep:\n  list: [{train.tag: a}, {train.tag: b}, {train.tag: c}]\n  max_parallel: 3\n"
    )
    out = tmp_path / "runs"
    waiting = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", "same.yaml", f"output_dir={out}", "--wait"],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until("the sweep submitted", lambda: any(out.glob("*/*/sweep.json")))
    wait_until("the array job id recorded", lambda: manifest(only_sweep(out))["submissions"][0]["job_id"])
    sweep = only_sweep(out)
    array_id = manifest(sweep)["submissions"][0]["job_id"]
    dirs = [sweep / e["dir"] for e in manifest(sweep)["elements"]]

    def step_of(run: Path) -> int:
        try:
            return int(json.loads((run / "progress.json").read_text())["step"])
        except (OSError, ValueError, KeyError):
            return -1

    wait_until("all three elements training", lambda: all(step_of(d) >= 20 for d in dirs))
    node = subprocess.run(
        ["squeue", "-h", "-j", f"{array_id}_1", "-o", "%N"], env=env, capture_output=True, text=True
    ).stdout.strip()
    assert node, "element 1 is not running"
    # A high-priority job that needs every core of element 1's node, and only that node.
    subprocess.run(
        [
            "sbatch",
            "-p",
            "high",
            "-w",
            node,
            "-c",
            "4",
            "-t",
            "1",
            "-o",
            str(tmp_path / "high.out"),
            "--wrap",
            "sleep 3",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    # `submit --wait` follows the sweep to its end and exits 0 only if every element completed.
    said, _ = waiting.communicate(timeout=400)
    assert waiting.returncode == 0, said
    assert "3 completed" in said
    # While it waits it says each change of an element's state, each completion among them.
    finished = [
        line
        for line in said.splitlines()
        if line.startswith("slurmddp: element ") and " COMPLETED at step " in line
    ]
    assert len(finished) == 3 and finished[-1].endswith("; 3 of 3 ended"), said
    assert set(wait_for_job(array_id, env).split(",")) == {"COMPLETED"}

    rows = status(env, tmp_path, str(sweep))
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3
    assert [r["attempts"] for r in rows] == [1, 2, 1], rows
    reasons = [
        json.loads(line)["reason"]
        for line in (dirs[1] / "attempts.jsonl").read_text().splitlines()
        if "reason" in line
    ]
    assert reasons == ["preemption", "completed"]
    # The preempted element ends with the same parameters, bit for bit, as its untouched twins.
    assert final_hash(dirs[1]) == final_hash(dirs[0]) == final_hash(dirs[2])
    # Slurm's SIGCONT with the preemption's SIGTERM once made submitit warn on every rank.
    logs = "".join(path.read_text() for path in sweep.rglob("*_log.err"))
    assert logs and "Bypassing signal" not in logs, logs[-2000:]


def test_cancel_one_element_and_resubmit_exactly_the_failed_one(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    env = user_env(slurm_env, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    fail_flag = tmp_path / "fail-while-this-exists"
    fail_flag.write_text("")
    (work / "steps.py").write_text(
        "import time\nfrom pathlib import Path\n\n\n"
        "def main(ctx):\n"
        "    for step in ctx.loop(ctx.train.steps):\n"
        "        time.sleep(ctx.train.sleep)\n"
        "        if ctx.train.fail_if and Path(ctx.train.fail_if).exists() and step == 3:\n"
        "            raise RuntimeError('told to fail')\n"
        "        ctx.log(step, value=step)\n"
        "    return {'done': True}\n"
    )
    (work / "three.yaml").write_text(
        "entrypoint: steps.py:main\nresources: {tasks_per_node: 1}\n"
        "requeue: {max_failures: 0, in_job_restarts: 0}\n"
        "train: {steps: 10, sleep: 0.05, fail_if: null}\n"
        f"sweep:\n  list: [{{steps: 1000, sleep: 1.0}}, {{sleep: 0.01}}, {{fail_if: '{fail_flag}'}}]\n"
    )
    out = tmp_path / "runs"
    ok(cli(env, work, "submit", "three.yaml", f"output_dir={out}"))
    sweep = only_sweep(out)
    array_id = manifest(sweep)["submissions"][0]["job_id"]
    dirs = [sweep / e["dir"] for e in manifest(sweep)["elements"]]
    wait_until("element 0 running", lambda: (dirs[0] / "metrics.jsonl").is_file())
    following = subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "logs", str(sweep), "--index", "0", "--err", "-f"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )

    cancelled = ok(cli(env, tmp_path, "cancel", str(sweep), "--index", "0"))
    assert f"element 0 job {array_id}_0" in cancelled
    wait_for_job(array_id, env)
    # `logs -f` printed the log as it grew (slurmstepd's cancel notice came after it started) and
    # returned once the element was cancelled.
    followed, _ = following.communicate(timeout=30)
    assert following.returncode == 0 and "CANCELLED AT" in followed
    time.sleep(3)  # room for a wrongly requeued element 0 to show up
    assert [r["state"] for r in status(env, tmp_path, str(sweep))] == ["CANCELLED", "COMPLETED", "FAILED"]
    assert not subprocess.run(
        ["squeue", "-h", "-j", array_id], env=env, capture_output=True, text=True
    ).stdout

    fail_flag.unlink()
    # A node element 2 left out (as after a node failure) stays out of the new array.
    left_out = {"node3": {"reason": "went down under attempt 0 (test)", "attempt": 0, "time": time.time()}}
    (dirs[2] / "excluded.json").write_text(json.dumps({"hosts": left_out}))
    said = ok(cli(env, tmp_path, "resubmit", str(sweep), "--failed"))
    second = manifest(sweep)["submissions"][1]
    assert second["elements"] == [2] and f"resubmitted elements 2 as job {second['job_id']}" in said
    assert "leaves out node3: went down under attempt 0 (test)" in said
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", second["job_id"]], env=env, capture_output=True, text=True
    ).stdout
    assert "ExcNodeList=node3 " in shown, shown
    assert wait_for_job(second["job_id"], env) == "COMPLETED"
    rows = status(env, tmp_path, str(sweep))
    assert [r["state"] for r in rows] == ["CANCELLED", "COMPLETED", "COMPLETED"]
    assert [begins(d) for d in dirs] == [1, 1, 2]
    assert rows[2]["job_id"] == second["job_id"] and rows[0]["job_id"] == f"{array_id}_0"
    # Nothing left to resubmit.
    again = cli(env, tmp_path, "resubmit", str(sweep), "--failed")
    assert again.returncode == 2 and "no failed elements" in again.stderr


# The cluster's own limit, and one mistake of the file's: the other mistakes of a sweep take the
# same path (refused while the experiment is read, before anything meets Slurm), and each one's
# message is a unit test (tests/experiment/test_sweep_spec.py, tests/submit/test_sweep_plan.py).
@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("{random: {trials: 1002, params: {lr: {log_uniform: [0.0001, 0.1]}}}}", "MaxArraySize is 1001"),
        ("{grid: {lr: []}}", "sweep.grid.train.lr: needs a non-empty list"),
    ],
)
def test_bad_sweeps_are_refused_and_nothing_is_submitted(
    slurm_env: dict[str, str], tmp_path: Path, sweep: str, message: str
) -> None:
    env = user_env(slurm_env, tmp_path)
    work = workdir(tmp_path)
    out = tmp_path / "runs"
    proc = cli(env, work, "submit", str(SWEEP), f"sweep={sweep}", f"output_dir={out}")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not out.exists() or not any(out.rglob("*.json"))
    # No job submitted from this test's directory (by work directory, not by the queue's length: in
    # CI another job of this lab appeared in the queue while the command ran).
    squeue = ["squeue", "-h", "-o", "%i %Z"]
    queued = subprocess.run(squeue, env=env, capture_output=True, text=True, check=True)
    assert not [line for line in queued.stdout.splitlines() if line.split()[-1] == str(work)], queued.stdout
