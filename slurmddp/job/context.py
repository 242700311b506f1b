"""The object a `module:function` entrypoint receives on every rank."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from slurmddp.job.distenv import DistEnv
from slurmddp.job.loop import TrainLoop
from slurmddp.layout import METRICS


@dataclass
class RunContext:
    """Where this rank stands, what it runs on, and the experiment it belongs to."""

    dist: DistEnv
    """This rank's place in the job; `rank`, `world_size`, ... below read it."""
    device: Any
    """The torch.device this rank computes on (cuda:N or cpu)."""
    config: DictConfig
    """The resolved experiment, read-only; the user's settings are `config.train`."""
    run_dir: Path
    checkpoint_dir: Path
    active_loop: TrainLoop | None = field(default=None, repr=False)
    """The loop made by `loop()`, once there is one."""

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def local_rank(self) -> int:
        """The rank's index on its node."""
        return self.dist.local_rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def local_world_size(self) -> int:
        """Ranks on this node."""
        return self.dist.local_world_size

    @property
    def node_rank(self) -> int:
        return self.dist.node_rank

    @property
    def num_nodes(self) -> int:
        return self.dist.num_nodes

    @property
    def job_id(self) -> str:
        return self.dist.job_id

    @property
    def restart_count(self) -> int:
        """How many times Slurm has requeued this job before this attempt."""
        return self.dist.restart_count

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

    def log(self, step: int, **metrics: Any) -> None:
        """Record metrics (numbers, or one-element tensors) at `step` in RUN_DIR/metrics.jsonl,
        which `status` and `results` read. Only rank 0 writes; the call is free elsewhere."""
        if self.rank != 0:
            return
        record = {"step": int(step), "time": round(time.time(), 3)}
        # .item() for tensors: float() on one that requires grad warns.
        record.update({name: float(getattr(v, "item", lambda v=v: v)()) for name, v in metrics.items()})
        with (self.run_dir / METRICS).open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def ddp(self, module: Any, **kwargs: Any) -> Any:
        """Wrap `module` in DistributedDataParallel on this rank's device.

        `find_unused_parameters=True` by default: it is what keeps DDP from rebuilding its gradient
        buckets after the first iteration. A rebuild makes a resumed attempt reduce its first step
        in a different bucket layout (a different float summation order) than the uninterrupted
        run did at that step, so resume would not be bit-exact (see docs/resume.md). The reducer's
        one-time warning that no parameter was unused is expected (it is printed by C++ from the
        autograd thread, past Python's warning filters).
        """
        from torch.nn.parallel import DistributedDataParallel

        kwargs.setdefault("find_unused_parameters", True)
        if self.device.type == "cuda":
            kwargs.setdefault("device_ids", [self.device.index])
        return DistributedDataParallel(module.to(self.device), **kwargs)

    def loop(self, total_steps: int, *, extra: dict[str, Any] | None = None, **stateful: Any) -> TrainLoop:
        """A resumable loop over steps: `for step in ctx.loop(1000, model=m, optimizer=opt): ...`.

        Each keyword names an object with state_dict()/load_state_dict() (model, optimizer,
        scheduler, grad scaler, sampler, ...); they are restored from the latest complete
        checkpoint, saved as config.checkpoint says, and saved by every rank at the same step when
        a stop signal arrives. `extra` is a dict of your own values kept the same way.
        """
        from slurmddp.job.checkpoint import CheckpointStore

        settings = self.config.checkpoint
        store = CheckpointStore(
            self.checkpoint_dir,
            rank=self.rank,
            world_size=self.world_size,
            keep_last=settings.keep_last,
            async_save=settings.async_save,
        )
        self.active_loop = TrainLoop(
            total_steps=total_steps,
            rank=self.rank,
            device=self.device,
            run_dir=self.run_dir,
            store=store,
            every_steps=settings.every_steps,
            every_minutes=settings.every_minutes,
            restart_count=self.restart_count,
            job_id=self.job_id,
            objects=stateful,
            extra=extra if extra is not None else {},
        )
        return self.active_loop
