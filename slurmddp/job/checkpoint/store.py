"""The CheckpointStore: saving (sync, or async on a background thread), finding the newest complete
checkpoint, loading it, pruning old ones, and waiting for a pending save.

The layout of one checkpoint and the rules for when it counts as complete are explained in the
package docstring (slurmddp/job/checkpoint/__init__.py); the checks themselves live in integrity.py.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from slurmddp.errors import CheckpointError
from slurmddp.experiment.schema import Checkpoint
from slurmddp.files import fsync_dir, write_atomic, write_json
from slurmddp.job.checkpoint.completeness import file_problem, newest_complete
from slurmddp.job.checkpoint.integrity import (
    FORMAT,
    META_FILE,
    SHARED_FILE,
    checkpoint_problems,
    marker_name,
    rank_file_name,
    rank_part_problems,
    read_json,
    step_dir_name,
    step_dirs,
)
from slurmddp.job.checkpoint.io import write_stream_atomic
from slurmddp.job.checkpoint.snapshot import PendingSave, Snapshot, prepare
from slurmddp.job.checkpoint.space import NoSpaceForCheckpoint, bytes_on_disk, free_bytes, no_space
from slurmddp.rundir.records import in_job_restart

if TYPE_CHECKING:
    import torch

# The package's logger, as before the split into modules.
log = logging.getLogger("slurmddp.job.checkpoint")

_DELETING_PREFIX = ".deleting-"
DAMAGED_DIR = "damaged"
"""Where checkpoints found damaged at load are moved (ROOT/damaged/step-NNNNNNNN/)."""
REASON_FILE = "reason.txt"
"""In a damaged checkpoint's directory: which rank found what."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint on disk."""

    step: int
    path: Path
    world_size: int
    written_at: float
    """Unix time at which rank 0 wrote meta.json."""


def default_attempt_id(env: Mapping[str, str]) -> str | None:
    """An id that all ranks of one attempt derive alike and that no other attempt has, or None."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job:
        # SLURM_RESTART_COUNT is absent on the first run and counts requeues after it; the batch
        # script counts the restarts inside one allocation.
        in_job = in_job_restart(env)
        return f"slurm-{job}.{env.get('SLURM_RESTART_COUNT') or 0}" + (f".{in_job}" if in_job else "")
    local = env.get("SUBMITIT_LOCAL_JOB_ID")
    if local:
        return f"local-{local}"
    run = env.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":
        return f"elastic-{run}.{env.get('TORCHELASTIC_RESTART_COUNT') or 0}"
    return None


class CheckpointStore:
    """One rank's view of a checkpoint directory shared by all ranks of a job."""

    def __init__(
        self,
        root: Path,
        rank: int,
        world_size: int,
        settings: Checkpoint | None = None,
        *,
        attempt: str | None = None,
        reuse_snapshot_buffers: bool = True,
    ) -> None:
        """`settings`: the experiment's `checkpoint:` section (keep_last, async_save; checked by
        the schema); None: its defaults. `attempt`: see default_attempt_id(); pass one when the
        environment has none. `reuse_snapshot_buffers` (async only): keep the CPU copy of the last
        save to copy the next one into, instead of allocating it again (saves ~half of the time
        save() blocks, costs one state's worth of resident host memory between saves)."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise CheckpointError(f"rank {rank} is not a rank of a job of {world_size} ranks")
        settings = settings if settings is not None else Checkpoint()
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.keep_last = settings.keep_last
        self.async_save = settings.async_save
        self.reuse_snapshot_buffers = reuse_snapshot_buffers
        found = attempt if attempt is not None else default_attempt_id(os.environ)
        self.attempt = found or ""
        # Only a writer needs the id; a store that only reads says nothing.
        self._warn_no_attempt = found is None and world_size > 1
        self._pending: PendingSave | None = None
        self._spare: dict[str, torch.Tensor] = {}

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, shared: Mapping[str, Any] | None, local: Mapping[str, Any]) -> None:
        """Save checkpoint `step`. `shared` (model/optimizer/scheduler/scaler/sampler/user extras:
        nested state dicts) is given by rank 0 only (None elsewhere; ignored if given elsewhere);
        `local` (this rank's RNG states etc.) by every rank. Sync mode: returns once this rank's
        files are durable. Async mode: first waits for this rank's previous pending save, snapshots
        every tensor to CPU memory (so training may modify the originals right after return), and
        returns; a background thread writes.

        If a complete checkpoint already exists at `step` from another attempt (of any number of
        ranks), it is kept and this save writes nothing: replacing it would leave no complete
        checkpoint at that step while the new files are written.

        A full filesystem raises NoSpaceForCheckpoint (sync: here; async: from wait()); what the
        ranks wrote of the step stays, incomplete, until rank 0's discard().
        """
        if type(step) is not int or step < 0:
            raise CheckpointError(f"step must be an int >= 0, got {step!r}")
        if self.rank == 0 and shared is None:
            raise CheckpointError("rank 0 must pass the shared state (model, optimizer, ...)")
        if self._warn_no_attempt:
            self._warn_no_attempt = False
            log.warning(
                "no attempt id (no SLURM_JOB_ID, SUBMITIT_LOCAL_JOB_ID or TORCHELASTIC_RUN_ID): "
                "if two attempts die saving the same step, their files could be taken for one "
                "checkpoint; pass CheckpointStore(attempt=...)"
            )
        if not self.async_save:
            # dict(): torch.save of the top level must not depend on which Mapping the caller used.
            mine = prepare(dict(shared), "shared", None) if shared is not None and self.rank == 0 else None
            self._write(step, mine, prepare(dict(local), "local", None))
            return
        self.wait()
        snapshot = Snapshot(dict(self._spare))
        mine = prepare(dict(shared), "shared", snapshot) if shared is not None and self.rank == 0 else None
        theirs = prepare(dict(local), "local", snapshot)
        self._spare = {}
        pending = PendingSave(step, snapshot.taken)
        pending.thread = threading.Thread(
            target=self._write_in_background,
            args=(pending, mine, theirs),
            name=f"slurmddp-checkpoint-rank{self.rank}",
            # Not a daemon: a save still running when the main thread ends is finished, not cut.
            daemon=False,
        )
        self._pending = pending
        pending.thread.start()

    def wait(self) -> None:
        """Block until this rank's pending async save is durable (re-raise its error). Must be
        called before the process exits; safe to call when nothing is pending."""
        pending = self._pending
        if pending is None:
            return
        assert pending.thread is not None
        pending.thread.join()
        self._pending = None
        if pending.error is not None:
            raise pending.error
        if self.reuse_snapshot_buffers:
            self._spare = pending.buffers

    def _write_in_background(self, pending: PendingSave, shared: Any, local: Any) -> None:
        try:
            self._write(pending.step, shared, local)
        except BaseException as exc:
            pending.error = exc

    def _write(self, step: int, shared: Any, local: Any) -> None:
        path = self.root / step_dir_name(step)
        try:
            self._write_files(step, path, shared, local)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                # This rank's temp file is gone already; the rest of the step is removed by
                # discard(), once every rank is done with it.
                problem = no_space(self.root, free_bytes(self.root), self._size(), path.name)
                raise NoSpaceForCheckpoint(f"rank {self.rank}: {problem}") from exc
            raise CheckpointError(f"rank {self.rank}: cannot write checkpoint {path}: {exc}") from exc

    def space_problem(self) -> str | None:
        """Rank 0 only (None elsewhere: the ranks share the filesystem, and reading every rank's
        marker on every rank would cost the shared filesystem ranks squared reads): why the next
        checkpoint will not fit on the checkpoint directory's filesystem (its free bytes are fewer
        than the newest complete checkpoint takes); None when it fits, or when no checkpoint tells
        its size yet."""
        if self.rank != 0:
            return None
        needed = self._size()
        if needed is None:
            return None
        free = free_bytes(self.root)
        return no_space(self.root, free, needed) if free < needed else None

    def _size(self) -> int | None:
        """The bytes the newest complete checkpoint takes, None without one."""
        for step, path in step_dirs(self.root):
            if not checkpoint_problems(path, step, None, check_crc=False):
                try:
                    return bytes_on_disk(path)
                except FileNotFoundError:
                    # Pruned by rank 0 meanwhile: an older one is no better a guess.
                    return None
        return None

    def _write_files(self, step: int, path: Path, shared: Any, local: Any) -> None:
        import torch

        _make_dir(self.root)
        _make_dir(path)
        if not self._needs_writing(step, path):
            return
        marker = path / marker_name(self.rank)
        if marker.exists():
            # Left by an earlier attempt: it must be gone before this rank's files change under it.
            marker.unlink()
            fsync_dir(path)
        files: dict[str, dict[str, Any]] = {}
        if self.rank == 0:
            files[SHARED_FILE] = write_stream_atomic(path / SHARED_FILE, lambda f: torch.save(shared, f))
        own = rank_file_name(self.rank)
        files[own] = write_stream_atomic(path / own, lambda f: torch.save(local, f))
        fsync_dir(path)
        if self.rank == 0:
            meta = {
                "format": FORMAT,
                "step": step,
                "world_size": self.world_size,
                "time": time.time(),
                "attempt": self.attempt,
            }
            write_json(path / META_FILE, meta)
        write_json(
            marker,
            {
                "step": step,
                "rank": self.rank,
                "world_size": self.world_size,
                "attempt": self.attempt,
                "files": files,
            },
        )

    def _needs_writing(self, step: int, path: Path) -> bool:
        """Whether this rank writes its part of `step`: a cheap stat on the usual path (no meta.json
        yet); markers are read only when an earlier attempt left meta.json behind."""
        meta = read_json(path / META_FILE)
        if not isinstance(meta, dict):
            return True
        if meta.get("attempt") == self.attempt:
            # This attempt's rank 0 got here first; skip only a part this rank already wrote.
            return rank_part_problems(path, self.rank, self.attempt) != []
        problems = checkpoint_problems(path, step, None, check_crc=False)
        if not problems:
            log.info(
                "%s is already complete (attempt %s); it is kept, not rewritten", path, meta.get("attempt")
            )
            return False
        if self.rank == 0:
            _remove_extra_ranks(path, meta, self.world_size)
        return True

    # -- finding and reading ----------------------------------------------------------------------

    def latest(self, *, verify_checksums: bool = False, before: int | None = None) -> CheckpointInfo | None:
        """The newest COMPLETE checkpoint, whatever number of ranks wrote it (a run resubmitted
        onto another size resumes from it: see load()); incomplete or corrupt ones are skipped with
        a logging warning naming the directory and what is wrong. `before`: only checkpoints of
        earlier steps (the next older one, after one was found damaged at load).

        Sizes are checked always; with `verify_checksums` every file of every rank is read and its
        CRC32 checked too (the same answer on every rank, at the cost of reading everything)."""
        steps = {path: step for step, path in step_dirs(self.root) if before is None or step < before}
        found, skipped = newest_complete(
            steps, lambda path: checkpoint_problems(path, steps[path], None, check_crc=verify_checksums)
        )
        for path, problems in skipped:
            log.warning("skipping checkpoint %s: %s", path, "; ".join(problems))
        if found is None:
            return None
        meta = cast(dict[str, Any], read_json(found / META_FILE))
        return CheckpointInfo(
            step=steps[found], path=found, world_size=int(meta["world_size"]), written_at=float(meta["time"])
        )

    def load(
        self, info: CheckpointInfo, *, verify_checksums: bool = True
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(shared, local-of-this-rank) of checkpoint `info`.

        Written by another number of ranks, rank r gets the local state rank r saved, and an empty
        one where there was no rank r: what ranks hold alone (their RNG streams) cannot be split or
        merged across sizes, while the shared state (model, optimizer, data position) is whole.

        The files are checked against their markers first (size, and CRC32 unless
        `verify_checksums` is False), so a file damaged after latest() raises CheckpointError
        instead of loading wrong values."""
        problem = self.damage(info, verify_checksums=verify_checksums)
        if problem is not None:
            raise CheckpointError(f"{info.path}: {problem}; load an older checkpoint or delete this one")
        local = _load_dict(info.path / rank_file_name(self.rank)) if self.rank < info.world_size else {}
        return _load_dict(info.path / SHARED_FILE), local

    def damage(self, info: CheckpointInfo, *, verify_checksums: bool = True) -> str | None:
        """What is wrong with the files this rank loads from checkpoint `info` (shared.pt and its
        own), checked against their markers; None when they are as written."""
        wanted = [(SHARED_FILE, read_json(info.path / marker_name(0)))]
        if self.rank < info.world_size:
            wanted.append((rank_file_name(self.rank), read_json(info.path / marker_name(self.rank))))
        for name, marker in wanted:
            if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
                return f"the marker describing {name} is missing or unreadable"
            problem = file_problem(info.path, name, marker["files"].get(name), check_crc=verify_checksums)
            if problem is not None:
                return problem
        return None

    # -- moving aside ---------------------------------------------------------------------------

    def move_aside(self, info: CheckpointInfo, reason: str) -> Path | None:
        """Rank 0 only (None elsewhere): move checkpoint `info`, found damaged, into
        ROOT/damaged/ with `reason` in its reason.txt, where latest() and prune() do not look and
        nothing deletes it; where it went, or None when it could not be moved (logged: the step is
        then skipped again by each attempt that finds it)."""
        if self.rank != 0:
            return None
        damaged = self.root / DAMAGED_DIR
        target = damaged / info.path.name
        copies = 1
        while target.exists():
            copies += 1
            target = damaged / f"{info.path.name}.{copies}"
        try:
            # Into the directory before it moves, so that it moves with it in one rename.
            write_atomic(info.path / REASON_FILE, f"{reason}\nmoved aside by attempt {self.attempt}\n")
            _make_dir(damaged)
            info.path.rename(target)
            fsync_dir(self.root)
        except OSError as exc:
            log.warning("could not move damaged checkpoint %s into %s: %s", info.path, damaged, exc)
            return None
        return target

    # -- deleting -------------------------------------------------------------------------------

    def discard(self, step: int) -> None:
        """Rank 0 only (no-op elsewhere): remove what a save of `step` that did not complete on
        every rank left behind, unless the checkpoint is complete (kept from another attempt)."""
        path = self.root / step_dir_name(step)
        if self.rank != 0 or not path.is_dir() or not checkpoint_problems(path, step, None, check_crc=False):
            return
        _delete_dir(path, "incomplete checkpoint")

    def prune(self) -> None:
        """Rank 0 only (no-op elsewhere): keep the newest `keep_last` complete checkpoints, and
        delete incomplete ones OLDER than the newest complete one. Never deletes anything newer than
        the newest complete checkpoint (it may be in the middle of being written by another rank).

        Complete checkpoints written by another number of ranks (before a resubmit resized the
        run) count like this size's own."""
        if self.rank != 0 or not self.root.is_dir():
            return
        for leftover in self.root.glob(f"{_DELETING_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        kept = 0
        for step, path in step_dirs(self.root):
            if not checkpoint_problems(path, step, None, check_crc=False):
                kept += 1
                if kept > self.keep_last:
                    _delete_dir(path)
            elif kept > 0:
                _delete_dir(path)


def _make_dir(path: Path) -> None:
    if path.is_dir():
        return
    path.mkdir(parents=True, exist_ok=True)
    # The new entry must be durable before anything inside it counts.
    fsync_dir(path.parent)


def _remove_extra_ranks(path: Path, meta: Mapping[str, Any], world_size: int) -> None:
    """Files of ranks >= world_size, left by an earlier attempt with more ranks."""
    for rank in range(world_size, int(meta.get("world_size", 0))):
        (path / marker_name(rank)).unlink(missing_ok=True)
        (path / rank_file_name(rank)).unlink(missing_ok=True)


def _delete_dir(path: Path, what: str = "old checkpoint") -> None:
    # Renamed first so that it vanishes at once; a prune killed mid-way leaves a .deleting-* that
    # nothing reads and the next prune removes.
    target = path.with_name(f"{_DELETING_PREFIX}{path.name}.{os.getpid()}")
    try:
        path.rename(target)
    except OSError as exc:
        log.warning("could not delete %s %s: %s", what, path, exc)
        return
    log.info("deleted %s %s", what, path)
    shutil.rmtree(target, ignore_errors=True)


def _load_dict(path: Path) -> dict[str, Any]:
    import pickle

    import torch

    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise CheckpointError(f"cannot load {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} holds a {type(value).__name__}, not a dict")
    return value
