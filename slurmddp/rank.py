"""What submitit pickles into the job: a RankSpec of plain values and the callable that runs it.

This module stays light (no torch, no user code) because every task unpickles it first thing.
The user's code is named by a string and imported inside the rank, never pickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs besides its environment."""

    function: str | None
    """`module:function` or `/abs/file.py:function`."""
    script: str | None
    """Absolute path of a torchrun-style script."""
    args: tuple[str, ...]
    workdir: str
    """The submit directory: ranks run there and import from there."""
    run_dir: str
    checkpoint_dir: str
    config: dict[str, Any]
    """The resolved experiment."""
    port: int | None
    backend: str
    timeout_s: int
    env: dict[str, str]
    fabric_profile: str
    stop_signals: tuple[str, ...]
    executor: str
    """`slurm` or `local`: how a stopped rank asks to be run again."""


class Rank:
    """The callable submitit runs in every task."""

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec

    def __call__(self) -> Any:
        from slurmddp.runtime import run_rank

        return run_rank(self.spec)
