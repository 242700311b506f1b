"""The hang watchdog: who did not arrive, in words; a real stall found and recorded."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from conftest import slurmddp
from dist_envs import dist_env
from train_sources import linear_ddp_train

from slurmddp.job import distenv, watchdog

HOSTS = ["node1", "node1", "node2", "node2"]


def report(rank: int, step: int, waiting: bool, where: str = "train.py:9 in train") -> dict[str, Any]:
    return {"rank": rank, "host": HOSTS[rank], "step": step, "waiting": waiting, "where": where}


def test_the_rank_not_waiting_on_its_peers_is_named() -> None:
    reports = [
        report(0, 7, True),
        report(1, 7, True),
        report(2, 7, False, "data.py:3 in get"),
        report(3, 7, True),
    ]
    cause, hosts = watchdog.diagnose(reports, 4, HOSTS)
    assert cause == "hung at step 7: rank 2 on node2 (in data.py:3 in get) did not arrive"
    assert hosts == ["node2"]


def test_a_rank_that_never_reported_is_named_with_its_host() -> None:
    reports = [report(0, 7, True), report(1, 7, True), report(3, 7, True)]
    cause, hosts = watchdog.diagnose(reports, 4, HOSTS)
    assert cause == "hung at step 7: rank 2 on node2 did not report (its process is stuck or gone)"
    assert hosts == ["node2"]


def test_ranks_behind_the_others_are_named_when_all_wait() -> None:
    reports = [report(0, 8, True), report(1, 7, True), report(2, 8, True), report(3, 8, True)]
    assert "rank 1 on node1" in watchdog.diagnose(reports, 4, HOSTS)[0]
    same = [report(rank, 8, True) for rank in range(4)]
    assert watchdog.diagnose(same, 4, HOSTS)[0].endswith(
        "every rank waits in a collective (ranks calling different collectives?)"
    )
    assert watchdog.diagnose(same, 4, HOSTS)[1] == []


def test_hosts_follow_slurms_block_placement() -> None:
    dist = dist_env(world_size=6, local_world_size=2, num_nodes=3, master_addr="gpu01", job_id="9")
    env = {"SLURM_JOB_NODELIST": "gpu[01-03]"}
    assert distenv.rank_hosts(dist, env) == ["gpu01", "gpu01", "gpu02", "gpu02", "gpu03", "gpu03"]


def test_a_stalled_step_fires_once_with_stacks_and_a_failure_record(tmp_path: Path) -> None:
    dist = dist_env(job_id="5", restart_count=2)
    exits: list[int] = []
    fired = threading.Event()

    def exit_(status: int) -> None:
        exits.append(status)
        fired.set()

    dog = watchdog.Watchdog(tmp_path, dist, 1, exit=exit_)
    try:
        for step in range(3):
            dog.at(step)
            time.sleep(0.01)
        assert not fired.is_set()
        fired.wait(10)  # this thread stalls at step 2 here
    finally:
        dog.stop()
    assert exits == [watchdog.HANG_EXIT_STATUS]
    folder = tmp_path / "hangs" / "5.2"
    stacks = (folder / "rank_0.stacks.txt").read_text()
    assert "test_watchdog.py" in stacks and "in _watch" in stacks  # this thread's and the watchdog's
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["step"] == 2 and failure["restart_count"] == 2
    host = socket.gethostname()
    assert failure["cause"].startswith(f"hung at step 2: rank 0 on {host} (in ")
    assert "test_watchdog.py" in failure["cause"] and "in test_a_stalled_step_fires" in failure["cause"]


def test_the_loop_rests_the_watchdog_after_its_last_step(tmp_path: Path) -> None:
    """After the loop (final evaluation, saving), no step comes: that is not a hang."""
    dist = dist_env(job_id="")
    exits: list[int] = []
    dog = watchdog.Watchdog(tmp_path, dist, 1, exit=exits.append)
    try:
        dog.at(0)
        dog.rest()
        time.sleep(2.5)
    finally:
        dog.stop()
    assert exits == [] and not (tmp_path / "hangs").exists()


def test_automatic_timeout_grows_with_the_slowest_step(tmp_path: Path) -> None:
    dist = dist_env(job_id="")
    dog = watchdog.Watchdog(tmp_path, dist, None, exit=lambda status: None)
    try:
        assert dog.limit_s() == watchdog.AUTO_FLOOR_S
        dog.at(0)
        dog._last -= 30.0  # a 30 s step
        dog.at(1)
        assert dog.limit_s() >= 30.0 * watchdog.AUTO_FACTOR
    finally:
        dog.stop()


BLOCKING_TRAIN = linear_ddp_train(
    steps=10,
    at_step=3,
    rank=1,
    then="threading.Event().wait()  # blocks forever inside the step",
    imports="import threading",
    returns='{"done": True}',
)


def test_three_local_ranks_one_blocked_name_it_and_end(tmp_path: Path) -> None:
    """No Slurm: rank 1 blocks in step 3; within the timeout + 30 s every rank has written its
    stacks, the summary names rank 1 and its blocking frame, and the job has ended."""
    (tmp_path / "blocking.py").write_text(BLOCKING_TRAIN)
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "entrypoint: blocking.py:train\n"
        "resources: {nodes: 1, tasks_per_node: 3, time: '00:10:00'}\n"
        "dist: {hang_timeout_s: 10}\n"
    )
    started = time.monotonic()
    proc = slurmddp(
        dict(os.environ), tmp_path, "submit", str(exp), "executor=local", f"output_dir={tmp_path / 'runs'}"
    )
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout + proc.stderr
    (folder,) = tmp_path.glob("runs/*/*/hangs/*")
    assert sorted(p.name for p in folder.glob("rank_*.json")) == [f"rank_{r}.json" for r in range(3)]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["cause"].startswith("hung at step 3: rank 1 on "), summary
    assert "blocking.py:13 in train" in summary["cause"]
    assert 'blocking.py", line 13 in train' in (folder / "rank_1.stacks.txt").read_text()
    # the others wait for rank 1 in a collective
    assert all(json.loads((folder / f"rank_{r}.json").read_text())["waiting"] for r in (0, 2))
    assert took < 10 + 30 + 60, f"{took:.0f} s (start-up included)"
