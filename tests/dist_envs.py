"""DistEnv values for tests that need a rank's position without a Slurm task around them."""

from __future__ import annotations

from typing import Any

from slurmddp.job.process.distenv import DistEnv


def dist_env(**changes: Any) -> DistEnv:
    """Rank 0 of a one-rank CPU job (job "0", first attempt, rank 0 reachable on localhost:1), with
    `changes` made to it: `dist_env(world_size=6, num_nodes=3)`."""
    fields: dict[str, Any] = {
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "local_world_size": 1,
        "node_rank": 0,
        "num_nodes": 1,
        "master_addr": "localhost",
        "master_port": 1,
        "job_id": "0",
        "restart_count": 0,
        "device_index": None,
    }
    return DistEnv(**{**fields, **changes})
