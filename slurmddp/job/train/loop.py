"""The training-loop driver: resume, periodic checkpoints, and a stop that every rank takes together.

    for step in ctx.loop(total_steps, model=model, optimizer=optimizer):
        ...one training step...
    for step, batch in ctx.loop(epochs=10, data=ctx.loader(dataset, global_batch=64), model=...):
        ...one training step on this rank's share of the global batch...

At each step boundary the ranks exchange one small all-reduce that carries "a stop signal arrived",
"a timed checkpoint is due", "a telemetry record is due", "an in-memory snapshot is due", "a
node is still writing the last snapshot" (job/train/snapshots.py), "a slow node is to be
replaced" (resources.replace_slow_nodes) and "the search's pruner stopped this trial". It is
started at one boundary and read at the next, so it never waits on the network; since every rank
reads the same reduced value at the same boundary, all ranks stop (or save) at the same step, one
step after the signal.

A resumed attempt first runs the user's step once as a priming step and then loads the checkpoint
again. DistributedDataParallel lays out its gradient buckets in parameter order, records the order
in which gradients become ready in its first backward, and rebuilds its buckets once, before the
second forward. The uninterrupted run reduced every step after its first in the rebuilt layout; a
resumed process without priming would reduce its first step in the initial one, and with three or
more ranks a float's place in a bucket decides the order in which the ranks' values are summed:
other bits. After the priming step the process is where the uninterrupted run was (rebuilt buckets,
the checkpoint's state, the RNG streams as they were after the batch was drawn), at the cost of one
step per resume instead of `find_unused_parameters=True`'s graph walk in every step.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmddp.errors import CheckpointError, SlurmddpError
from slurmddp.job.process import signals
from slurmddp.job.process.stop import StopForRequeue
from slurmddp.rundir.metrics import drop_metrics_from
from slurmddp.rundir.records import AttemptId, Failure, LoopProgress, Progress, SkippedSaves, Stop
from slurmddp.rundir.trial import TrialRecord

if TYPE_CHECKING:
    from slurmddp.experiment.schema import Checkpoint, Ddp, Precision
    from slurmddp.job.checkpoint import CheckpointInfo, CheckpointStore
    from slurmddp.job.process.distenv import DistEnv
    from slurmddp.job.process.watchdog import Watchdog
    from slurmddp.job.train.data import Feed
    from slurmddp.job.train.snapshots import Snapshots
    from slurmddp.job.train.telemetry import Telemetry

# Rank 0 records how far it got at most this often, for the attempt log of a crashed attempt.
PROGRESS_EVERY_S = 2.0
Unsaved = tuple[int, str]
"""A checkpoint's step, and why it was not saved."""


class TrialPruned(BaseException):
    """What every rank ends with, at the same step, once the search's pruner stopped the trial
    (rank 0 heard it from the study): not a failure, and nothing to resume. A BaseException, as
    StopForRequeue."""

    def __init__(self, step: int) -> None:
        super().__init__(f"the search's pruner stopped this trial at step {step}; the run ends here")
        self.step = step


class SlowNodeReplaced(BaseException):
    """What every rank ends with once the ranks agreed to replace a slow node and saved. A
    BaseException, as StopForRequeue: a user's `except Exception` around the loop must not swallow
    it and let the rank go on alone."""


@dataclass(frozen=True)
class LoopState:
    """What the loop keeps in every checkpoint and restores on resume."""

    objects: Mapping[str, Any]
    """Objects with state_dict()/load_state_dict() (model, optimizer, scaler, ...), by name."""
    extra: dict[str, Any] = field(default_factory=dict)
    """User values saved with every checkpoint and restored on resume (rank 0's are kept)."""
    data: Feed | None = None
    """The training loader, resumed mid-epoch; None when the step draws its own batches."""


@dataclass(frozen=True)
class LoopRuntime:
    """Where this rank's loop runs, and the collaborators it drives."""

    dist: DistEnv
    """This rank's place in the job: its rank, and the attempt (job id, restart count)."""
    device: Any
    """The torch.device of the boundary all-reduce."""
    run_dir: Path
    store: CheckpointStore
    ddp_modules: Sequence[Any] = ()
    """The modules ctx.ddp wrapped: primed on resume, and paused by micro_batches."""
    watchdog: Watchdog | None = None
    telemetry: Telemetry | None = None
    snapshots: Snapshots | None = None
    """In-memory snapshots (checkpoint.snapshot_every_steps), where the batch script set them up."""
    slow_to_replace: Callable[[], dict[str, str] | None] | None = None
    """Rank 0, with resources.replace_slow_nodes: the node named slow, with why, while a spare can
    take its place; the attempt then ends at the next checkpoint and restarts on the spare."""
    pruned: Callable[[], bool] | None = None
    """Rank 0 of a search's trial: whether the pruner stopped it."""


class TrainLoop:
    """Iterates over step numbers (with `data`: (step, batch) pairs) from the last checkpoint (or 0)
    to `total_steps`, saving as the experiment's `checkpoint:` section says."""

    def __init__(
        self,
        total_steps: int,
        *,
        checkpoint: Checkpoint,
        ddp: Ddp,
        precision: Precision,
        state: LoopState,
        runtime: LoopRuntime,
    ) -> None:
        import torch

        self.total_steps = total_steps
        self._place(runtime, checkpoint)
        self._hold(state, ddp, precision)
        self._start_counting()
        # A stop signal arrived; a timed checkpoint is due; a telemetry record is due; an in-memory
        # snapshot is due; a node is still writing the last one; a slow node is to be replaced; the
        # trial is pruned.
        self._flags = torch.zeros(7, dtype=torch.int32, device=runtime.device)
        self._pending: Any = None
        self._check_own_sampler()
        self._resume()

    def _place(self, runtime: LoopRuntime, checkpoint: Checkpoint) -> None:
        """Where this rank's loop runs, when it saves, and its collaborators."""
        self.rank = runtime.dist.rank
        self.run_dir = runtime.run_dir
        self.store = runtime.store
        self.every_steps = checkpoint.every_steps
        self.every_s = checkpoint.every_minutes * 60
        self.attempt = AttemptId.of(runtime.dist)
        self._ddp_modules = runtime.ddp_modules
        self._watchdog = runtime.watchdog
        self.telemetry = runtime.telemetry
        """Step times, data wait, communication (train/telemetry.py); None with telemetry.enabled=false."""
        self.snapshots = runtime.snapshots
        self._slow_to_replace = runtime.slow_to_replace
        self._pruned = runtime.pruned

    def _hold(self, state: LoopState, ddp: Ddp, precision: Precision) -> None:
        """What the checkpoints keep, and the settings that state depends on."""
        data = state.data
        self.objects = {name: obj for name, obj in state.objects.items() if obj is not None}
        self.extra = state.extra
        """User values saved with every checkpoint and restored on resume (rank 0's are kept)."""
        self.data = data
        self.accumulate = ddp.accumulate
        """Micro-batches per step (ddp.accumulate): what `micro_batches` cuts a batch into."""
        self.settings: dict[str, Any] = {
            "accumulate": ddp.accumulate,
            "autocast": precision.autocast,
            **(data.identity() if data is not None else {}),
        }
        """What a checkpoint's state depends on besides the objects; a resume must find the same."""

    def _start_counting(self) -> None:
        """The counters of a loop that has run no step yet."""
        self.step = 0
        self.first_step = 0
        """The step this attempt started from (0, or the checkpoint it resumed)."""
        self.priming = False
        """True while the step being run is the priming step of a resumed attempt: its effects are
        undone, and `ctx.log` drops what it logs; skip other side effects (files of your own) then."""
        self.last_save_s = 0.0
        self._save_total_s = 0.0
        self._first_step_at: float | None = None
        self._resumed: CheckpointInfo | None = None
        self._reload: Callable[[], dict[str, Any]] | None = None
        """A fresh copy of the resumed state's shared part, for after the priming step."""
        self._saved_at = time.monotonic()
        self._saved_step = -1
        self._unsettled: tuple[int, str | None] | None = None
        """The step of the last save and this rank's problem with it, until every rank agreed on
        how it went (an async save is agreed on at the next save, the stop, or the end)."""
        self._progress_at = 0.0

    @property
    def epoch(self) -> int:
        """The epoch of the current step (0 without `data`)."""
        return self.data.epoch_of(min(self.step, self.total_steps - 1)) if self.data is not None else 0

    @property
    def epochs(self) -> int | None:
        """Epochs in the run (with `data`), the last one possibly partial."""
        if self.data is None:
            return None
        return -(-self.total_steps // self.data.steps_per_epoch)

    @property
    def epoch_end(self) -> bool:
        """True at the last step of an epoch (and of the run): where validation goes."""
        if self.step == self.total_steps - 1:
            return True
        return self.data is not None and (self.step + 1) % self.data.steps_per_epoch == 0

    def micro_batches(self, batch: Any) -> Iterator[Any]:
        """`batch` cut into `ddp.accumulate` equal micro-batches; every DDP module made by `ctx.ddp`
        skips the gradient all-reduce (`no_sync`) in all but the last. Run forward and backward of
        each inside the loop over them, with the loss divided by `loop.accumulate`."""
        from slurmddp.job.train.data import split

        parts = split(batch, self.accumulate)
        for index, part in enumerate(parts):
            with ExitStack() as stack:
                if index < len(parts) - 1:
                    for module in self._ddp_modules:
                        stack.enter_context(module.no_sync())
                yield part

    def _resume(self) -> None:
        from slurmddp.job.checkpoint import restore_rng_state

        found = self._from_snapshot() or self._load_intact()
        if found is None:
            return
        info, shared, local = found
        resized = info.world_size != self.store.world_size
        self._check_settings(shared.get("loop"), info, resized)
        self._apply(shared)
        if "rng" in local:
            restore_rng_state(local["rng"])
        self._resumed = info
        self.step = self._saved_step = self.first_step = info.step
        if self.snapshots is not None:
            self.snapshots.kept(info.step)
        if self.rank == 0:
            drop_metrics_from(self.run_dir, info.step)
            kind = "the in-memory snapshot " if self._reload is not None else ""
            print(f"slurmddp: resumed from {kind}{info.path} at step {info.step}", flush=True)
            if resized:
                self._say_resized(info)

    def _from_snapshot(self) -> tuple[CheckpointInfo, dict[str, Any], dict[str, Any]] | None:
        """The newest in-memory snapshot, where one is newer than the newest checkpoint on disk."""
        from slurmddp.job.checkpoint import CheckpointInfo

        if self.snapshots is None or self.snapshots.first_of_allocation:
            # The folder is the allocation's own: its first attempt has nothing to find there.
            return None
        disk = self.store.latest()
        restored = self.snapshots.restore(disk.step if disk is not None else None)
        if restored is None:
            return None
        loaded = restored.loaded
        self._reload = restored.shared
        info = CheckpointInfo(loaded.step, Path(restored.where), loaded.world_size, loaded.taken_at)
        return info, loaded.shared, loaded.locals[self.rank]

    def _load_intact(self) -> tuple[CheckpointInfo, dict[str, Any], dict[str, Any]] | None:
        """The newest checkpoint that every rank loaded, with this rank's (shared, local) state;
        None when there is none. One that any rank found damaged (its files not as their markers
        say, or not loadable) is moved aside by rank 0 and the next older one tried, in this
        attempt: on Slurm, each requeue would otherwise choose it again and fail the same way."""
        from slurmddp.job.train.metrics import every_rank

        skipped: list[str] = []
        info = self.store.latest()
        while info is not None:
            problem = self.store.damage(info)
            shared: dict[str, Any] = {}
            local: dict[str, Any] = {}
            if problem is None:
                try:
                    # Checked just above: the CRCs are not read twice.
                    shared, local = self.store.load(info, verify_checksums=False)
                except CheckpointError as exc:
                    problem = str(exc)
            # Every rank, whatever it found, so that all of them go on with the same checkpoint.
            found = every_rank(problem)
            if not any(found):
                if skipped and self.rank == 0:
                    print(f"slurmddp: loaded {info.path}, the newest intact checkpoint", flush=True)
                return info, shared, local
            why = "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(found) if text)
            skipped.append(f"{info.path.name} ({why})")
            moved = self.store.move_aside(info, why)
            if self.rank == 0:
                where = f"moved to {moved}" if moved is not None else "it could not be moved aside"
                print(f"slurmddp: skipping damaged checkpoint {info.path}: {why}; {where}", flush=True)
            info = self.store.latest(before=info.step)
        if skipped:
            self._end_without_checkpoint(skipped)
        return None

    def _end_without_checkpoint(self, skipped: list[str]) -> None:
        """Every checkpoint was damaged: the run ends here for good, with why. Starting from step 0
        on its own would throw the run's progress away; a requeue would find nothing better."""
        from slurmddp.job.checkpoint import DAMAGED_DIR

        damaged = self.store.root / DAMAGED_DIR
        message = (
            f"no intact checkpoint is left in {self.store.root}: {'; '.join(skipped)}; each was moved "
            f"to {damaged} with its reason. Put an intact checkpoint back into {self.store.root} and "
            "resubmit, or resubmit as it is to train from step 0"
        )
        # Every rank the same record, retry=False: the requeue decision ends the job at once.
        Failure(
            step=None,
            rank=self.rank,
            error=message,
            attempt=self.attempt,
            time=time.time(),
            retry=False,
        ).write(self.run_dir, replace=True)
        raise CheckpointError(message)

    def _say_resized(self, info: CheckpointInfo) -> None:
        data = (
            "the global batch and the order of samples are kept (ctx.loader)"
            if self.data is not None
            else "the data is your own loader's (ctx.loop(data=ctx.loader(...)) keeps the order of samples)"
        )
        fresh = (
            f"; ranks {info.world_size} and up keep the random streams they were seeded with"
            if self.store.world_size > info.world_size
            else ""
        )
        print(
            f"slurmddp: the checkpoint was written by {info.world_size} ranks, this job has "
            f"{self.store.world_size}: model, optimizer and step carry over; {data}{fresh}",
            flush=True,
        )

    def _apply(self, shared: Mapping[str, Any]) -> None:
        for name, obj in self.objects.items():
            if name in shared:
                obj.load_state_dict(shared[name])
            elif obj.state_dict():
                # An object without state (a disabled GradScaler) may be missing from checkpoints
                # written before it was kept; anything else would resume half-restored.
                saved = sorted(set(shared) - {"extra", "loop"})
                raise CheckpointError(
                    f"the checkpoint has no state for {name!r} (it holds {saved}); pass the objects "
                    "the run was started with to ctx.loop"
                )
        self.extra.clear()
        self.extra.update(shared.get("extra", {}))

    def _check_settings(self, saved: Any, info: CheckpointInfo, resized: bool) -> None:
        if saved is None or saved == self.settings:
            return
        # Another number of ranks splits each global batch into other micro-batches: the same
        # training, summed in another order (resubmit adjusts ddp.accumulate to keep the memory).
        loose = {"accumulate"} if resized else set()
        changed = sorted(
            key for key in {*saved, *self.settings} - loose if saved.get(key) != self.settings.get(key)
        )
        if not changed:
            return
        shown = "; ".join(f"{k}: {saved.get(k)} then, {self.settings.get(k)} now" for k in changed)
        raise CheckpointError(
            f"{info.path} was saved with other training settings ({shown}): resuming would not continue "
            "that run; restore them, or start a new run (a new output_dir or a fresh submit)"
        )

    def __iter__(self) -> Iterator[Any]:
        primes = self._primes_needed()
        if not primes:
            # The snapshot a resume came from is needed again only after a priming step.
            self._reload = None
        if self.telemetry is not None:
            self.telemetry.start(self._measured_modules())
        while self.step < self.total_steps:
            if self._watchdog is not None:
                self._watchdog.at(self.step)
            self._boundary()
            began = time.perf_counter()
            batch = self.data.batch(self.step) if self.data is not None else None
            data_s = time.perf_counter() - began
            if primes:
                yield from self._prime(primes, batch)
                primes = 0
                if self.telemetry is not None:
                    self.telemetry.discard()
                began = time.perf_counter() - data_s
            yield self.step if self.data is None else (self.step, batch)
            if self.data is not None:
                self.data.advance()
            self.step += 1
            if self._first_step_at is None:
                self._first_step_at = time.time()
            if self.telemetry is not None:
                self.telemetry.step(data_s, time.perf_counter() - began)
        if self._watchdog is not None:
            self._watchdog.rest()
        if self.snapshots is not None:
            self.snapshots.clear()
        if self.rank == 0:
            self._progress(force=True)
        self._say_skipped(self._settle())
        self._drain()
        if self.telemetry is not None:
            self.telemetry.finish(self.step)

    def _measured_modules(self) -> list[Any]:
        """The DDP modules whose all-reduces telemetry times: those `ctx.ddp` made, and any other
        DistributedDataParallel handed to the loop."""
        from torch.nn.parallel import DistributedDataParallel

        found = {id(m): m for m in self._ddp_modules}
        for obj in self.objects.values():
            if isinstance(obj, DistributedDataParallel):
                found.setdefault(id(obj), obj)
        return list(found.values())

    def _primes_needed(self) -> int:
        """Priming steps a resumed attempt runs: DDP rebuilds its buckets after one backward (two
        with static_graph) unless it looks for unused parameters; one rank has nothing to order."""
        return 0 if self._resumed is None else self._primes_per_resume()

    def _primes_per_resume(self) -> int:
        needed = [
            2 if module.static_graph else 1
            for module in self._ddp_modules
            if module.process_group.size() > 1 and not module.find_unused_parameters
        ]
        return max(needed, default=0)

    def _check_own_sampler(self) -> None:
        """A loader the step iterates itself would hand the priming step one batch and the real
        step the next: refuse that at the start, not at the first resume."""
        from slurmddp.job.train.sampler import ResumableDistributedSampler

        own = [name for name, obj in self.objects.items() if isinstance(obj, ResumableDistributedSampler)]
        if own and self.data is None and self._primes_per_resume():
            raise SlurmddpError(
                f"ctx.loop({own[0]}=...): a resumed attempt runs its first step twice (a priming step "
                "for DDP's buckets), and a loader you iterate in the step would move on by one batch; "
                "give the loader as ctx.loop(data=ctx.loader(...)) and take the batch the loop yields"
            )

    def _prime(self, primes: int, batch: Any) -> Iterator[Any]:
        from slurmddp.job.checkpoint import capture_rng_state, restore_rng_state

        assert self._resumed is not None
        # The RNG as the uninterrupted run had it when its step began: drawing the batch (on the
        # main process, without workers) may have used it.
        rng = capture_rng_state()
        self.priming = True
        try:
            for _ in range(primes):
                # A copy: the step may change its batch in place, and the real step needs it whole.
                yield self.step if self.data is None else (self.step, copy.deepcopy(batch))
        finally:
            self.priming = False
        if self._reload is not None:
            shared = self._reload()
            self._reload = None
        else:
            shared, _ = self.store.load(self._resumed, verify_checksums=False)
        self._apply(shared)
        restore_rng_state(rng)
        for module in self._ddp_modules:
            for param in module.parameters():
                param.grad = None

    def save(self) -> None:
        """Checkpoint the state after `self.step` steps (every rank must call it at the same step).
        A checkpoint that does not fit on the checkpoint directory's filesystem is skipped, with a
        warning on every rank, and training goes on: the next save tries again."""
        self._say_skipped(self._save())

    def _save(self) -> Unsaved | None:
        """Save (async: start saving) the state after `self.step` steps; why not, as every rank
        agrees (None: saved, or being written)."""
        from slurmddp.job.checkpoint import NoSpaceForCheckpoint, capture_rng_state
        from slurmddp.job.train.metrics import first_problem

        if self._saved_step == self.step:
            return None
        started = time.perf_counter()
        self._say_skipped(self._settle())
        # Rank 0 asks before any rank writes, and every rank hears the answer.
        no_room = first_problem(self.store.space_problem())
        if no_room is not None:
            return self.step, no_room
        shared = self._shared_state() if self.rank == 0 else None
        mine = None
        try:
            self.store.save(self.step, shared, {"rng": capture_rng_state()})
        except NoSpaceForCheckpoint as exc:
            mine = str(exc)
        self._unsettled = (self.step, mine)
        if not self.store.async_save:
            unsaved = self._settle()
            if unsaved is not None:
                return unsaved
        self.store.prune()
        self.last_save_s = time.perf_counter() - started
        self._save_total_s += self.last_save_s
        self._saved_at = time.monotonic()
        self._saved_step = self.step
        return None

    def _shared_state(self) -> dict[str, Any]:
        """What every rank holds alike under DDP: the objects' state, the user's extras, the settings."""
        shared = {name: obj.state_dict() for name, obj in self.objects.items()}
        shared["extra"] = dict(self.extra)
        shared["loop"] = dict(self.settings)
        return shared

    def _settle(self) -> Unsaved | None:
        """Wait for this rank's save in flight and agree with every rank on how it went: its step
        and the first problem a rank had (rank 0 then removes what the ranks wrote of it), or None."""
        from slurmddp.job.checkpoint import NoSpaceForCheckpoint
        from slurmddp.job.train.metrics import first_problem

        if self._unsettled is None:
            return None
        step, mine = self._unsettled
        self._unsettled = None
        try:
            self.store.wait()
        except NoSpaceForCheckpoint as exc:
            mine = str(exc)
        problem = first_problem(mine)
        if problem is None:
            return None
        self.store.discard(step)
        return step, problem

    def _say_skipped(self, unsaved: Unsaved | None) -> None:
        """Warn of a checkpoint not saved; rank 0 also counts it in the run directory, so that
        `status` and `submit --wait`'s ending block say so after the log has scrolled away."""
        if unsaved is not None:
            step, problem = unsaved
            print(
                f"slurmddp: warning: rank {self.rank}: the checkpoint at step {step} was not saved: "
                f"{problem}; training goes on, the next checkpoint tries again",
                flush=True,
            )
            if self.rank == 0:
                # The run directory may sit on the very disk that is full: the warning above stays
                # in the log, and training goes on.
                with contextlib.suppress(OSError):
                    SkippedSaves.add(self.run_dir, step, problem, self.attempt, time.time())

    def _boundary(self) -> None:
        import torch.distributed as tdist

        stop, timed_save, record, snapshot, replace, pruned = self._agreed()
        if self.snapshots is not None:
            self.snapshots.settle()
        if self.rank == 0:
            self._progress()
        if pruned:
            self._end_pruned()
        if stop:
            unsaved = self._save() or self._settle()
            if unsaved is not None:
                self._end_without_stop_checkpoint(unsaved[1])
            # Every rank's files are durable past this point, so rank 0 may requeue (which ends
            # the job at once) as soon as it is out of the loop.
            tdist.barrier()
            self._record_stop(stop)
            if self.snapshots is not None:
                self.snapshots.clear()
            raise StopForRequeue(self.step, stop)
        if timed_save or (self.every_steps and self.step % self.every_steps == 0 and self.step > 0):
            self.save()
            if self.snapshots is not None:
                self.snapshots.kept(self.step)
            if replace:
                self._end_for_replacement()
        elif snapshot and self.snapshots is not None:
            self._snapshot(self.snapshots)
        if record and self.telemetry is not None:
            self.telemetry.exchange(self.step)
        self._flags[0] = signals.received() or 0
        self._flags[1] = int(
            self.rank == 0 and self.every_s > 0 and time.monotonic() - self._saved_at >= self.every_s
        )
        self._flags[2] = int(self.rank == 0 and self.telemetry is not None and self.telemetry.due())
        snapshots = self.snapshots
        # Since the last boundary: an epoch's end (its validation), or the next epoch's first step.
        paused = self.data is not None and self.step % self.data.steps_per_epoch in (0, 1)
        self._flags[3] = int(
            self.rank == 0
            and snapshots is not None
            and snapshots.due_after(self.step, self.first_step, paused)
        )
        self._flags[4] = int(snapshots is not None and snapshots.busy())
        self._flags[5] = int(self._slow_to_replace is not None and self._slow_to_replace() is not None)
        self._flags[6] = int(self._pruned is not None and self._pruned())
        self._pending = tdist.all_reduce(self._flags, op=tdist.ReduceOp.MAX, async_op=True)

    def _agreed(self) -> tuple[int, bool, bool, bool, bool, bool]:
        """The flags every rank reported at the previous boundary: a stop, a timed checkpoint, a
        telemetry record, an in-memory snapshot (due, and no node still writing the last), a
        slow node to replace, and a pruned trial."""
        if self._pending is None:
            return 0, False, False, False, False, False
        self._pending.wait()
        self._pending = None
        stop, timed_save, record, snapshot, writing, replace, pruned = self._flags.tolist()
        due = bool(snapshot) and not writing
        return int(stop), bool(timed_save), bool(record), due, bool(replace), bool(pruned)

    def _end_pruned(self) -> None:
        """The pruner stopped the trial: every rank ends here, rank 0's trial record saying so
        first, for the batch script's decision (final, not requeued) and `status`."""
        import torch.distributed as tdist

        if self.rank == 0:
            record = TrialRecord.read(self.run_dir)
            if record is not None:
                record.ended("pruned", step=self.step).write(self.run_dir)
            self._progress(force=True)
        if self.snapshots is not None:
            self.snapshots.clear()
        tdist.barrier()
        raise TrialPruned(self.step)

    def _end_for_replacement(self) -> None:
        """A slow node is to be replaced and this step's checkpoint is saved: end the attempt on
        every rank, with rank 0's record naming the node, so that the batch script restarts the
        ranks on a spare from this checkpoint (job/allocation/requeue.py, restart_on_spare). A
        checkpoint not saved (no room) waits for the next."""
        import torch.distributed as tdist

        unsaved = self._settle()
        if unsaved is not None or self._saved_step != self.step:
            self._say_skipped(unsaved)
            return
        slow = self._slow_to_replace() if self._slow_to_replace is not None else None
        named = "; ".join(f"{host}: {why}" for host, why in (slow or {}).items()) or "see rank 0's log"
        if slow is not None:
            # Before the barrier: the attempt's first failure record stands (Failure.write), and
            # the other ranks' ends below write theirs only after it.
            Failure(
                step=self.step,
                rank=self.rank,
                error=f"slow node replaced at step {self.step}: {named}",
                attempt=self.attempt,
                time=time.time(),
                suspect_hosts=slow,
            ).write(self.run_dir)
        tdist.barrier()
        raise SlowNodeReplaced(
            f"the ranks end after the checkpoint at step {self.step} to replace a slow node ({named}); "
            "the job restarts them on a spare from there"
        )

    def _snapshot(self, snapshots: Snapshots) -> None:
        from slurmddp.job.checkpoint import capture_rng_state

        snapshots.take(self.step, self._shared_state, {"rng": capture_rng_state()})

    def _drain(self) -> None:
        # The last boundary's all-reduce must finish before the process group goes away.
        if self._pending is not None:
            self._pending.wait()
            self._pending = None

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._progress_at >= PROGRESS_EVERY_S:
            self._progress_at = now
            position = LoopProgress(
                total_steps=self.total_steps,
                epoch=self.epoch,
                epochs=self.epochs,
                last_save_s=round(self.last_save_s, 3),
                global_batch=self.settings.get("global_batch"),
            )
            Progress(
                self.step,
                self.attempt,
                time.time(),
                position,
                started_step=self.first_step,
                first_step_at=self._first_step_at,
                save_s=self._save_total_s,
            ).write(self.run_dir)

    def _end_without_stop_checkpoint(self, problem: str) -> None:
        """The checkpoint for a stop did not fit: the attempt ends as a failure with why, and the
        requeued job resumes from the newest checkpoint there is."""
        message = f"{problem} (the checkpoint for the stop at step {self.step} was not saved)"
        # Every rank the same record, so that whichever rank srun's end leaves last does not matter;
        # the cause is what the requeue decision, and so `status`, names the failure by.
        Failure(
            step=self.step,
            rank=self.rank,
            error=message,
            attempt=self.attempt,
            time=time.time(),
            cause=problem,
        ).write(self.run_dir, replace=True)
        raise CheckpointError(message)

    def _record_stop(self, signum: int) -> None:
        if self.rank == 0:
            Stop(
                step=self.step,
                signal=signals.name(signum),
                signal_at=signals.received_at(),
                attempt=self.attempt,
                time=time.time(),
                save_s=round(self.last_save_s, 3),
            ).write(self.run_dir)
