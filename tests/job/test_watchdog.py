"""The hang watchdog: who did not arrive, in words; a real stall found and recorded. The start-up
deadline: who holds the start up and in which phase."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import slurmddp
from dist_envs import dist_env
from train_sources import linear_ddp_train

from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Dist
from slurmddp.job.process import distenv, rendezvous, startwatch, watchdog
from slurmddp.job.process.distenv import DistEnv

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
    # Suspected, not confirmed: left out onto a spare for the allocation's restarts, never for good.
    assert failure["suspect_hosts"] == {host: failure["cause"]} and "bad_hosts" not in failure


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


def start_report(rank: int, phase: str, waiting: bool, **extra: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "host": HOSTS[rank],
        "phase": phase,
        "waiting": waiting,
        "where": "t.py:3 in f",
        **extra,
    }


def test_a_start_up_hang_names_the_ranks_rank_0_never_saw_at_the_rendezvous() -> None:
    reports = [
        start_report(0, startwatch.RENDEZVOUS, False, arrived=[0, 1, 3]),
        start_report(1, startwatch.PROCESS_GROUP, False),
        start_report(3, startwatch.PROCESS_GROUP, True),
    ]
    cause, phase, hosts = startwatch.diagnose(reports, 4, HOSTS, 900)
    assert cause == (
        "start-up hang: rank 2 on node2 never reached the rendezvous (no report: its process is stuck, "
        "gone or never started); no first step 900 s after the start (dist.start_timeout_s)"
    )
    assert (phase, hosts) == ("rendezvous", ["node2"])


def test_a_start_up_hang_names_the_rank_busy_in_its_own_setup() -> None:
    reports = [
        start_report(0, startwatch.SETUP, True, arrived=[0, 1, 2, 3]),
        start_report(1, startwatch.FIRST_STEP, True),
        start_report(2, startwatch.SETUP, False),
        start_report(3, startwatch.SETUP, True),
    ]
    cause, phase, hosts = startwatch.diagnose(reports, 4, HOSTS, 60)
    assert cause.startswith(
        "start-up hang: rank 2 on node2 hung in its setup before the first step (in t.py:3 in f); "
    )
    assert (phase, hosts) == ("setup", ["node2"])
    # Everyone at the rendezvous, rank 0's view unknown: the rank that never reported is the one.
    waiting = [start_report(rank, startwatch.RENDEZVOUS, False) for rank in (1, 2, 3)]
    cause, phase, hosts = startwatch.diagnose(waiting, 4, HOSTS, 60)
    assert cause.startswith("start-up hang: rank 0 on node1 did not report (no report: its process")
    assert hosts == ["node1"]


def test_a_script_in_torchs_own_rendezvous_or_process_group_is_in_that_phase() -> None:
    def frame_in(path: str, function: str) -> Any:
        code = compile(f"def {function}():\n    return sys._getframe()\n", path, "exec")
        scope: dict[str, Any] = {"sys": sys}
        exec(code, scope)
        return scope[function]()

    torch_dir = os.path.join("site-packages", "torch", "distributed")
    store = frame_in(os.path.join(torch_dir, "rendezvous.py"), "_create_c10d_store")
    init = frame_in(os.path.join(torch_dir, "distributed_c10d.py"), "init_process_group")
    assert startwatch.phase_of(store, startwatch.SETUP) == startwatch.RENDEZVOUS
    assert startwatch.phase_of(init, startwatch.SETUP) == startwatch.PROCESS_GROUP
    assert startwatch.phase_of(sys._getframe(), startwatch.SETUP) == startwatch.SETUP


def fired_dog(
    tmp_path: Path, dist: DistEnv, *, timeout_s: int | None = None
) -> tuple[watchdog.Watchdog, list[int], threading.Event]:
    exits: list[int] = []
    fired = threading.Event()

    def exit_(status: int) -> None:
        exits.append(status)
        fired.set()

    return watchdog.Watchdog(tmp_path, dist, timeout_s, 1, exit=exit_), exits, fired


def test_a_start_that_passes_its_deadline_in_the_setup_is_recorded_with_its_phase(tmp_path: Path) -> None:
    dog, exits, fired = fired_dog(tmp_path, dist_env(job_id="5"))
    try:
        dog.phase(startwatch.RENDEZVOUS)
        dog.phase(startwatch.SETUP)
        fired.wait(10)  # this thread hangs in its setup here
    finally:
        dog.stop()
    assert exits == [watchdog.HANG_EXIT_STATUS]
    folder = tmp_path / "hangs" / "5.0"
    assert json.loads((folder / "rank_0.json").read_text())["phase"] == "setup"
    assert json.loads((folder / "summary.json").read_text())["phase"] == "setup"
    assert "in _watch" in (folder / "rank_0.stacks.txt").read_text()
    failure = json.loads((tmp_path / "failure.json").read_text())
    host = socket.gethostname()
    assert failure["cause"].startswith(
        f"start-up hang: rank 0 on {host} hung in its setup before the first step (in "
    )
    assert "test_watchdog.py" in failure["cause"] and "no first step 1 s after the start" in failure["cause"]
    assert failure["step"] is None and failure["hang_dir"] == str(folder)


def test_no_start_up_hang_once_every_rank_made_its_first_step_or_outside_the_loop_progress_came(
    tmp_path: Path,
) -> None:
    looped, looped_exits, _ = fired_dog(tmp_path / "loop", dist_env(), timeout_s=0)
    beaten, beaten_exits, _ = fired_dog(tmp_path / "beat", dist_env(), timeout_s=0)
    try:
        for step in range(startwatch.FIRST_STEPS):
            looped.at(step)
        beaten.phase(startwatch.SETUP)
        beaten.beat()  # a ctx.log, an evaluation batch: a function without ctx.loop has started
        time.sleep(2.5)
        # No hang timeout either: the thread has nothing left to watch.
        assert not looped._thread.is_alive() and not beaten._thread.is_alive()
    finally:
        looped.stop()
        beaten.stop()
    assert looped_exits == beaten_exits == []
    assert not (tmp_path / "loop" / "hangs").exists() and not (tmp_path / "beat" / "hangs").exists()


def test_a_first_step_not_every_rank_made_is_still_the_start(tmp_path: Path) -> None:
    """A rank waiting in its first steps for one still in its setup reports too."""
    dog, exits, fired = fired_dog(tmp_path, dist_env(job_id="5"))
    try:
        dog.at(0)
        dog.at(1)
        fired.wait(10)
    finally:
        dog.stop()
    assert exits == [watchdog.HANG_EXIT_STATUS]
    report = json.loads((tmp_path / "hangs" / "5.0" / "rank_0.json").read_text())
    assert (report["phase"], report["step"]) == ("first step", 1)


def test_a_start_up_deadline_of_0_is_off(tmp_path: Path) -> None:
    exits: list[int] = []
    dog = watchdog.Watchdog(tmp_path, dist_env(), None, 0, exit=exits.append)
    try:
        dog.phase(startwatch.SETUP)
        time.sleep(2.5)
    finally:
        dog.stop()
    assert exits == [] and not (tmp_path / "hangs").exists()


@pytest.mark.parametrize("seconds", [-1, 5])
def test_the_schema_refuses_a_start_up_deadline_below_10_s_but_0(seconds: int) -> None:
    with pytest.raises(ConfigError, match=f"dist.start_timeout_s: {seconds} s"):
        Dist(start_timeout_s=seconds)
    assert Dist(start_timeout_s=0).start_timeout_s == 0 and Dist().start_timeout_s == 900


def test_rank_0_names_a_rank_that_never_came_and_one_in_its_stead_when_rank_0_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watchdog, "GATHER_S", 0.3)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.delenv("SLURM_STEP_NODELIST", raising=False)
    ranks = {"world_size": 2, "num_nodes": 2, "job_id": "5"}
    dog, exits, fired = fired_dog(tmp_path / "zero", dist_env(**ranks))
    try:
        dog.phase(startwatch.RENDEZVOUS)
        dog.arrived([0])
        fired.wait(10)
    finally:
        dog.stop()
    assert exits == [watchdog.HANG_EXIT_STATUS]
    failure = json.loads((tmp_path / "zero" / "failure.json").read_text())
    assert failure["cause"].startswith(
        "start-up hang: rank 1 on node2 never reached the rendezvous (no report"
    )
    # A suspect, not a bad host: the rank may be the code's (allocation/requeue.py keeps it without a
    # spare).
    assert list(failure["suspect_hosts"]) == ["node2"] and "bad_hosts" not in failure
    # Rank 1's side when rank 0 never came up (a spare that is itself broken): it records the verdict.
    dog, exits, fired = fired_dog(tmp_path / "one", dist_env(rank=1, **ranks))
    try:
        dog.phase(startwatch.RENDEZVOUS)
        fired.wait(10)
    finally:
        dog.stop()
    assert exits == [watchdog.HANG_EXIT_STATUS]
    failure = json.loads((tmp_path / "one" / "failure.json").read_text())
    assert failure["rank"] == 1 and failure["cause"].startswith(
        "start-up hang: rank 0 on node1 did not report"
    )
    assert list(failure["suspect_hosts"]) == ["node1"] and "bad_hosts" not in failure


def test_rank_0_hears_who_checked_in_at_the_rendezvous_as_they_do() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist = dist_env(world_size=2, master_addr="127.0.0.1", master_port=port)
    store = rendezvous.open_store(dist, 10)
    peer = rendezvous.open_store(dataclasses.replace(dist, rank=1), 10)
    seen: list[list[int]] = []
    late = threading.Timer(0.3, lambda: peer.append(rendezvous.ARRIVED_KEY, "1 "))
    late.start()
    rendezvous.arrive(store, dist, 10, seen.append)
    late.join()
    assert seen == [[0], [0, 1]]
    peer.wait([rendezvous.ALL_ARRIVED_KEY])  # what rank 1's arrive waits for
