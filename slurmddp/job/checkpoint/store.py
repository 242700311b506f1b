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

Files are read back with torch.load(weights_only=True): loading a checkpoint must not run code from
a shared file system, and must not depend on the user's classes being importable. save() checks up
front that the state holds only what that loader accepts, so an unloadable checkpoint fails at its
first save instead of at resume; `capture_rng_state()` gives RNG states in such types.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import random
import re
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from slurmddp.errors import CheckpointError
from slurmddp.files import fsync_dir, write_json

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

FORMAT = 1
SHARED_FILE = "shared.pt"
META_FILE = "meta.json"
STEP_DIR_RE = re.compile(r"^step-(\d+)$")
_DELETING_PREFIX = ".deleting-"
_READ_CHUNK = 16 << 20


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint on disk."""

    step: int
    path: Path
    world_size: int
    written_at: float
    """Unix time at which rank 0 wrote meta.json."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def marker_name(rank: int) -> str:
    return f"rank-{rank:05d}.done"


def default_attempt_id(env: Mapping[str, str]) -> str | None:
    """An id that all ranks of one attempt derive alike and that no other attempt has, or None."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job:
        # SLURM_RESTART_COUNT is absent on the first run and counts requeues after it.
        return f"slurm-{job}.{env.get('SLURM_RESTART_COUNT') or 0}"
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
        keep_last: int = 2,
        async_save: bool = False,
        *,
        attempt: str | None = None,
        reuse_snapshot_buffers: bool = True,
    ) -> None:
        """`attempt`: see default_attempt_id(); pass one when the environment has none.
        `reuse_snapshot_buffers` (async only): keep the CPU copy of the last save to copy the next
        one into, instead of allocating it again (saves ~half of the time save() blocks, costs one
        state's worth of resident host memory between saves)."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise CheckpointError(f"rank {rank} is not a rank of a job of {world_size} ranks")
        if keep_last < 1:
            raise CheckpointError(f"keep_last is {keep_last}; keep at least 1 checkpoint")
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.keep_last = keep_last
        self.async_save = async_save
        self.reuse_snapshot_buffers = reuse_snapshot_buffers
        found = attempt if attempt is not None else default_attempt_id(os.environ)
        self.attempt = found or ""
        # Only a writer needs the id; a store that only reads says nothing.
        self._warn_no_attempt = found is None and world_size > 1
        self._pending: _PendingSave | None = None
        self._spare: dict[str, torch.Tensor] = {}

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, shared: Mapping[str, Any] | None, local: Mapping[str, Any]) -> None:
        """Save checkpoint `step`. `shared` (model/optimizer/scheduler/scaler/sampler/user extras:
        nested state dicts) is given by rank 0 only (None elsewhere; ignored if given elsewhere);
        `local` (this rank's RNG states etc.) by every rank. Sync mode: returns once this rank's
        files are durable. Async mode: first waits for this rank's previous pending save, snapshots
        every tensor to CPU memory (so training may modify the originals right after return), and
        returns; a background thread writes.

        If a complete checkpoint of this world size already exists at `step` from another attempt,
        it is kept and this save writes nothing: replacing it would leave no complete checkpoint at
        that step while the new files are written.
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
            mine = _prepare(dict(shared), "shared", None) if shared is not None and self.rank == 0 else None
            self._write(step, mine, _prepare(dict(local), "local", None))
            return
        self.wait()
        snapshot = _Snapshot(dict(self._spare))
        mine = _prepare(dict(shared), "shared", snapshot) if shared is not None and self.rank == 0 else None
        theirs = _prepare(dict(local), "local", snapshot)
        self._spare = {}
        pending = _PendingSave(step, snapshot.taken)
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

    def _write_in_background(self, pending: _PendingSave, shared: Any, local: Any) -> None:
        try:
            self._write(pending.step, shared, local)
        except BaseException as exc:
            pending.error = exc

    def _write(self, step: int, shared: Any, local: Any) -> None:
        path = self.root / step_dir_name(step)
        try:
            self._write_files(step, path, shared, local)
        except OSError as exc:
            raise CheckpointError(f"rank {self.rank}: cannot write checkpoint {path}: {exc}") from exc

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
        meta = _read_json(path / META_FILE)
        if not isinstance(meta, dict):
            return True
        if meta.get("attempt") == self.attempt:
            # This attempt's rank 0 got here first; skip only a part this rank already wrote.
            mine = _read_json(path / marker_name(self.rank))
            if isinstance(mine, dict) and mine.get("attempt") == self.attempt:
                return _marker_problems(path, self.rank, mine, self.attempt, check_crc=False) != []
            return True
        problems = _checkpoint_problems(path, step, self.world_size, check_crc=False)
        if not problems:
            log.info(
                "%s is already complete (attempt %s); it is kept, not rewritten", path, meta.get("attempt")
            )
            return False
        if self.rank == 0:
            _remove_extra_ranks(path, meta, self.world_size)
        return True

    # -- finding and reading ----------------------------------------------------------------------

    def latest(self, *, verify_checksums: bool = False) -> CheckpointInfo | None:
        """The newest COMPLETE checkpoint for this world size; incomplete or corrupt ones are skipped
        with a logging warning naming the directory and what is wrong.

        Sizes are checked always; with `verify_checksums` every file of every rank is read and its
        CRC32 checked too (the same answer on every rank, at the cost of reading everything)."""
        for step, path in self._step_dirs():
            problems = _checkpoint_problems(path, step, self.world_size, check_crc=verify_checksums)
            if problems:
                log.warning("skipping checkpoint %s: %s", path, "; ".join(problems))
                continue
            meta = cast(dict[str, Any], _read_json(path / META_FILE))
            return CheckpointInfo(
                step=step, path=path, world_size=self.world_size, written_at=float(meta["time"])
            )
        return None

    def load(
        self, info: CheckpointInfo, *, verify_checksums: bool = True
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(shared, local-of-this-rank) of checkpoint `info`.

        The two files are checked against their markers first (size, and CRC32 unless
        `verify_checksums` is False), so a file damaged after latest() raises CheckpointError
        instead of loading wrong values."""
        if info.world_size != self.world_size:
            raise CheckpointError(
                f"{info.path} was written by {info.world_size} ranks; this job has {self.world_size}"
            )
        shared_marker = _read_json(info.path / marker_name(0))
        own_marker = _read_json(info.path / marker_name(self.rank))
        wanted = [(SHARED_FILE, shared_marker), (rank_file_name(self.rank), own_marker)]
        for name, marker in wanted:
            if not isinstance(marker, dict) or not isinstance(marker.get("files"), dict):
                raise CheckpointError(f"{info.path}: the marker describing {name} is missing or unreadable")
            problem = _file_problem(info.path, name, marker["files"].get(name), check_crc=verify_checksums)
            if problem is not None:
                raise CheckpointError(f"{info.path}: {problem}; load an older checkpoint or delete this one")
        return _load_dict(info.path / SHARED_FILE), _load_dict(info.path / rank_file_name(self.rank))

    # -- deleting -------------------------------------------------------------------------------

    def prune(self) -> None:
        """Rank 0 only (no-op elsewhere): keep the newest `keep_last` complete checkpoints, and
        delete incomplete ones OLDER than the newest complete one. Never deletes anything newer than
        the newest complete checkpoint (it may be in the middle of being written by another rank).

        Complete checkpoints written by a different number of ranks are left alone."""
        if self.rank != 0 or not self.root.is_dir():
            return
        for leftover in self.root.glob(f"{_DELETING_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        kept = 0
        for step, path in self._step_dirs():
            problems = _checkpoint_problems(path, step, self.world_size, check_crc=False)
            if not problems:
                kept += 1
                if kept > self.keep_last:
                    _delete_dir(path)
            elif kept > 0 and not _is_foreign_complete(path, step):
                _delete_dir(path)

    def _step_dirs(self) -> Iterator[tuple[int, Path]]:
        """Step directories, newest first."""
        if not self.root.is_dir():
            return iter(())
        found = []
        for entry in self.root.iterdir():
            match = STEP_DIR_RE.match(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), entry))
        return iter(sorted(found, reverse=True))


# -- what counts as complete -------------------------------------------------------------------------


def _checkpoint_problems(path: Path, step: int, world_size: int, *, check_crc: bool) -> list[str]:
    """Why `path` is not a complete checkpoint of `world_size` ranks (empty: it is complete)."""
    meta = _read_json(path / META_FILE)
    if meta is None:
        return ["meta.json is missing (rank 0 did not finish)"]
    if not isinstance(meta, dict) or not isinstance(meta.get("world_size"), int):
        return ["meta.json is unreadable or malformed"]
    if meta.get("format") != FORMAT:
        return [f"meta.json has format {meta.get('format')!r}; this version reads format {FORMAT}"]
    if meta.get("step") != step:
        return [f"meta.json is for step {meta.get('step')}, not {step}"]
    if meta["world_size"] != world_size:
        return [f"written by {meta['world_size']} ranks; this job has {world_size}"]
    problems: list[str] = []
    for rank in range(world_size):
        marker = _read_json(path / marker_name(rank))
        if marker is None:
            problems.append(f"no completion marker from rank {rank} ({marker_name(rank)})")
        elif not isinstance(marker, dict):
            problems.append(f"{marker_name(rank)} is unreadable")
        else:
            problems += _marker_problems(path, rank, marker, meta.get("attempt"), check_crc=check_crc)
        if len(problems) >= 3:
            problems.append("...")
            break
    return problems


def _marker_problems(
    path: Path, rank: int, marker: dict[str, Any], attempt: Any, *, check_crc: bool
) -> list[str]:
    name = marker_name(rank)
    if marker.get("attempt") != attempt:
        return [f"{name} is from attempt {marker.get('attempt')!r} but meta.json from {attempt!r}"]
    files = marker.get("files")
    expected = [rank_file_name(rank), *([SHARED_FILE] if rank == 0 else [])]
    if not isinstance(files, dict) or any(f not in files for f in expected):
        return [f"{name} does not list {', '.join(expected)}"]
    return [p for f in expected if (p := _file_problem(path, f, files[f], check_crc=check_crc)) is not None]


def _file_problem(path: Path, name: str, recorded: Any, *, check_crc: bool) -> str | None:
    if not isinstance(recorded, dict) or not isinstance(recorded.get("size"), int):
        return f"no recorded size for {name}"
    try:
        size = (path / name).stat().st_size
    except FileNotFoundError:
        return f"{name} is missing"
    if size != recorded["size"]:
        return f"{name} has {size} bytes, its marker says {recorded['size']} (truncated or replaced)"
    if check_crc and recorded.get("crc32") is not None:
        crc = _file_crc32(path / name)
        if crc != recorded["crc32"]:
            return f"{name} has CRC32 {crc}, its marker says {recorded['crc32']} (corrupt)"
    return None


def _is_foreign_complete(path: Path, step: int) -> bool:
    """A complete checkpoint of another world size (prune leaves those alone)."""
    meta = _read_json(path / META_FILE)
    if not isinstance(meta, dict) or not isinstance(meta.get("world_size"), int) or meta["world_size"] < 1:
        return False
    return not _checkpoint_problems(path, step, meta["world_size"], check_crc=False)


def _read_json(path: Path) -> Any:
    """The parsed file, None when it does not exist, "" when it cannot be parsed."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return ""


# -- files ---------------------------------------------------------------------------------------------


class _ChecksumWriter:
    """The file-like object torch.save writes to: counts and CRCs the bytes on their way out.

    CRC32, not SHA-256: on 256 MB, zlib.crc32 costs ~0.09 s and hashlib.sha256 ~0.44 s (2-core VM,
    torch.save + fsync ~0.4-0.8 s); the check is for torn or damaged files, not for tampering.
    A large chunk is CRC'ed on a helper thread while it is written (both release the GIL), which
    took a sync save of 256 MB from 1.58x to 1.19x the time of a bare torch.save + fsync
    (benchmarks/checkpoint_blocking.py)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.size = 0
        self.crc = 0

    def write(self, data: bytes | memoryview) -> int:
        # torch hands over memoryviews of its buffers: no copy on the way to the file.
        size = memoryview(data).nbytes
        self.size += size
        if size < _OVERLAP_MIN:
            self.crc = zlib.crc32(data, self.crc)
            return self.raw.write(data)
        try:
            crc = _crc_thread().submit(zlib.crc32, data, self.crc)
        except RuntimeError:
            # After the main thread ended, concurrent.futures refuses new work, but a save that
            # was left running (nobody called wait()) is still finished, just without overlap.
            self.crc = zlib.crc32(data, self.crc)
            return self.raw.write(data)
        written = self.raw.write(data)
        # Waited for before returning: `data` is only guaranteed valid during this call.
        self.crc = crc.result()
        return written

    def flush(self) -> None:
        self.raw.flush()


_OVERLAP_MIN = 1 << 20
_crc_executor: ThreadPoolExecutor | None = None
_crc_lock = threading.Lock()


def _crc_thread() -> ThreadPoolExecutor:
    global _crc_executor
    with _crc_lock:
        if _crc_executor is None:
            _crc_executor = ThreadPoolExecutor(1, thread_name_prefix="slurmddp-crc")
        return _crc_executor


def write_stream_atomic(path: Path, produce: Callable[[IO[bytes]], None]) -> dict[str, Any]:
    """Binary sibling of fsutil.write_atomic for content streamed by `produce(file)`: temp file,
    fsync, rename. Returns {"size", "crc32"} of what was written. Leaves the directory fsync to the
    caller (one for all files of a save).

    The temp name is fixed (".NAME.tmp", opened with truncation), so a temp left by a killed
    attempt is reused instead of piling up; only one writer ever writes a given NAME."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as raw:
            sink = _ChecksumWriter(raw)
            produce(cast(IO[bytes], sink))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"size": sink.size, "crc32": f"{sink.crc:08x}"}


def _file_crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


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


def _delete_dir(path: Path) -> None:
    # Renamed first so that it vanishes at once; a prune killed mid-way leaves a .deleting-* that
    # nothing reads and the next prune removes.
    target = path.with_name(f"{_DELETING_PREFIX}{path.name}.{os.getpid()}")
    try:
        path.rename(target)
    except OSError as exc:
        log.warning("could not delete old checkpoint %s: %s", path, exc)
        return
    log.info("deleted old checkpoint %s", path)
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


# -- what may go into a checkpoint ------------------------------------------------------------------------

# Exactly the types torch.load(weights_only=True) reads back (checked on torch 2.13): no subclasses
# (a namedtuple, defaultdict or IntEnum pickles as its class and fails to load), no numpy.
_ATOMS: tuple[type, ...] = (type(None), bool, int, float, complex, str, bytes)


def _torch_atoms() -> tuple[type, ...]:
    import torch

    return (torch.Size, torch.dtype, torch.device)


class _Snapshot:
    """CPU copies of the tensors of one async save, reusing the buffers of the previous one."""

    def __init__(self, spare: dict[str, torch.Tensor]) -> None:
        self.spare = spare
        self.taken: dict[str, torch.Tensor] = {}

    def copy(self, tensor: torch.Tensor, where: str) -> torch.Tensor:
        import torch

        source = tensor.detach()
        buffer = self.spare.pop(where, None)
        if (
            buffer is not None
            and source.layout == torch.strided
            and buffer.dtype == source.dtype
            and buffer.shape == source.shape
            and buffer.stride() == source.stride()
        ):
            buffer.copy_(source)
        else:
            buffer = source.to("cpu", copy=True)
        self.taken[where] = buffer
        return buffer


@dataclass
class _PendingSave:
    step: int
    buffers: dict[str, torch.Tensor]
    thread: threading.Thread | None = None
    error: BaseException | None = None


def _prepare(value: Any, where: str, snapshot: _Snapshot | None) -> Any:
    """Check that `value` loads with weights_only=True; with a snapshot, also copy it (tensors to
    CPU memory, containers rebuilt) so the caller may change the original right away."""
    import torch

    kind = type(value)
    if kind in _ATOMS or kind in _torch_atoms():
        return value
    if isinstance(value, torch.Tensor):
        if kind not in (torch.Tensor, torch.nn.Parameter):
            raise CheckpointError(
                f"{where}: a {_type_name(kind)} (a tensor subclass) cannot be saved; save a plain tensor"
            )
        return snapshot.copy(value, where) if snapshot is not None else value
    if kind is dict or kind is collections.OrderedDict:
        out = kind()
        for key, item in value.items():
            if type(key) not in _ATOMS:
                raise CheckpointError(
                    f"{where}: key {key!r} is a {_type_name(type(key))}; use str or int keys"
                )
            out[key] = _prepare(item, f"{where}[{key!r}]", snapshot)
        return out if snapshot is not None else value
    if kind is list or kind is tuple:
        items = [_prepare(item, f"{where}[{i}]", snapshot) for i, item in enumerate(value)]
        if snapshot is None:
            return value
        return items if kind is list else tuple(items)
    if kind is set or kind is bytearray:
        for item in value if kind is set else ():
            if type(item) not in _ATOMS:
                raise CheckpointError(f"{where}: a set holding a {_type_name(type(item))} cannot be saved")
        return kind(value) if snapshot is not None else value
    hint = ""
    if "numpy" in kind.__module__:
        hint = " (for RNG states use slurmddp.checkpoint.capture_rng_state())"
    raise CheckpointError(
        f"{where}: a {_type_name(kind)} cannot be read back by torch.load(weights_only=True); "
        f"save tensors, numbers, strings, and lists, tuples and dicts of them{hint}"
    )


def _type_name(kind: type) -> str:
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


# -- RNG state in loadable types ----------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """torch (CPU, every CUDA device), Python `random` and numpy's global RNG, as tensors, ints and
    tuples that torch.load(weights_only=True) reads back (numpy's own state holds an ndarray)."""
    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        return state
    kind, keys, pos, has_gauss, cached_gaussian = cast(tuple[Any, ...], np.random.get_state(legacy=True))
    state["numpy"] = {
        "kind": str(kind),
        # uint32 -> int64 tensor: exact, and a dtype every torch version serializes.
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Undo capture_rng_state(): every generator continues where it was captured."""
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        saved = state["numpy"]
        keys = saved["keys"].numpy().astype(np.uint32)
        np.random.set_state((saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))
