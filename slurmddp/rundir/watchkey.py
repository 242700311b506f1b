"""The run's secret, which a connection to a rank's peer watch must prove it knows.

Rank 0's watch listens on a port that every user of the cluster can reach, and what it hears
there ends the step ("rank 3 is gone"). So a connection counts only once it has answered a
challenge with an HMAC under a key that only the run's owner can read: RUN_DIR/.watch-key, mode
0600, made once per run directory (the batch script's `attempts begin` makes it before any rank
starts, so no node asks for it before it exists; a local run's first rank makes it). Each side
proves itself, so a stranger can neither count as a rank nor pose as rank 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from slurmddp.rundir.layout import WATCH_KEY

KEY_BYTES = 32


def run_key(run_dir: Path) -> bytes:
    """The run's key, made here when it has none yet; two ranks making it at once agree."""
    path = run_dir / WATCH_KEY
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f"{WATCH_KEY}.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(KEY_BYTES))
        # A link fails where the name exists: whoever linked first made the key, complete.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return _read(path)


def _read(path: Path) -> bytes:
    key = bytes.fromhex(path.read_text().strip())
    if len(key) < KEY_BYTES // 2:
        raise ValueError(f"{path} holds no key: delete it, and the next attempt makes one")
    return key


def sign(key: bytes, *words: str) -> str:
    return hmac.new(key, " ".join(words).encode(), hashlib.sha256).hexdigest()


def signed(key: bytes, mac: str, *words: str) -> bool:
    return hmac.compare_digest(sign(key, *words), mac)
