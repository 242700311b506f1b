"""Damage done to a checkpoint's files, and a disk that fills up under them, for the tests of what
the store and the loop make of it."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO


def flip_a_byte(path: Path) -> None:
    """One byte in the middle of `path` inverted: the size stays, the CRC32 does not."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


class FullDisk:
    """The checkpoint writer's files on a filesystem with `room` bytes left: a write past them fails
    with ENOSPC, as on a full disk. Install with `monkeypatch.setattr(io, "open", disk.open,
    raising=False)` (io: slurmddp.job.checkpoint.io)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.used = threading.Event()
        """Set once a file was opened on it (by an async save's thread, maybe)."""

    def open(self, path: Path, mode: str) -> _LimitedFile:
        self.used.set()
        return _LimitedFile(open(path, mode), self)


class _LimitedFile:
    def __init__(self, raw: BinaryIO, disk: FullDisk) -> None:
        self.raw = raw
        self.disk = disk

    def write(self, data: bytes | memoryview) -> int:
        size = memoryview(data).nbytes
        if size > self.disk.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.disk.room -= size
        return self.raw.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __enter__(self) -> _LimitedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.raw.close()
