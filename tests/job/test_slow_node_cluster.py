"""A slow node named while the run goes, on the real cluster: the quickstart (loader workers on) on
3 nodes x 1 rank; from step 100 the test slows node2's rank with a CPU quota of its own making (the
rank and its loader workers stopped 60 ms of every 100 ms, SIGSTOP/SIGCONT). Rank 0's log and
`status` name node2, with the ratio and the share of each step it costs; the time that took is
printed, not asserted (a rehearsal of the suite at load 20 on two cores found it at step 661,
~110 s in). With resources.replace_slow_nodes, 2 nodes and a spare, the ranks move to the spare at
the next checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    QUICKSTART,
    progress_step,
    rank_pids,
    run_job_id,
    slurm_command,
    slurmddp,
    submit_run,
    wait_for_job,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.lab_generation("22.05")]


def throttle(pids: list[int], done: threading.Event, stopped_s: float = 0.06, period_s: float = 0.1) -> None:
    """Let `pids` run only (period - stopped) of every period, as a CPU quota would."""
    while not done.is_set():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        time.sleep(stopped_s)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        time.sleep(period_s - stopped_s)


@contextlib.contextmanager
def throttled(pids: list[int]) -> Iterator[None]:
    """`throttle` on `pids` while the body runs; all of them running again after it."""
    done = threading.Event()
    thread = threading.Thread(target=throttle, args=(pids, done), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def at_step_100(env: dict[str, str], tmp_path: Path, *overrides: str) -> tuple[Path, list[int]]:
    """The quickstart submitted with 1 rank per node, a telemetry record every 5 s and `overrides`,
    at step 100: its run directory and the processes of node2's rank (the rank, its loader workers).
    A run a failed check leaves is cancelled by `slurm_env` after the test."""
    run = submit_run(
        env,
        tmp_path / "runs",
        "resources.tasks_per_node=1",
        "telemetry.every_s=5",
        *overrides,
        experiment=QUICKSTART,
    )
    wait_until("step 100", lambda: progress_step(run) >= 100, timeout=240)
    slowed = rank_pids(run, node=1)
    assert slowed, "no process of node2's rank found"
    return run, slowed


def test_a_node_slowed_mid_run_is_named_in_the_log_and_status(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    settings = ("resources.nodes=3", "train.epochs=400", "train.global_batch=66")
    run, slowed = at_step_100(slurm_env, tmp_path, *settings)

    def named() -> bool:
        # The record `status` reads, not `status` itself (~1 s of CPU a look).
        try:
            return bool(json.loads((run / "slow_node.json").read_text()).get("host") == "node2")
        except (OSError, ValueError):
            return False

    began = time.monotonic()
    with throttled(slowed):
        wait_until("node2 named", named, timeout=240)
        took = time.monotonic() - began
        status = slurmddp(slurm_env, tmp_path, "status", str(run)).stdout
    print(f"\nnamed {took:.1f} s after the slowdown began:\n{status}")
    assert "node2 is slow" in status, status
    record = json.loads((run / "slow_node.json").read_text())
    assert record["host"] == "node2" and record["ratio"] >= 1.3 and 0 < record["slows_by"] < 1, record
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    assert "slurmddp: node2 is slow: its ranks compute" in log
    job = run_job_id(run)
    assert slurmddp(slurm_env, tmp_path, "cancel", str(run), "--yes").returncode == 0
    wait_for_job(job, slurm_env, timeout=120)


def test_with_replace_slow_nodes_a_slow_node_is_swapped_for_the_spare_at_the_next_checkpoint(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """2 nodes and a spare: node2 slowed from step 100 is named, and at the next checkpoint the
    attempt ends and the ranks start again on node3 from that checkpoint, in the allocation."""
    settings = (
        "resources.nodes=2",
        "resources.spare_nodes=1",
        "resources.replace_slow_nodes=true",
        "train.epochs=150",
        "checkpoint.every_steps=50",
    )
    run, slowed = at_step_100(slurm_env, tmp_path, *settings)
    with throttled(slowed):
        wait_until("the slowed attempt's end", lambda: bool(ends(run)), timeout=240)
    job = run_job_id(run)
    assert wait_for_job(job, slurm_env, timeout=300) == "COMPLETED"
    assert len(ends(run)) == 2, ends(run)
    first, last = ends(run)
    assert first["reason"] == "failure" and first["in_job"] is True, first
    assert "node2: slow: " in first["message"] and "on node3 instead" in first["message"], first
    assert first["step"] % 50 == 0, first
    assert last["reason"] == "completed", last
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    assert "slurmddp: node2 will be replaced by node3 at the next checkpoint" in log
    # Every rank of the first attempt said why it ended, in a line, not a traceback.
    first_attempt = sorted((run / "logs").glob(f"{job}_*_log.out"))
    assert len(first_attempt) == 2, first_attempt
    for rank_log in first_attempt:
        text = rank_log.read_text()
        assert f"slurmddp: the ranks end after the checkpoint at step {first['step']}" in text, rank_log
    errors = "".join(p.read_text() for p in (run / "logs").glob("*_log.err"))
    assert "Traceback" not in errors and "SlowNodeReplaced" not in errors, errors[-2000:]
    # Resumed at the checkpoint it ended after: no step redone.
    resumed = [line for line in log.splitlines() if line.startswith("slurmddp: resumed from ")]
    assert len(resumed) == 1 and resumed[0].endswith(f" at step {first['step']}"), resumed
    steps = slurm_command(["sacct", "-n", "-P", "-j", job, "-o", "JobName,NodeList"], slurm_env).stdout
    rows = (line.split("|") for line in steps.splitlines())
    # The ranks' steps are named after the interpreter (python, python3).
    trained_on = [nodes for name, nodes in rows if name.startswith("python")]
    assert trained_on == ["node[1-2]", "node[1,3]"], steps


def ends(run: Path) -> list[dict[str, object]]:
    path = run / "attempts.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [record for record in records if record["event"] == "end"]
