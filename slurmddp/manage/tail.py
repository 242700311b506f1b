"""Reading on through a file another process writes: rank logs and metrics.jsonl."""

from __future__ import annotations

import os
from pathlib import Path


class Tail:
    """New complete lines of a file that may not exist yet, and may be replaced or cut short."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.partial = b""
        self.rewound = False
        """Whether the last `new_lines` started over, the file having been replaced or cut short."""

    def new_lines(self) -> list[str]:
        self.rewound = False
        try:
            with self.path.open("rb") as handle:
                stat = os.fstat(handle.fileno())
                # A shorter file was truncated in place; another inode replaced it by a rename.
                if stat.st_size < self.offset or self.inode not in (None, stat.st_ino):
                    self.rewound = True
                    self.offset, self.partial = 0, b""
                self.inode = stat.st_ino
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        # Bytes, split before decoding: a read may end inside a multi-byte character.
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in lines]
