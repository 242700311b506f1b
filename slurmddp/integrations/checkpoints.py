"""Checkpoints of a plain torchrun loop, in slurmddp's own format (job/checkpoint/): saved at the
same step on every rank, complete only once every rank's part is durable, and the newest complete
one found again on the next attempt.

    state = checkpoints.resume(CKPT_DIR)   # None on a first attempt; else what save() was given
    ...
    if slurmddp.should_stop():
        checkpoints.save(CKPT_DIR, step, {"model": ..., "optimizer": ..., "step": step})
        slurmddp.exit_for_requeue()

Rank 0 writes the shared state, every rank its RNG streams (torch's, CUDA's, Python's and numpy's,
so dropout and augmentations draw after a resume what they would have drawn), each file behind a
checksummed completion marker. A checkpoint cut short, or one whose files do not match their
markers, is skipped (a damaged one moved aside by rank 0) and the next older one loaded. The state
is read back with `torch.load(weights_only=True)`: state dicts, tensors, numbers and strings.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from slurmddp.experiment.schema import Checkpoint
from slurmddp.job.checkpoint import CheckpointStore, capture_rng_state, restore_rng_state
from slurmddp.job.script import scriptrun


def save(directory: str | os.PathLike[str], step: int, state: dict[str, Any], keep: int = 2) -> None:
    """Save `state` (rank 0's copy counts) and every rank's RNG streams as the checkpoint of `step`.
    Call it on every rank at the same step; it returns once the checkpoint is complete and durable
    on every rank. Complete checkpoints beyond the newest `keep` are removed."""
    import torch.distributed as dist

    store = _store(directory, keep)
    store.save(step, state if store.rank == 0 else None, {"rng": capture_rng_state()})
    if dist.is_initialized():
        dist.barrier()
    store.prune()


def resume(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The state of the newest complete checkpoint under `directory`, with this rank's RNG streams
    put back as they were at its save (so call it last before the loop, once the model and the
    loaders are built), or None when there is none. Tensors load onto the CPU; `load_state_dict`
    copies them where the model lives."""
    import torch.distributed as dist

    store = _store(directory, keep=1)
    info = store.latest()
    while info is not None:
        problems = [store.damage(info)]
        if dist.is_initialized():
            # Every rank checked its own file: all load this checkpoint, or all the next older.
            problems = [None] * dist.get_world_size()
            dist.all_gather_object(problems, store.damage(info))
        problem = next((found for found in problems if found is not None), None)
        if problem is None:
            shared, local = store.load(info, verify_checksums=False)
            if "rng" in local:
                restore_rng_state(local["rng"])
            # Where this attempt starts: `status` and goodput count its steps from here.
            scriptrun.anchor(info.step, recorded=True)
            return shared
        print(f"slurmddp: skipping checkpoint {info.path}: {problem}", file=sys.stderr, flush=True)
        store.move_aside(info, problem)
        info = store.latest(before=info.step)
    return None


def _store(directory: str | os.PathLike[str], keep: int) -> CheckpointStore:
    import torch.distributed as dist

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    return CheckpointStore(Path(directory), rank, world, Checkpoint(keep_last=keep))
