"""What a checkpoint directory holds and when it is complete: the file names (shared.pt, rank-N.pt,
meta.json, rank-N.done), the checks of meta.json (the checkpoint's record), and the store's
parameters of the one completeness rule (completeness.py) that checks every rank's marker and each
file's size and (optionally) CRC32 against what its marker recorded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from slurmddp.job.checkpoint.completeness import Kind, Marker, Wording, problems

FORMAT = 1
SHARED_FILE = "shared.pt"
META_FILE = "meta.json"
STEP_DIR_RE = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def marker_name(rank: int) -> str:
    return f"rank-{rank:05d}.done"


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """The step directories under `root` with their steps, newest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_DIR_RE.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


STORE = Kind(
    Wording(
        missing="no completion marker from rank {rank} ({marker})",
        unreadable="{marker} is unreadable",
        malformed="{marker} does not list {required}",
        unlisted="{marker} does not list {required}",
    ),
    limit=3,
)
"""How the store applies the one completeness rule (completeness.py): a marker per rank, each
checked against meta.json's attempt, at most three problems reported."""


def rank_marker(rank: int, rank0_file: str) -> Marker:
    """The marker of `rank` in a checkpoint written rank by rank: `rank-R.done` lists its own
    `rank-R.pt`, and rank 0's also `rank0_file` (the state rank 0 alone writes)."""
    return Marker(marker_name(rank), rank, (rank_file_name(rank), *([rank0_file] if rank == 0 else [])))


def rank_markers(world_size: int, rank0_file: str) -> list[Marker]:
    """The markers of every rank of a checkpoint written by `world_size` ranks (rank_marker)."""
    return [rank_marker(rank, rank0_file) for rank in range(world_size)]


def checkpoint_problems(path: Path, step: int, world_size: int | None, *, check_crc: bool) -> list[str]:
    """Why `path` is not a complete checkpoint of `world_size` ranks (empty: it is complete); with
    `world_size` None, of the ranks its meta.json says wrote it."""
    meta = read_json(path / META_FILE)
    if meta is None:
        return ["meta.json is missing (rank 0 did not finish)"]
    if not isinstance(meta, dict) or not isinstance(meta.get("world_size"), int) or meta["world_size"] < 1:
        return ["meta.json is unreadable or malformed"]
    if meta.get("format") != FORMAT:
        return [f"meta.json has format {meta.get('format')!r}; this version reads format {FORMAT}"]
    if meta.get("step") != step:
        return [f"meta.json is for step {meta.get('step')}, not {step}"]
    if world_size is None:
        world_size = int(meta["world_size"])
    if meta["world_size"] != world_size:
        return [f"written by {meta['world_size']} ranks; this job has {world_size}"]
    markers = rank_markers(world_size, SHARED_FILE)
    return problems(path, STORE, markers, attempt=meta.get("attempt"), check_crc=check_crc)


def rank_part_problems(path: Path, rank: int, attempt: str) -> list[str]:
    """Why `rank`'s part of the checkpoint in `path` is not complete for `attempt` (empty: it is)."""
    return problems(path, STORE, [rank_marker(rank, SHARED_FILE)], attempt=attempt)


def read_json(path: Path) -> Any:
    """The parsed file, None when it does not exist, "" when it cannot be parsed."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return ""
