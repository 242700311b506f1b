"""The object a `module:function` entrypoint receives on every rank."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


@dataclass(frozen=True)
class RunContext:
    """Where this rank stands, what it runs on, and the experiment it belongs to."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    device: Any
    """The torch.device this rank computes on (cuda:N or cpu)."""
    config: DictConfig
    """The resolved experiment, read-only; the user's settings are `config.train`."""
    run_dir: Path
    checkpoint_dir: Path
    job_id: str
    restart_count: int
    """How many times Slurm has requeued this job before this attempt."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank that writes shared files."""
        return self.rank == 0

    @property
    def train(self) -> DictConfig:
        """Shortcut for `config.train`."""
        section = self.config.train
        assert isinstance(section, DictConfig)
        return section
