"""Reading the checkpoint a resumed rank will load while the rank is still starting.

A rank loads its checkpoint only once the interpreter, torch, the process group and the user's own
setup (data, model, optimizer) are ready, seconds during which its disk or file system client sits
idle. Started first thing in the rank, a thread reads the files this rank will load from the newest
complete checkpoint (its rank file; shared.pt on one rank per node), so that torch.load finds them
in the page cache: what a restart on a spare node, a requeue onto other nodes, or a parallel file
system's cold client cache would otherwise read while the rank waits.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from slurmddp.job.checkpoint.integrity import SHARED_FILE, checkpoint_problems, rank_file_name, step_dirs

CHUNK = 8 << 20


def newest_files(root: Path, rank: int, shared: bool) -> list[Path]:
    """The files of the newest complete checkpoint under `root` that `rank` loads: its own rank
    file, where that checkpoint has one, and shared.pt where `shared`. Sizes only are checked, as
    the load does; what is skipped is reported by the load, not here."""
    for step, path in step_dirs(root):
        if not checkpoint_problems(path, step, None, check_crc=False):
            files = [path / rank_file_name(rank), *([path / SHARED_FILE] if shared else [])]
            return [file for file in files if file.is_file()]
    return []


def prefetch(root: Path, rank: int, shared: bool) -> threading.Thread | None:
    """Read newest_files() into the page cache in a daemon thread; None when there is nothing to
    read (a first attempt)."""
    files = newest_files(root, rank, shared)
    if not files:
        return None
    thread = threading.Thread(target=_read, args=(files,), name="slurmddp-prefetch", daemon=True)
    thread.start()
    return thread


def _read(files: list[Path]) -> None:
    buffer = bytearray(CHUNK)
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # pruned meanwhile: the load picks what is there
        try:
            while os.readv(fd, [buffer]):
                pass
        except OSError:
            pass  # the load reads it again and reports what is wrong
        finally:
            os.close(fd)
