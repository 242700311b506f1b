"""Where a rank stands in the job, derived purely from its environment (Slurm's or submitit's local).

Every function here maps a `Mapping[str, str]` to plain values, so each Slurm layout can be tested
with a dictionary. One rank is one Slurm task: no torchrun in between.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from slurmddp.cluster.hostlist import expand
from slurmddp.errors import DistEnvError
from slurmddp.rundir.records import in_job_restart

# Below Linux's default ephemeral range (32768-60999), so a derived port is not already taken by an
# outgoing connection of some other process on the node.
PORT_BASE = 20000
PORT_SPAN = 10000
LOCAL_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class DistEnv:
    """The position of one rank, and how to reach rank 0."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str
    restart_count: int
    device_index: int | None
    """Index into this task's CUDA_VISIBLE_DEVICES; None for a CPU rank."""
    in_job_restart: int = 0
    """Restarts before this attempt in the same allocation (the batch script's IN_JOB_RESTART_ENV)."""

    @property
    def backend(self) -> str:
        return "gloo" if self.device_index is None else "nccl"


def from_environment(env: Mapping[str, str], port: int | None = None) -> DistEnv:
    """The DistEnv of the current task: submitit's local executor or a Slurm step."""
    if env.get("SUBMITIT_EXECUTOR") == "local":
        return _from_local(env, port)
    if "SLURM_PROCID" in env:
        return _from_slurm(env, port)
    raise DistEnvError(
        "this process is neither a Slurm task (no SLURM_PROCID) nor a local slurmddp rank; "
        "start it with `python -m slurmddp submit`"
    )


def derive_port(job_key: int) -> int:
    """MASTER_PORT from the job id: stable across requeues (the id survives them), and distinct for
    any two jobs whose ids differ by less than PORT_SPAN. Array tasks have ids of their own."""
    return PORT_BASE + job_key % PORT_SPAN


def _int(env: Mapping[str, str], *names: str) -> int:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip():
            try:
                return int(value)
            except ValueError:
                raise DistEnvError(f"{name}={value!r} is not an integer") from None
    raise DistEnvError(f"none of {', '.join(names)} is set: is this a Slurm job step?")


def tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's task-count syntax, e.g. "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise DistEnvError(f"cannot read the tasks-per-node value {spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _from_slurm(env: Mapping[str, str], port: int | None) -> DistEnv:
    rank = _int(env, "SLURM_PROCID")
    node_rank = _int(env, "SLURM_NODEID")
    world = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    # The step's own lists, not the job's: a step may run on a subset of the allocation, and rank 0
    # sits on the step's first node.
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise DistEnvError("SLURM_STEP_NODELIST/SLURM_JOB_NODELIST is not set: is this a Slurm job step?")
    hosts = expand(nodelist)
    per_node_spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node_spec:
        per_node = tasks_per_node(per_node_spec)
        if node_rank >= len(per_node):
            raise DistEnvError(f"SLURM_NODEID={node_rank} but the step has {len(per_node)} nodes")
        local_world = per_node[node_rank]
    else:
        local_world = world // len(hosts)
    local_rank = _int(env, "SLURM_LOCALID")
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if port is None:
        port = derive_port(_int(env, "SLURM_JOB_ID", "SLURM_JOBID"))
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank,
        num_nodes=len(hosts),
        master_addr=hosts[0],
        master_port=port,
        job_id=job_id,
        restart_count=int(env.get("SLURM_RESTART_COUNT") or 0),
        device_index=select_device(env, local_rank),
        in_job_restart=in_job_restart(env),
    )


def _from_local(env: Mapping[str, str], port: int | None) -> DistEnv:
    world = _int(env, "SUBMITIT_LOCAL_NTASKS")
    rank = _int(env, "SUBMITIT_LOCAL_GLOBALID")
    local_rank = _int(env, "SUBMITIT_LOCAL_LOCALID")
    job_id = env.get("SUBMITIT_LOCAL_JOB_ID", "")
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=world,
        node_rank=0,
        num_nodes=1,
        master_addr=LOCAL_ADDR,
        master_port=port if port is not None else derive_port(_int(env, "SUBMITIT_LOCAL_JOB_ID")),
        job_id=job_id,
        restart_count=0,
        # submitit's local controller lists the run's GPUs for every rank (none: CUDA_VISIBLE_DEVICES
        # is "", and the ranks run on the CPU with gloo), as Slurm does under --gpus-per-node.
        device_index=select_device(env, local_rank),
    )


def select_device(env: Mapping[str, str], local_rank: int) -> int | None:
    """Which of the task's visible GPUs this rank drives.

    Slurm hands every task of a `--gpus-per-node` job all the node's GPUs
    (CUDA_VISIBLE_DEVICES=0,1 on each), so the rank takes the one at its local rank; with
    `--gpus-per-task` each task sees only its own (CUDA_VISIBLE_DEVICES=0 on one, 1 on the other,
    renumbered from 0 by CUDA), so the rank takes the first.
    """
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        return None
    if gpus_per_task(env):
        return 0
    if local_rank >= len(visible):
        raise DistEnvError(
            f"local rank {local_rank} has no GPU of its own: the task sees CUDA_VISIBLE_DEVICES="
            f"{env.get('CUDA_VISIBLE_DEVICES')}; ask for one GPU per rank (resources.gpus_per_node)"
        )
    return local_rank


def gpus_per_task(env: Mapping[str, str]) -> bool:
    """Whether the job asked for GPUs per task (`--gpus-per-task`). Slurm 22.05 says so in
    SLURM_GPUS_PER_TASK; 24.11 leaves that unset in the tasks and gives SLURM_TRES_PER_TASK
    ("cpu=2,gres/gpu=1", seen on 24.11.5) instead."""
    if env.get("SLURM_GPUS_PER_TASK"):
        return True
    tres = (part.strip() for part in env.get("SLURM_TRES_PER_TASK", "").split(","))
    return any(part.startswith(("gres/gpu=", "gres/gpu:")) for part in tres)


def rank_env(dist: DistEnv) -> dict[str, str]:
    """The variables torchrun gives each worker, so an unmodified torchrun script runs as a rank,
    plus SLURMDDP_DEVICE (cuda:N) for GPU ranks: the device to use under either GPU binding."""
    env = {
        "RANK": str(dist.rank),
        "LOCAL_RANK": str(dist.local_rank),
        "WORLD_SIZE": str(dist.world_size),
        "LOCAL_WORLD_SIZE": str(dist.local_world_size),
        "GROUP_RANK": str(dist.node_rank),
        "GROUP_WORLD_SIZE": str(dist.num_nodes),
        "ROLE_RANK": str(dist.rank),
        "ROLE_WORLD_SIZE": str(dist.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": dist.master_addr,
        "MASTER_PORT": str(dist.master_port),
        # 0 on the job's first attempt only, as under torchrun: requeues and in-job restarts count.
        "TORCHELASTIC_RESTART_COUNT": str(dist.restart_count + dist.in_job_restart),
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": dist.job_id or "none",
        # False: rank 0 hosts the TCPStore itself; there is no torchrun agent holding one.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    if dist.device_index is not None:
        env["SLURMDDP_DEVICE"] = f"cuda:{dist.device_index}"
    return env


def rank_hosts(dist: DistEnv, env: Mapping[str, str]) -> list[str]:
    """The host of every rank: Slurm places ranks in blocks of local_world_size per node, on the
    step's nodes (with spare nodes, not all of the job's)."""
    listed = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    nodes = expand(listed) if listed else []
    if not nodes:
        return [socket.gethostname()] * dist.world_size
    return [nodes[min(r // dist.local_world_size, len(nodes) - 1)] for r in range(dist.world_size)]
