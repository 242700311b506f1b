"""Files that are either wholly written or not there: temp file, fsync, rename; directories made
with exact permissions."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text`; a reader never sees a partial file, even after a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry is.
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object at `path`; None when it is missing, torn or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def make_dirs(path: Path, mode: int) -> list[Path]:
    """Create directory `path`, which must not exist yet, and its missing parents, each with exactly
    `mode` (the umask would only narrow mkdir's); the ones created, outermost first.

    Parents that exist keep their permissions. On failure the directories this call created are
    removed again and the OSError propagates.
    """
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    if not missing:
        path.mkdir(mode=mode)  # raises FileExistsError: a fresh directory was asked for
    created: list[Path] = []
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir(mode=mode)
            except FileExistsError:
                if folder == path or not folder.is_dir():
                    raise
                continue  # a parent that a concurrent submission created: theirs, not ours
            created.append(folder)
            os.chmod(folder, mode)
    except BaseException:
        remove_dirs(created)
        raise
    return created


def remove_dirs(created: list[Path]) -> None:
    """Undo `make_dirs`: remove the directories it created, innermost first, where still empty."""
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


@contextlib.contextmanager
def no_group_write() -> Iterator[None]:
    """Files created meanwhile are writable by their owner only, whatever the umask (a common 002
    would leave them group-writable); the umask is restored after."""
    old = os.umask(0o022)
    os.umask(old | 0o022)
    try:
        yield
    finally:
        os.umask(old)
