"""The object a `module:function` entrypoint receives on every rank."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from omegaconf import DictConfig, OmegaConf

from slurmddp.errors import ConfigError, SlurmddpError
from slurmddp.job.process.distenv import DistEnv
from slurmddp.job.spec import RunSettings
from slurmddp.job.train.loop import LoopRuntime, LoopState, TrainLoop
from slurmddp.rundir.metrics import MetricRecord, append_metric
from slurmddp.rundir.records import AttemptId, Failure

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

    from slurmddp.job.process.watchdog import Watchdog
    from slurmddp.job.train.data import Feed
    from slurmddp.job.train.stragglers import Straggler
    from slurmddp.job.train.telemetry import Telemetry
    from slurmddp.job.train.trackers import Trackers
    from slurmddp.search.trial import Reporter


@dataclass
class RunContext:
    """Where this rank stands, what it runs on, and the experiment it belongs to."""

    dist: DistEnv
    """This rank's place in the job; `rank`, `world_size`, ... below read it."""
    device: Any
    """The torch.device this rank computes on (cuda:N or cpu)."""
    config: DictConfig
    """The resolved experiment, read-only; the user's settings are `config.train`."""
    settings: RunSettings
    """slurmddp's own sections of the experiment, typed (checkpoint, ddp, precision, telemetry,
    trackers): what the context and its loop act on."""
    run_dir: Path
    checkpoint_dir: Path
    active_loop: TrainLoop | None = field(default=None, repr=False)
    """The loop made by `loop()`, once there is one."""
    ddp_modules: list[Any] = field(default_factory=list, repr=False)
    """The modules `ddp()` wrapped: the loop primes them on resume and `micro_batches` pauses their sync."""
    watchdog: Watchdog | None = field(default=None, repr=False)
    """The hang watchdog (dist.hang_timeout_s) the loop, evaluation loaders and reductions feed."""
    _scaler: Any = field(default=None, repr=False)
    _trackers: Trackers | None = field(default=None, repr=False)
    _replacing: dict[str, str] | None = field(default=None, repr=False)
    """Rank 0, with resources.replace_slow_nodes: the node named slow, with why, while a spare can
    take its place."""
    _reporter: Reporter | Literal[False] | None = field(default=None, repr=False)
    """Rank 0 of a search's trial: what reports to its study; False: the run is no trial."""
    _pruned_at: int | None = field(default=None, repr=False)
    """Rank 0: the step whose value made the pruner stop the trial."""

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
        """0 on the job's first attempt only: Slurm's requeues of this job so far, plus the restarts
        inside the current allocation (requeue.in_job_restarts)."""
        return self.dist.restart_count + self.dist.in_job_restart

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
        """Record metrics (numbers, or one-element tensors) at `step`: RUN_DIR/metrics.jsonl, which
        `status`, `results` and `submit --wait` read, and the trackers of `settings.trackers`
        (TensorBoard by default). Only rank 0 writes; the call is free elsewhere, and dropped during
        a resumed attempt's priming step (that step is run again)."""
        self._beat()
        if self.rank != 0 or (self.active_loop is not None and self.active_loop.priming):
            return
        # .item() for tensors: float() on one that requires grad warns.
        values = {name: float(getattr(v, "item", lambda v=v: v)()) for name, v in metrics.items()}
        append_metric(self.run_dir, MetricRecord(int(step), round(time.time(), 3), values))
        self._open_trackers().log(int(step), values)
        self._judge(int(step), values)

    def _judge(self, step: int, values: dict[str, float]) -> None:
        """Rank 0 of a search's trial: the metric's value to the study, and the pruner's verdict,
        which the loop's next boundaries make every rank's (a stop at the same step)."""
        if self._reporter is None:
            from slurmddp.search.trial import Reporter

            self._reporter = Reporter.open(self.run_dir) or False
        if self._reporter is False or self._pruned_at is not None:
            return
        if self._reporter.report(step, values):
            self._pruned_at = step
        problem = self._reporter.never_logged()
        if problem is not None:
            attempt = AttemptId.of(self.dist)
            Failure(step, self.rank, problem, attempt, time.time(), retry=False).write(self.run_dir)
            raise ConfigError(problem)

    def _open_trackers(self) -> Trackers:
        if self._trackers is None:
            from slurmddp.job.train.trackers import Trackers

            loop = self.active_loop
            self._trackers = Trackers.open(
                self.run_dir,
                self.settings.trackers,
                name=self.settings.name,
                first_step=loop.first_step if loop is not None else 0,
                config=self.config,
            )
        return self._trackers

    def _beat(self) -> None:
        if self.watchdog is not None:
            self.watchdog.beat()

    def close(self) -> None:
        """Flush and close the trackers (the runtime calls it when the function returns or stops)."""
        if self._trackers is not None:
            self._trackers.close()
            self._trackers = None

    def ddp(self, module: Any, **kwargs: Any) -> Any:
        """Wrap `module` in DistributedDataParallel on this rank's device, with `settings.ddp`'s
        bucket_cap_mb, gradient_as_bucket_view, static_graph and find_unused_parameters (False);
        keyword arguments win over them.

        Resume stays bit-exact without find_unused_parameters: a resumed attempt's loop runs one
        priming step first (see slurmddp.job.train.loop), since DDP's bucket layout, and with it the order
        in which floats are summed, changes after the first step.
        """
        from torch.nn.parallel import DistributedDataParallel

        options = self.settings.ddp
        for key in ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "find_unused_parameters"):
            kwargs.setdefault(key, getattr(options, key))
        if self.device.type == "cuda":
            kwargs.setdefault("device_ids", [self.device.index])
        wrapped = DistributedDataParallel(module.to(self.device), **kwargs)
        self.ddp_modules.append(wrapped)
        return wrapped

    def loader(
        self,
        dataset: Dataset[Any],
        *,
        global_batch: int,
        shuffle: bool = True,
        num_workers: int = 0,
        seed: int = 0,
        **options: Any,
    ) -> DataLoader[Any]:
        """A DataLoader over this rank's share of `dataset`, `global_batch // world_size` samples a
        batch.

        shuffle=True (training): reshuffled every epoch from `seed`, incomplete batches dropped, so
        every step is a full global batch whatever the world size; pass it as `ctx.loop(data=...)`,
        which sets its epoch and resumes it mid-epoch. shuffle=False (validation): every sample
        exactly once over all ranks, in order, no padding; reduce what each rank counts with
        `ctx.reduce_sum`. Other keywords (collate_fn, persistent_workers, ...) go to the DataLoader.
        """
        from slurmddp.job.train.data import make_loader

        return make_loader(
            dataset,
            global_batch=global_batch,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=shuffle,
            seed=seed,
            num_workers=num_workers,
            pin_memory=options.pop("pin_memory", self.device.type == "cuda"),
            options=options,
            beat=self.watchdog.beat if self.watchdog is not None else None,
        )

    def autocast(self) -> Any:
        """`torch.autocast` on this rank's device with `settings.precision.autocast`'s dtype (a no-op
        context with `none`): `with ctx.autocast(): loss = ...`."""
        import torch

        dtype = self.settings.precision.autocast
        return torch.autocast(
            self.device.type,
            dtype=getattr(torch, "bfloat16" if dtype == "none" else dtype),
            enabled=dtype != "none",
        )

    @property
    def scaler(self) -> Any:
        """This run's torch.amp.GradScaler: on with float16 autocast (or precision.grad_scaler), a
        pass-through otherwise, so `ctx.scaler.scale(loss).backward()` and `ctx.scaler.step(opt)`
        suit every setting. `ctx.loop` keeps its state in checkpoints."""
        if self._scaler is None:
            import torch

            precision = self.settings.precision
            enabled = precision.grad_scaler
            if enabled is None:
                enabled = precision.autocast == "float16"
            self._scaler = torch.amp.GradScaler(self.device.type, enabled=bool(enabled))
        return self._scaler

    def reduce_sum(self, *values: Any) -> list[int | float]:
        """Each value (number or one-element tensor) summed over all ranks; integers stay exact."""
        from slurmddp.job.train.metrics import reduce_sum

        self._beat()
        return reduce_sum(list(values), self.device)

    def reduce_mean(self, value: Any) -> float:
        """The mean of one scalar over all ranks."""
        from slurmddp.job.train.metrics import reduce_mean

        self._beat()
        return reduce_mean(value, self.device)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, on every rank."""
        from slurmddp.job.train.metrics import gather

        self._beat()
        return gather(obj)

    def loop(
        self,
        total_steps: int | None = None,
        *,
        epochs: int | None = None,
        data: DataLoader[Any] | None = None,
        extra: dict[str, Any] | None = None,
        **stateful: Any,
    ) -> TrainLoop:
        """A resumable loop: `for step in ctx.loop(1000, model=m, optimizer=opt): ...`, or over a
        training loader: `for step, batch in ctx.loop(epochs=10, data=loader, model=m, ...)`.

        Each keyword names an object with state_dict()/load_state_dict() (model, optimizer,
        scheduler, ...); they, `ctx.scaler` and the RNG streams are restored from the latest complete
        checkpoint, saved as settings.checkpoint says, and saved by every rank at the same step when
        a stop signal arrives. `extra` is a dict of your own values kept the same way. With `data`,
        `total_steps` defaults to `epochs` whole epochs.
        """
        from slurmddp.job.checkpoint import CheckpointStore
        from slurmddp.job.train.data import Feed
        from slurmddp.job.train.snapshots import Snapshots

        feed = Feed(data) if data is not None else None
        if total_steps is None:
            if feed is None or epochs is None:
                raise SlurmddpError("ctx.loop needs total_steps, or epochs= with data=")
            total_steps = epochs * feed.steps_per_epoch
        elif epochs is not None:
            raise SlurmddpError("ctx.loop takes total_steps or epochs=, not both")
        limit = self.settings.telemetry.max_steps
        if limit is not None:
            total_steps = min(total_steps, limit)
        stateful.setdefault("scaler", self.scaler)
        store = CheckpointStore(self.checkpoint_dir, self.rank, self.world_size, self.settings.checkpoint)
        self.active_loop = TrainLoop(
            total_steps,
            checkpoint=self.settings.checkpoint,
            ddp=self.settings.ddp,
            precision=self.settings.precision,
            state=LoopState(stateful, extra if extra is not None else {}, feed),
            runtime=LoopRuntime(
                dist=self.dist,
                device=self.device,
                run_dir=self.run_dir,
                store=store,
                ddp_modules=self.ddp_modules,
                watchdog=self.watchdog,
                telemetry=self._telemetry(feed),
                snapshots=Snapshots.open(os.environ, self.settings.checkpoint, self.dist, self.device),
                slow_to_replace=lambda: self._replacing,
                pruned=lambda: self._pruned_at is not None,
            ),
        )
        return self.active_loop

    def _telemetry(self, feed: Feed | None) -> Telemetry | None:
        import torch.distributed as tdist

        from slurmddp.job.train.telemetry import Telemetry, transport

        settings = self.settings.telemetry
        if not settings.enabled:
            return None
        backend = str(tdist.get_backend())
        return Telemetry(
            settings,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            samples_per_step=feed.identity()["global_batch"] if feed is not None else None,
            backend=backend,
            transport=transport(backend, os.environ),
            log=self.log,
            node=self.dist.node_rank,
            slow=self._slow_node,
        )

    def _slow_node(self, found: Straggler | None, step: int) -> None:
        """Rank 0: a node was named slow (or none is any more): say it in the log and the record
        `status` reads."""
        import socket

        from slurmddp.cluster import hostlist
        from slurmddp.rundir.records import AttemptId, SlowNode

        nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        hosts = hostlist.expand(nodes) if nodes else [socket.gethostname()]
        host = (
            None if found is None else hosts[found.node] if found.node < len(hosts) else f"node {found.node}"
        )
        ratio, slows_by = (found.ratio, found.slows_by) if found is not None else (0.0, 0.0)
        SlowNode(host, ratio, slows_by, step, AttemptId.of(self.dist), time.time()).write(self.run_dir)
        self._replacing = None
        if found is None or host is None:
            print(f"slurmddp: no node is slow any more (step {step})", flush=True)
            return
        print(
            f"slurmddp: {host} is slow: its ranks compute {ratio:.2f}x the median node's per step, "
            f"which slows every step by {100 * slows_by:.0f}% (step {step})",
            flush=True,
        )
        if OmegaConf.select(self.config, "resources.replace_slow_nodes", default=False):
            self._replace_with_spare(host, f"slow: {ratio:.2f}x the median node's compute per step", nodes)

    def _replace_with_spare(self, host: str, why: str, step_nodes: str | None) -> None:
        """Rank 0: have the loop end the attempt at the next checkpoint for a restart on a spare,
        where the allocation has one left (job/allocation/outcome.py, the same choice the batch
        script's requeue decision makes)."""
        from slurmddp.job.allocation.outcome import Settings, known_hosts, spare_hosts
        from slurmddp.rundir.records import AttemptId

        settings = Settings.of_run(self.run_dir)
        known = known_hosts(self.run_dir, settings, AttemptId.of(self.dist))
        spares = spare_hosts(os.environ, settings, known | {host}, step_nodes or "")
        if not spares:
            print(f"slurmddp: no spare node is left to replace {host}: it keeps its ranks", flush=True)
            return
        self._replacing = {host: why}
        print(
            f"slurmddp: {host} will be replaced by {', '.join(spares)} at the next checkpoint "
            "(resources.replace_slow_nodes)",
            flush=True,
        )
