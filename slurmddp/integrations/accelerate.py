"""Preemption-safe training for a script written as HF accelerate's docs teach: one line to set up,
one call per step.

    from slurmddp.integrations.accelerate import Resumable

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    model, optimizer, train_dataloader, scheduler = accelerator.prepare(...)
    run = Resumable(accelerator, train_dataloader)    # loads the newest complete state
    for epoch in run.epochs(num_epochs):              # was range(num_epochs)
        for batch in run.batches():                   # was train_dataloader
            with accelerator.accumulate(model):
                ...
            run.after_step()                          # saves and requeues on a stop

What it does, in accelerate's own terms:
- `Resumable(...)` finds the newest *complete* state directory under its folder (default
  `$SLURMDDP_RUN_DIR/accelerate`), every rank `load_state`s it, and sets `run.epoch`, `run.batch`
  (batches of that epoch already trained) and `run.global_step` (optimizer steps done).
- `run.batches()` calls the loader's `set_epoch(epoch)` (the seedable sampler's order is a function
  of its seed and the epoch alone) and, in the epoch a resume lands in, hands out
  `accelerator.skip_first_batches(loader, run.batch)`, so the data continue where they stopped.
- `run.after_step()`, at each real optimizer step (`accelerator.sync_gradients`), asks
  `slurmddp.should_stop()` on every rank; when it says so every rank calls `save_state` (accelerate
  requires it of all), the state is made durable and complete, and `slurmddp.exit_for_requeue()`
  ends the attempt. The next attempt runs the script again and resumes at the next step.

Complete: a state directory `step-NNNNNNNN/` counts once `slurmddp-complete.json` is in it. Each
rank, after its `save_state` returned, writes its own `slurmddp-rank-R.pt` (where the run stands,
its random streams) and fsyncs every file it wrote; after a barrier rank 0 writes the marker
(temp file, fsync, rename) listing every file of the directory with its size. A directory without
the marker, or whose files are missing or of another size than listed, is skipped with a warning;
one that every rank finds but some rank cannot load is moved to `damaged/` and the next older one
is loaded in the same attempt.

Exactness: see docs/frameworks/accelerate.md. The random streams are this module's own, per rank,
put back after `load_state` and again after the resumed epoch's iterator was made (making a
DataLoader iterator draws from the global torch generator, which a run that never stopped did at
the start of the epoch, not in its middle). DDP's bucket rebuild after its first step changes the
order in which ranks' gradients are summed; that is not this module's concern: slurmddp builds a
resumed attempt's DDP in the layout the first attempt's rebuilt to, in every script's process
(`ddp.resume_buckets`, job/script/ddp_buckets.py), so the first step after a resume sums as the
uninterrupted run did (outside slurmddp, or with it off, it sums in another order).

Accelerate is never imported here: the accelerator and its loader are used through their public
methods, so `import slurmddp` stays light and this module type-checks without accelerate's stubs.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmddp import files
from slurmddp.errors import CheckpointError
from slurmddp.integrations.shims import accelerate as internals
from slurmddp.job.checkpoint import completeness
from slurmddp.job.checkpoint.completeness import UNCHECKED, Kind, Marker, Wording
from slurmddp.job.checkpoint.integrity import step_dir_name, step_dirs
from slurmddp.job.checkpoint.rng import capture_rng_state, restore_rng_state
from slurmddp.job.process import stop

MARKER = "slurmddp-complete.json"
"""Written by rank 0 last, once every rank's save_state returned and its files are durable."""
RANK_FILE = "slurmddp-rank-{rank:05d}.pt"
DAMAGED = "damaged"
FOLDER = "accelerate"
"""The default folder under `$SLURMDDP_RUN_DIR`."""
_NO_MARKER = "no completion marker (the save did not finish)"
KIND = Kind(
    Wording(
        missing=_NO_MARKER,
        unreadable=_NO_MARKER,
        malformed=f"its {MARKER} is not one slurmddp wrote",
        unlisted="{unlisted} is not listed",
        changed="{problem}",
    ),
    bare_sizes=True,
    every_listed=True,
)
"""How a state directory reads the one completeness rule (job/checkpoint/completeness.py): rank
0's one marker, written once every rank's files are durable, stands for every rank's, names no
attempt, records every file of the directory by its size alone, and must list each rank's file."""


@dataclass(frozen=True)
class Position:
    """Where a run stands at an optimizer-step boundary."""

    step: int
    """Optimizer steps done."""
    epoch: int
    batch: int
    """Batches (micro-batches under gradient accumulation) of `epoch` already trained."""


@dataclass(frozen=True)
class Candidate:
    path: Path
    position: Position
    num_processes: int


def state_dir(folder: Path, step: int) -> Path:
    return folder / step_dir_name(step)


def check_complete(path: Path) -> Candidate | str:
    """`path` as a complete state directory, or why it is not one."""
    marker = files.read_json_object(path / MARKER)
    if marker is None:
        return _NO_MARKER
    try:
        position = Position(int(marker["step"]), int(marker["epoch"]), int(marker["batch"]))
        num_processes = int(marker["num_processes"])
    except (KeyError, TypeError, ValueError):
        return KIND.wording.malformed
    ranks = tuple(RANK_FILE.format(rank=rank) for rank in range(num_processes))
    problems = completeness.problems(path, KIND, [Marker(MARKER, lists=ranks)], attempt=UNCHECKED)
    return Candidate(path, position, num_processes) if not problems else problems[0]


def complete_states(folder: Path) -> tuple[list[Candidate], list[str]]:
    """The complete state directories under `folder`, newest first, and a warning for each
    directory skipped."""
    candidates: list[Candidate] = []
    skipped: list[str] = []
    for _, path in step_dirs(folder):
        checked = check_complete(path)
        if isinstance(checked, Candidate):
            candidates.append(checked)
        else:
            skipped.append(f"skipping {path}: {checked}")
    return candidates, skipped


def newest_complete(folder: Path) -> Candidate | None:
    """The newest complete state directory under `folder`."""
    candidates, _ = complete_states(folder)
    return candidates[0] if candidates else None


def _say(text: str) -> None:
    print(f"slurmddp: {text}", file=sys.stderr, flush=True)


def _fsync_files(path: Path) -> None:
    """Make what this process wrote under `path` durable. A rank cannot tell which files
    accelerate's save_state wrote on it (rank 0 the weights, every rank its random states), so it
    fsyncs all: on a local disk or NFS, an fsync of a file another client wrote costs nothing."""
    for entry in sorted(path.iterdir()):
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    files.fsync_dir(path)


class Resumable:
    """Save-at-stop and resume-from-newest for an accelerate training loop (module docstring).

    `accelerator`: the Accelerator the model, optimizer and loader were prepared with.
    `dataloader`: the prepared training loader.
    `folder`: where state directories go; default `$SLURMDDP_RUN_DIR/accelerate` (`./accelerate`
    outside a slurmddp job).
    `every_steps`: also save every N optimizer steps (0: only at a stop); a crash then resumes
    from the newest of them.
    `keep_last`: complete state directories kept (older ones are removed after each save).
    """

    def __init__(
        self,
        accelerator: Any,
        dataloader: Any,
        *,
        folder: str | os.PathLike[str] | None = None,
        every_steps: int = 0,
        keep_last: int = 2,
    ) -> None:
        if every_steps < 0 or keep_last < 1:
            raise ValueError(f"every_steps must be >= 0 and keep_last >= 1 (got {every_steps}, {keep_last})")
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size > 1 and accelerator.num_processes != world_size:
            raise CheckpointError(
                f"WORLD_SIZE is {world_size} but the Accelerator has {accelerator.num_processes} "
                "process(es): "
                "every rank would train alone and save over the others. Without a GPU, create it with "
                "Accelerator(cpu=True) (or set ACCELERATE_USE_CPU=1)"
            )
        self.accelerator = accelerator
        self.dataloader = dataloader
        if folder is None:
            folder = Path(os.environ.get("SLURMDDP_RUN_DIR", ".")) / FOLDER
        self.folder = Path(folder)
        self.every_steps = every_steps
        self.keep_last = keep_last
        self.global_step = 0
        self.epoch = 0
        self.batch = 0
        self.resumed_from: Path | None = None
        self._rng: dict[str, Any] | None = None
        self._data_seed = _data_seed(dataloader)
        self._resume()

    # --- the loop -------------------------------------------------------------------------------

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """The epochs left, from the one a resume lands in."""
        while self.epoch < num_epochs:
            epoch = self.epoch
            yield epoch
            if self.epoch == epoch:
                # The loop left batches() early (a break): the epoch still ends here.
                self.epoch, self.batch = epoch + 1, 0

    def batches(self) -> Iterator[Any]:
        """The training loader's batches of the current epoch, from where a resume left them."""
        epoch, skip = self.epoch, self.batch
        if hasattr(self.dataloader, "set_epoch"):
            self.dataloader.set_epoch(epoch)
        loader = self.accelerator.skip_first_batches(self.dataloader, skip) if skip else self.dataloader
        # Making the iterator drew from the global generator (DataLoader's base seed); the run that
        # never stopped did so at the start of the epoch, before the state it saved.
        restore, self._rng = (self._rng if skip else None), None
        for batch in loader:
            if restore is not None:
                restore_rng_state(restore)
                restore = None
            self.batch += 1
            yield batch
        if restore is not None:
            restore_rng_state(restore)
        if self.epoch == epoch:
            self.epoch, self.batch = epoch + 1, 0

    def after_step(self) -> None:
        """Call after every optimizer step (or every batch under `accumulate`: only the real steps,
        `accelerator.sync_gradients`, count), on every rank. Saves at a stop and ends the attempt
        for a requeue; saves every `every_steps` steps when asked."""
        if not self.accelerator.sync_gradients:
            return
        self.global_step += 1
        stopping = stop.should_stop()
        if stopping or (self.every_steps and self.global_step % self.every_steps == 0):
            self.save()
        if stopping:
            if self.accelerator.is_main_process:
                saved = state_dir(self.folder, self.global_step)
                _say(f"saved {saved} at step {self.global_step} for the stop")
            stop.exit_for_requeue()

    @property
    def position(self) -> Position:
        return Position(self.global_step, self.epoch, self.batch)

    # --- saving ---------------------------------------------------------------------------------

    def save(self) -> Path:
        """Save the state at this step boundary on every rank (all must call it) and mark it
        complete once every rank's files are durable."""

        accelerator = self.accelerator
        path = state_dir(self.folder, self.global_step)
        position = self.position
        if accelerator.is_main_process:
            # A save of this step from an earlier attempt that did not finish (or one to redo).
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        accelerator.wait_for_everyone()
        config: Any = getattr(accelerator, "project_configuration", None)
        automatic = bool(getattr(config, "automatic_checkpoint_naming", False))
        try:
            if automatic:
                # Its own naming would ignore output_dir; this directory is what resume looks for.
                config.automatic_checkpoint_naming = False
            accelerator.save_state(str(path))
        finally:
            if automatic:
                config.automatic_checkpoint_naming = True
        self._save_own(path, position)
        _fsync_files(path)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            listing = {
                entry.name: entry.stat().st_size for entry in sorted(path.iterdir()) if entry.is_file()
            }
            files.write_json(
                path / MARKER,
                {
                    "step": position.step,
                    "epoch": position.epoch,
                    "batch": position.batch,
                    "num_processes": accelerator.num_processes,
                    "data_seed": self._data_seed,
                    "files": listing,
                },
            )
            self._prune()
        return path

    def _save_own(self, path: Path, position: Position) -> None:
        """This rank's `slurmddp-rank-R.pt`: where the run stands and its random streams."""
        import torch

        own = {
            "position": [position.step, position.epoch, position.batch],
            "accumulation_step": internals.accumulation_step(self.accelerator),
            "rng": capture_rng_state(),
        }
        rank_file = path / RANK_FILE.format(rank=self.accelerator.process_index)
        temporary = rank_file.with_name(f".{rank_file.name}.tmp")
        torch.save(own, temporary)
        os.replace(temporary, rank_file)

    def _prune(self) -> None:
        """Remove complete state directories beyond `keep_last`, and the unfinished saves older
        than the one just made (an attempt cut short in its save left them; none is read again)."""
        candidates, _ = complete_states(self.folder)
        for old in candidates[self.keep_last :]:
            shutil.rmtree(old.path, ignore_errors=True)
        kept = {candidate.path for candidate in candidates}
        for step, path in step_dirs(self.folder):
            if step < self.global_step and path not in kept:
                shutil.rmtree(path, ignore_errors=True)

    # --- resuming -------------------------------------------------------------------------------

    def _resume(self) -> None:
        accelerator = self.accelerator
        names: list[str] = []
        if accelerator.is_main_process:
            candidates, skipped = complete_states(self.folder)
            for warning in skipped:
                _say(f"warning: {warning}")
            names = [candidate.path.name for candidate in candidates]
        names = _broadcast(names)
        for name in names:
            checked = check_complete(self.folder / name)
            if not isinstance(checked, Candidate):
                # Another node's view of the folder: what rank 0 found complete is not here.
                error: str | None = f"rank {accelerator.process_index}: {checked}"
            else:
                error = self._load(checked)
            errors = [e for e in _gather(error) if e is not None]
            if not errors:
                return
            if accelerator.is_main_process:
                damaged = self.folder / DAMAGED / name
                damaged.parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(damaged, ignore_errors=True)
                os.replace(self.folder / name, damaged)
                (damaged / "reason.txt").write_text("\n".join(errors) + "\n")
                _say(f"skipping damaged state {self.folder / name}: {'; '.join(errors)}; moved to {damaged}")
            accelerator.wait_for_everyone()
        if names:
            raise CheckpointError(f"no intact state is left in {self.folder}")

    def _load(self, candidate: Candidate) -> str | None:
        """Load `candidate` on this rank; why it could not, or None."""
        import torch

        accelerator = self.accelerator
        if candidate.num_processes != accelerator.num_processes:
            raise CheckpointError(
                f"{candidate.path} was saved by {candidate.num_processes} processes, this run has "
                f"{accelerator.num_processes}: the batches each epoch is cut into differ, so the run "
                "cannot continue where it stopped; run with the same number of processes"
            )
        marker = files.read_json_object(candidate.path / MARKER) or {}
        if marker.get("data_seed") != self._data_seed:
            raise CheckpointError(
                f"{candidate.path} was saved with the data seed {marker.get('data_seed')}, the loader now "
                f"has {self._data_seed}: the data order would differ. Call accelerate.utils.set_seed(SEED) "
                "before prepare() (or pass DataLoaderConfiguration(data_seed=SEED))"
            )
        try:
            accelerator.load_state(str(candidate.path))
            own = torch.load(
                candidate.path / RANK_FILE.format(rank=accelerator.process_index), weights_only=True
            )
            restore_rng_state(own["rng"])
        except Exception as exc:  # any failure to read the state is what is reported
            return f"rank {accelerator.process_index}: {type(exc).__name__}: {exc}"
        internals.set_accumulation_step(accelerator, int(own["accumulation_step"]))
        self._rng = own["rng"]
        step, epoch, batch = (int(value) for value in own["position"])
        self.global_step = step
        try:
            per_epoch = len(self.dataloader)
        except TypeError:
            per_epoch = None
        if per_epoch is not None and batch >= per_epoch:
            epoch, batch = epoch + 1, 0
        self.epoch, self.batch = epoch, batch
        self.resumed_from = candidate.path
        if accelerator.is_main_process:
            _say(f"resumed from {candidate.path} at step {step} (epoch {epoch}, batch {batch})")
        return None


def _data_seed(dataloader: Any) -> int | None:
    """The seed of the loader's seedable sampler; refuses a shuffling sampler whose order a resume
    cannot reproduce."""
    sampler = internals.loader_sampler(dataloader)
    seed = internals.sampler_seed(sampler)
    if seed is not None:
        return seed
    from torch.utils.data import RandomSampler

    if isinstance(sampler, RandomSampler):
        raise CheckpointError(
            "the training loader shuffles with a sampler whose order a resume cannot reproduce: create "
            "the Accelerator with dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True)"
        )
    return None


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _broadcast(names: list[str]) -> list[str]:
    """Rank 0's list on every rank."""
    if not _distributed():
        return names
    import torch.distributed as dist

    box: list[Any] = [names]
    dist.broadcast_object_list(box, src=0)
    return list(box[0])


def _gather(error: str | None) -> list[str | None]:
    if not _distributed():
        return [error]
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, error)
    return list(every)
