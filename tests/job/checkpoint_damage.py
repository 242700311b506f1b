"""Damage done to a checkpoint's files, as a disk or a person might do it, for the tests of what
the store and the loop make of it."""

from __future__ import annotations

from pathlib import Path


def flip_a_byte(path: Path) -> None:
    """One byte in the middle of `path` inverted: the size stays, the CRC32 does not."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
