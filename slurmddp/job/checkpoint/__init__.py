"""Checkpoints that are either complete or ignored: per-rank files, completion markers, keep-last-K.

Layout of one checkpoint (ROOT/step-00001234/):
    shared.pt          rank 0: model / optimizer / scheduler / scaler / sampler / user extras
    rank-00003.pt      every rank: its own state (RNG streams, ...)
    meta.json          rank 0: step, world size, time, attempt id
    rank-00003.done    every rank, LAST: the size and CRC32 of each file it wrote, and its attempt id

Each file is written as temp + fsync + rename, and the directory is fsync'ed before the marker is
written, so a marker never becomes durable before the files it vouches for. A checkpoint counts only
when meta.json and the markers of all its ranks exist, every marker names the same attempt as
meta.json, and every file has the size its marker recorded. A SIGKILL at any moment therefore leaves
either a complete checkpoint or one that `latest()` skips.

No rank talks to another here (the training loop owns the collectives, and an async save must
finish without any). Ranks agree without talking through the attempt id: every rank of one attempt
derives the same id from the environment (Slurm job id + restart count), and no other attempt has
it. When a step directory left by an earlier attempt is written again, each rank first removes its
own old marker, and rank 0 rewrites meta.json before its own marker, so files of two attempts never
add up to a "complete" checkpoint.

A checkpoint that latest() chose but a rank then finds damaged at load (a CRC32 that does not match
its marker, a file torch cannot read) is moved by rank 0 into ROOT/damaged/step-00001234/, with a
reason.txt naming the rank and the problem (move_aside), and the training loop (job/train/loop.py), after
every rank has said what it found, loads the next older one. Nothing under damaged/ is read or
deleted by the store: latest() and prune() look only at ROOT/step-* directories.

Before a save, space_problem() compares the free bytes of the directory's filesystem with what the
newest complete checkpoint takes; a save that meets ENOSPC anyway raises NoSpaceForCheckpoint (the
OSError, not the RuntimeError torch.save turns it into), and discard() lets rank 0 remove what the
ranks left of that step once all of them are done with it.

Files are read back with torch.load(weights_only=True): loading a checkpoint must not run code from
a shared file system, and must not depend on the user's classes being importable. save() checks up
front that the state holds only what that loader accepts, so an unloadable checkpoint fails at its
first save instead of at resume; `capture_rng_state()` gives RNG states in such types.

Modules: store (CheckpointStore: save, latest, load, move_aside, space_problem, discard, prune,
wait), integrity (file names, meta.json's checks, the store's reading of the completeness rule),
completeness (the one rule for when a checkpoint counts as complete, for the store's checkpoints and
every framework integration's), io (checksummed atomic writes), snapshot (what may be saved, CPU
copies for async saves), space (free bytes, a checkpoint's size, the error of one that does not
fit), rng (RNG state in loadable types). Imports among them go one way only: store uses integrity,
completeness, io, snapshot and space; integrity uses completeness; completeness uses io; io,
snapshot, space and rng use none of them; none imports this package.
"""

from __future__ import annotations

from slurmddp.errors import CheckpointError
from slurmddp.job.checkpoint.integrity import (
    FORMAT,
    META_FILE,
    SHARED_FILE,
    STEP_DIR_RE,
    marker_name,
    rank_file_name,
    step_dir_name,
)
from slurmddp.job.checkpoint.io import write_stream_atomic
from slurmddp.job.checkpoint.rng import capture_rng_state, restore_rng_state
from slurmddp.job.checkpoint.space import NoSpaceForCheckpoint
from slurmddp.job.checkpoint.store import (
    DAMAGED_DIR,
    REASON_FILE,
    CheckpointInfo,
    CheckpointStore,
    default_attempt_id,
)

__all__ = [
    "DAMAGED_DIR",
    "FORMAT",
    "META_FILE",
    "REASON_FILE",
    "SHARED_FILE",
    "STEP_DIR_RE",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStore",
    "NoSpaceForCheckpoint",
    "capture_rng_state",
    "default_attempt_id",
    "marker_name",
    "rank_file_name",
    "restore_rng_state",
    "step_dir_name",
    "write_stream_atomic",
]
