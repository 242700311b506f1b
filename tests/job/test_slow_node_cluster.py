"""A slow node named while the run goes, on the real cluster: the quickstart (loader workers on) on
3 nodes x 1 rank; from step 100 the test slows node2's rank with a CPU quota of its own making (the
rank and its loader workers stopped 60 ms of every 100 ms, SIGSTOP/SIGCONT). Within 60 s rank 0's
log and `status` name node2, with the ratio and the share of each step it costs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    QUICKSTART,
    progress_step,
    rank_pids,
    run_job_id,
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


def test_a_node_slowed_mid_run_is_named_in_the_log_and_status_within_a_minute(
    slurm_env: dict[str, str], tmp_path: Path
) -> None:
    run = submit_run(
        slurm_env,
        tmp_path / "runs",
        "resources.nodes=3",
        "resources.tasks_per_node=1",
        "train.epochs=400",
        "train.global_batch=66",
        "telemetry.every_s=5",
        experiment=QUICKSTART,
    )
    wait_until("step 100", lambda: progress_step(run) >= 100, timeout=240)
    slowed = rank_pids(run, node=1)
    assert slowed, "no process of node2's rank found"
    done = threading.Event()
    thread = threading.Thread(target=throttle, args=(slowed, done), daemon=True)
    began = time.monotonic()
    thread.start()
    try:
        status = ""

        def named() -> bool:
            nonlocal status
            status = slurmddp(slurm_env, tmp_path, "status", str(run)).stdout
            return "node2 is slow" in status

        wait_until("node2 named in status", named, timeout=90)
        took = time.monotonic() - began
    finally:
        done.set()
        thread.join()
        for pid in slowed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    print(f"\nnamed {took:.1f} s after the slowdown began:\n{status}")
    assert took <= 60, status
    record = json.loads((run / "slow_node.json").read_text())
    assert record["host"] == "node2" and record["ratio"] >= 1.3 and 0 < record["slows_by"] < 1, record
    log = "".join(p.read_text() for p in (run / "logs").glob("*_0_log.out"))
    assert "slurmddp: node2 is slow: its ranks compute" in log
    job = run_job_id(run)
    assert slurmddp(slurm_env, tmp_path, "cancel", str(run), "--yes").returncode == 0
    wait_for_job(job, slurm_env, timeout=120)
