"""Smoke tests of the local Slurm lab itself (tests/slurm_lab): if these fail, every other `slurm`
test would fail for reasons that have nothing to do with slurmddp."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from conftest import LAB_UP, lab_exports

pytestmark = pytest.mark.slurm

NODES = ("node1", "node2", "node3")


def run(env: Mapping[str, str], *args: str, timeout: float = 60.0, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        list(args), env=dict(env), capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def sbatch(env: Mapping[str, str], cwd: Path, *args: str) -> str:
    return run(env, "sbatch", "--parsable", "-J", "lab-smoke", *args, cwd=cwd).strip().split(";")[0]


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def test_sinfo_shows_three_idle_nodes_in_both_partitions(slurm_env: dict[str, str]) -> None:
    expected = {(node, partition, "idle") for node in NODES for partition in ("debug*", "high")}

    def rows() -> set[tuple[str, ...]]:
        out = run(slurm_env, "sinfo", "-h", "-N", "-o", "%N %P %t")
        return {tuple(line.split()) for line in out.splitlines()}

    # An earlier test's job may still be completing.
    wait_until("all nodes idle", lambda: rows() == expected, timeout=30)


def test_srun_runs_on_three_distinct_hosts(slurm_env: dict[str, str]) -> None:
    out = run(slurm_env, "srun", "-N3", "-n3", "hostname")
    assert sorted(out.split()) == list(NODES)


TCP_PROBE = r"""
import os, socket, subprocess, time

port = 29411
nodes = subprocess.run(
    ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
    capture_output=True, text=True, check=True,
).stdout.split()
first, me = nodes[0], socket.gethostname()
if os.environ["SLURM_PROCID"] == "0":
    assert me == first, (me, first)
    with socket.create_server(("", port)) as server:
        server.settimeout(30)
        conn, (peer, _) = server.accept()
        with conn:
            print(f"server {me} got {conn.recv(100).decode()} from {peer}", flush=True)
else:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((first, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with conn:
        conn.sendall(me.encode())
    print(f"client {me} reached {first} at {socket.gethostbyname(first)}", flush=True)
"""


def test_second_node_reaches_first_node_by_name(slurm_env: dict[str, str]) -> None:
    # This is what gloo/NCCL rendezvous needs: MASTER_ADDR is the first node's name.
    out = run(
        slurm_env, "srun", "-N2", "-n2", "--kill-on-bad-exit=1", sys.executable, "-c", TCP_PROBE, timeout=90
    )
    lines = sorted(out.splitlines())
    assert len(lines) == 2, out
    client, server = lines
    _, client_host, _, first, _, first_addr = client.split()
    _, server_host, _, sender, _, peer_addr = server.split()
    assert server_host == first != client_host == sender
    assert not first_addr.startswith("127."), "a node name must resolve to the node's bridge address"
    assert peer_addr != first_addr


def test_gpus_per_task_gives_each_task_its_own_device(slurm_env: dict[str, str]) -> None:
    out = run(
        slurm_env,
        "srun",
        "-N1",
        "-n2",
        "--gpus-per-task=1",
        "bash",
        "-c",
        'echo "$SLURM_PROCID $CUDA_VISIBLE_DEVICES"',
    )
    devices = sorted(line.split()[1] for line in out.splitlines())
    assert devices == ["0", "1"], out


def test_sacct_reports_a_finished_job_completed(
    slurm_env: dict[str, str], slurm_wait: Callable[..., str], tmp_path: Path
) -> None:
    job_id = sbatch(slurm_env, tmp_path, "-o", "out.txt", "--wrap", "echo done")
    assert slurm_wait(job_id, timeout=60) == "COMPLETED"
    assert (tmp_path / "out.txt").read_text() == "done\n"


LOW_PRIORITY_JOB = """#!/bin/bash
echo "start restart=${SLURM_RESTART_COUNT:-0}"
# What slurmddp does on preemption: the USR2 arrives at once (preempt_send_user_signal), the job
# requeues itself instead of waiting out GraceTime plus slurmctld's ~30 s check cycle.
trap 'echo got USR2; scontrol requeue "$SLURM_JOB_ID"; exit 0' USR2
sleep 300 & wait
"""


def test_high_partition_job_preempts_and_requeues_debug_job(
    slurm_env: dict[str, str], slurm_wait: Callable[..., str], tmp_path: Path
) -> None:
    script = tmp_path / "low.sh"
    script.write_text(LOW_PRIORITY_JOB)
    log = tmp_path / "low.out"
    # All 4 CPUs of all 3 nodes.
    low = sbatch(
        slurm_env,
        tmp_path,
        "-p",
        "debug",
        "-N3",
        "--ntasks-per-node=1",
        "-c4",
        "--requeue",
        "--open-mode=append",
        "--signal=B:USR2",
        "-o",
        str(log),
        str(script),
    )
    try:
        wait_until(
            "the debug job to start",
            lambda: log.exists() and "start restart=0" in log.read_text(),
            timeout=30,
        )
        high = sbatch(slurm_env, tmp_path, "-p", "high", "-N1", "-c1", "-o", "high.out", "--wrap", "hostname")
        assert slurm_wait(high, timeout=45) == "COMPLETED"
        assert "got USR2" in log.read_text()
        # cred_expire=10 keeps a requeued job pending ~10 s before it may start again.
        wait_until("the debug job to run again", lambda: "start restart=1" in log.read_text(), timeout=45)
        history = run(slurm_env, "sacct", "-D", "-X", "-n", "-P", "-j", low, "-o", "State").split()
        assert history[0] == "REQUEUED", history
    finally:
        run(slurm_env, "scancel", low)
    assert slurm_wait(low, timeout=30) == "CANCELLED"


def test_up_again_leaves_the_running_lab_as_it_is(slurm_env: dict[str, str]) -> None:
    # slurm_env names this lab's generation and instance, as the session's own `up` had them.
    controller = Path(slurm_env["SLURM_CONF"]).parents[1] / "run" / "slurmctld.pid"
    before = controller.read_text()
    proc = subprocess.run(
        [str(LAB_UP)], env=slurm_env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "already up" in proc.stderr, proc.stderr
    again = lab_exports(proc.stdout.splitlines()[-1], slurm_env)
    assert again["SLURM_CONF"] == slurm_env["SLURM_CONF"]
    if "PATH" in again:  # the 24.11 lab: its wrappers first, as the session has them
        assert again["PATH"].split(":")[0] == slurm_env["PATH"].split(":")[0]
    assert controller.read_text() == before, "a second `up` restarted slurmctld"
