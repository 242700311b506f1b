"""Room for a checkpoint: the free bytes of the filesystem a checkpoint directory is on, the bytes a
checkpoint takes there, and the error a save that does not fit ends with.

The size of the next checkpoint is taken to be that of the newest complete one: the state a loop
saves keeps its shapes from step to step.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from slurmddp.errors import CheckpointError


class NoSpaceForCheckpoint(CheckpointError):
    """A checkpoint did not fit on its filesystem (checked before a save, or ENOSPC while writing):
    the training loop skips that save instead of failing (docs/resume.md, "A full disk")."""


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of `path` (or of its nearest
    existing parent: the directory may not have been made yet)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def bytes_on_disk(folder: Path) -> int:
    """What the files directly in `folder` take: their sizes, or their allocated blocks where the
    filesystem rounds up (a page a file on tmpfs)."""
    total = 0
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            stat = entry.stat(follow_symlinks=False)
            total += max(stat.st_size, stat.st_blocks * 512)
    return total


def no_space(root: Path, free: int, needed: int | None, step_dir: str = "the checkpoint") -> str:
    """The words for a checkpoint that does not fit: where, how much is free, how much it needs
    (or, with no size known, which step directory did not fit)."""
    from rich.filesize import decimal

    if needed is None:
        return f"no space left on {root}: {decimal(free, precision=1)} free, and {step_dir} did not fit"
    return (
        f"no space left on {root}: {decimal(free, precision=1)} free, a checkpoint needs "
        f"{decimal(needed, precision=1)}"
    )
