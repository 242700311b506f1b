"""Rank variables from Slurm's environment, for the layouts Slurm 22.05 hands out."""

from __future__ import annotations

import pytest

from slurmddp.errors import DistEnvError
from slurmddp.job.process import distenv


def slurm(procid: int, localid: int, nodeid: int, **extra: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "gpu-a[07-08]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    env.update(extra)
    return env


def test_every_rank_variable_of_a_two_by_two_job() -> None:
    dist = distenv.from_environment(slurm(3, 1, 1))
    assert (dist.rank, dist.local_rank, dist.world_size, dist.local_world_size) == (3, 1, 4, 2)
    assert (dist.node_rank, dist.num_nodes, dist.master_addr) == (1, 2, "gpu-a07")
    assert dist.master_port == distenv.derive_port(4242) and dist.backend == "gloo"
    env = distenv.rank_env(dist)
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "1"
    assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "gpu-a07" and env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert "SLURMDDP_DEVICE" not in env


def test_step_lists_win_over_the_job_lists() -> None:
    env = slurm(
        0, 0, 0, SLURM_STEP_NODELIST="gpu-a08", SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1"
    )
    dist = distenv.from_environment(env)
    assert (dist.master_addr, dist.world_size, dist.local_world_size) == ("gpu-a08", 1, 1)


def test_uneven_tasks_per_node() -> None:
    assert distenv.tasks_per_node("3(x2),1") == [3, 3, 1]
    env = slurm(6, 0, 2, SLURM_NTASKS="7", SLURM_JOB_NODELIST="n[1-3]", SLURM_TASKS_PER_NODE="3(x2),1")
    assert distenv.from_environment(env).local_world_size == 1
    with pytest.raises(DistEnvError):
        distenv.tasks_per_node("2(x)")


def test_port_is_stable_and_distinct() -> None:
    ports = {distenv.derive_port(job) for job in range(1000, 1000 + distenv.PORT_SPAN)}
    assert len(ports) == distenv.PORT_SPAN
    assert all(distenv.PORT_BASE <= p < distenv.PORT_BASE + distenv.PORT_SPAN for p in ports)
    assert max(ports) < 32768  # below Linux's ephemeral range
    requeued = distenv.from_environment(slurm(0, 0, 0, SLURM_RESTART_COUNT="2"))
    assert requeued.master_port == distenv.from_environment(slurm(0, 0, 0)).master_port
    assert requeued.restart_count == 2
    assert distenv.from_environment(slurm(0, 0, 0), port=29500).master_port == 29500


def test_gpus_per_node_every_task_sees_all() -> None:
    for local in (0, 1):
        env = slurm(local, local, 0, CUDA_VISIBLE_DEVICES="0,1", SLURM_GPUS_ON_NODE="2")
        dist = distenv.from_environment(env)
        assert dist.device_index == local and dist.backend == "nccl"
        assert distenv.rank_env(dist)["SLURMDDP_DEVICE"] == f"cuda:{local}"


def test_gpus_per_task_each_task_sees_one() -> None:
    # Slurm 22.05 sets SLURM_GPUS_PER_TASK in the tasks; 24.11 only SLURM_TRES_PER_TASK.
    for per_task in ({"SLURM_GPUS_PER_TASK": "1"}, {"SLURM_TRES_PER_TASK": "cpu=2,gres/gpu=1"}):
        for local, visible in ((0, "0"), (1, "1")):
            env = slurm(local, local, 0, CUDA_VISIBLE_DEVICES=visible, **per_task)
            assert distenv.from_environment(env).device_index == 0
    assert distenv.gpus_per_task({"SLURM_TRES_PER_TASK": "gres/gpu:a100=1"})
    assert not distenv.gpus_per_task({"SLURM_TRES_PER_TASK": "cpu=2"})


def test_more_ranks_than_gpus_is_an_error() -> None:
    with pytest.raises(DistEnvError, match="local rank 1 has no GPU"):
        distenv.from_environment(slurm(1, 1, 0, CUDA_VISIBLE_DEVICES="0"))


def test_local_executor() -> None:
    env = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_NTASKS": "4",
        "SUBMITIT_LOCAL_GLOBALID": "2",
        "SUBMITIT_LOCAL_LOCALID": "2",
        "SUBMITIT_LOCAL_JOB_ID": "777",
        "CUDA_VISIBLE_DEVICES": "",  # what submitit's local controller sets for a run without GPUs
        "SLURM_PROCID": "9",  # leaked from an enclosing allocation: the local executor wins
    }
    dist = distenv.from_environment(env)
    assert (dist.rank, dist.world_size, dist.master_addr, dist.device_index) == (2, 4, "127.0.0.1", None)
    assert dist.master_port == distenv.derive_port(777)


def test_not_a_job_and_garbage() -> None:
    with pytest.raises(DistEnvError, match="neither a Slurm task"):
        distenv.from_environment({})
    with pytest.raises(DistEnvError, match="not an integer"):
        distenv.from_environment(slurm(0, 0, 0, SLURM_PROCID="x"))
    env = slurm(0, 0, 0)
    del env["SLURM_JOB_NODELIST"]
    with pytest.raises(DistEnvError, match="NODELIST"):
        distenv.from_environment(env)
