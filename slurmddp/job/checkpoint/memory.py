"""In-memory snapshots: the newest training state of a run in one node's memory-backed folder.

One file per snapshot, NODE_DIR/step-00001234.pt, holding the state every rank shares under DDP
(model, optimizer, ...: rank 0's `shared` of a checkpoint) and every rank's own (`locals`, one per
rank, gathered by the loop before the write), so any one node's newest file is enough to restart
every rank, a replaced node's too. Written as a temp file and renamed, then the older file is
removed: a rank killed mid-write leaves the previous snapshot, and readers ignore temp files.

Nothing here talks to another rank or node; job/train/snapshots.py decides when to take one and
which to restart from. The folder is removed when the job ends (the batch script's keeper task).

Memory-backed folders such as /dev/shm are shared by every user of a node, and job ids are easy to
guess: another user could make the folder first and put a snapshot of their own in it. The node's
folder and the PRIVATE_LEVELS - 1 folders above it must therefore be real folders of this user's
alone (made with mode 0700 here), or no snapshot is written there or read from there.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmddp.errors import CheckpointError
from slurmddp.job.checkpoint.snapshot import Snapshot, prepare

FORMAT = 1
_FILE = re.compile(r"^step-(\d{8,})\.pt$")
_TEMP_PREFIX = ".writing-"
PRIVATE_LEVELS = 3
"""The node's folder, the job's, and the user's (SNAPSHOT_DIR/slurmddp-UID/JOB.RESTART/NODE)."""


@dataclass(frozen=True)
class Loaded:
    """A snapshot read back: its step, the number of ranks that took it, the shared state and
    every rank's own."""

    step: int
    world_size: int
    taken_at: float
    """Unix time at which it was taken."""
    shared: dict[str, Any]
    locals: list[dict[str, Any]]


def file_name(step: int) -> str:
    return f"step-{step:08d}.pt"


class NodeSnapshots:
    """One node's snapshots of a run, written by one rank of the node (its local rank 0)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._spare: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.write_s = 0.0
        """Seconds the last write took, off the training path."""

    def untrusted(self) -> str | None:
        """Why this node's folder may hold what another user put there (None: it is ours alone, or
        it does not exist)."""
        for level in [self.folder, *self.folder.parents][:PRIVATE_LEVELS]:
            try:
                found = os.lstat(level)
            except FileNotFoundError:
                continue
            if (
                not stat.S_ISDIR(found.st_mode)
                or found.st_uid != os.getuid()
                or found.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
            ):
                return (
                    f"{level} is not a folder of this user's alone (owner uid {found.st_uid}, mode "
                    f"{stat.filemode(found.st_mode)}): another user may have made it; remove it"
                )
        return None

    def newest(self) -> int | None:
        """The step of the newest complete snapshot in this node's folder, or None."""
        steps = [int(m.group(1)) for m in map(_FILE.match, _names(self.folder)) if m is not None]
        return max(steps, default=None)

    def path(self, step: int) -> Path:
        return self.folder / file_name(step)

    def read(self, step: int) -> bytes:
        return self.path(step).read_bytes()

    # -- writing --------------------------------------------------------------------------------

    def busy(self) -> bool:
        """True while the last snapshot is still being written."""
        return self._thread is not None and self._thread.is_alive()

    def copy(self, shared: dict[str, Any]) -> Any:
        """The shared state's tensors copied into CPU buffers kept from the last snapshot (once its
        write is done), so the caller may change the originals once this returns. Raises the last
        write's error, if it had one."""
        self.wait()
        snapshot = Snapshot(self._spare)
        copied = prepare(shared, "shared", snapshot)
        self._spare = snapshot.taken
        return copied

    def write(self, step: int, world_size: int, copied: Any, locals_: list[Any]) -> None:
        """Write what `copy` returned, with every rank's own state, in the background."""
        body = {
            "format": FORMAT,
            "step": step,
            "world_size": world_size,
            "taken_at": time.time(),
            "shared": copied,
            # Gathered from the ranks, so copies already: checked, not copied again.
            "locals": prepare(list(locals_), "locals", None),
        }
        self._thread = threading.Thread(
            target=self._write, args=(step, body), name="slurmddp-snapshot", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until the snapshot being written is in place (re-raise its error)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _write(self, step: int, body: dict[str, Any]) -> None:
        import torch

        began = time.perf_counter()
        temp = self.folder / f"{_TEMP_PREFIX}{os.getpid()}-{file_name(step)}"
        try:
            # Each level its own mkdir: mkdir(parents=True) gives the folders above the default mode.
            for level in reversed([self.folder, *self.folder.parents][:PRIVATE_LEVELS]):
                with contextlib.suppress(FileExistsError):
                    level.mkdir(mode=0o700)
            problem = self.untrusted()
            if problem is not None:
                raise CheckpointError(problem)
            buffer = io.BytesIO()
            torch.save(body, buffer)
            data = buffer.getbuffer()
            free = shutil.disk_usage(self.folder).free
            if free < len(data):
                raise CheckpointError(
                    f"{self.folder} has {free} bytes free and a snapshot takes {len(data)}; give "
                    "checkpoint.snapshot_dir a folder with room for two snapshots (the newest stays "
                    "while the next is written), or set "
                    "checkpoint.snapshot_every_steps=0"
                )
            with open(temp, "wb") as out:
                out.write(data)
            # No fsync: the folder is memory, and a snapshot need not outlive the node.
            os.replace(temp, self.path(step))
            for name in _names(self.folder):
                match = _FILE.match(name)
                # Older snapshots, and what an attempt killed mid-write left.
                if (match is not None and int(match.group(1)) != step) or name.startswith(_TEMP_PREFIX):
                    (self.folder / name).unlink(missing_ok=True)
        except BaseException as exc:
            temp.unlink(missing_ok=True)
            self._error = exc
        finally:
            self.write_s = time.perf_counter() - began

    def clear(self) -> None:
        """Remove this node's snapshots (the run ended, or saved a newer checkpoint for good)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        shutil.rmtree(self.folder, ignore_errors=True)
        # The job's folder too, once no node's is left in it (nodes that share one memory).
        with contextlib.suppress(OSError):
            self.folder.parent.rmdir()


def load(blob: bytes) -> Loaded:
    """A snapshot file's content, read as checkpoints are (weights_only: no code runs)."""
    import torch

    try:
        body = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"the snapshot cannot be read: {exc}") from exc
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CheckpointError("the snapshot is not one this slurmddp writes")
    return Loaded(
        int(body["step"]),
        int(body["world_size"]),
        float(body["taken_at"]),
        body["shared"],
        list(body["locals"]),
    )


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []
