"""What every rank is handed: a RankSpec of plain values and the schema's typed sections, pickled
into the job by submitit.

This module stays light (no torch, no user code) because every task unpickles it first thing;
with `job.rank` it is all of `job` that the submit side may import. The user's code is named by a
string and imported inside the rank, never pickled. The sections were checked when the experiment
was loaded (schema.py's __post_init__); unpickling does not check them again, and nothing in the
rank needs to.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from slurmddp.cluster.fabric import FabricProfile
from slurmddp.defaults import IntegrationsMode, RunExecutor
from slurmddp.experiment.schema import (
    Checkpoint,
    Ddp,
    Dist,
    Experiment,
    Precision,
    Preflight,
    Telemetry,
    Trackers,
)


@dataclass(frozen=True)
class RunSettings:
    """The experiment's sections that a function rank's RunContext and its loop act on (and a
    script rank's process: `ddp`, `integrations`), typed as the schema checked them: each component
    takes its own section from here."""

    name: str
    """The experiment's name: the trackers' default project and run name."""
    checkpoint: Checkpoint
    ddp: Ddp
    precision: Precision
    telemetry: Telemetry
    trackers: Trackers
    integrations: IntegrationsMode = "manual"
    """A script's framework Trainers get slurmddp's callback unasked (`auto`)."""

    @classmethod
    def of(cls, exp: Experiment) -> RunSettings:
        """The sections of a loaded (and so checked) experiment."""
        return cls(
            name=exp.name,
            checkpoint=exp.checkpoint,
            ddp=exp.ddp,
            precision=exp.precision,
            telemetry=exp.telemetry,
            trackers=exp.trackers,
            integrations=exp.integrations,
        )


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs besides its environment."""

    function: str | None
    """`module:function` or `/abs/file.py:function`."""
    script: str | None
    """Absolute path of a torchrun-style script."""
    args: tuple[str, ...]
    """Command-line arguments of `script` or `module`."""
    workdir: str
    """The submit directory: ranks run there and import from there."""
    run_dir: str
    checkpoint_dir: str
    config: dict[str, Any]
    """The resolved experiment, handed to the user's function as ctx.config (for the user's keys;
    slurmddp's own code reads the typed sections)."""
    dist: Dist
    """How the ranks find each other (backend, port, timeout, launcher)."""
    preflight: Preflight
    settings: RunSettings
    env: dict[str, str]
    """Variables every rank gets besides the rank variables (OMP_NUM_THREADS, fabric.env)."""
    fabric_profile: FabricProfile
    stop_signals: tuple[str, ...]
    executor: RunExecutor
    """How a stopped rank asks to be run again."""
    module: str | None = None
    """A dotted module name, run as `python -m module` (torchrun -m)."""

    def command(self) -> list[str]:
        """The command a script or module rank runs (`args` are `script`'s or `module`'s), as
        torchrun would start it. `python -m` puts the working directory, the submit directory,
        first on sys.path, so the module resolves there as it did at submit."""
        if self.script is not None:
            return [sys.executable, self.script, *self.args]
        if self.module is not None:
            return [sys.executable, "-m", self.module, *self.args]
        raise ValueError("a function entrypoint runs in the rank itself, not as a command")
