"""What a checkpoint directory holds and when it is complete: the file names (shared.pt, rank-N.pt,
meta.json, rank-N.done), and the checks of meta.json, every rank's completion marker, and each file's
size and (optionally) CRC32 against what its marker recorded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from slurmddp.job.checkpoint.io import file_crc32

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
    problems: list[str] = []
    for rank in range(world_size):
        marker = read_json(path / marker_name(rank))
        if marker is None:
            problems.append(f"no completion marker from rank {rank} ({marker_name(rank)})")
        elif not isinstance(marker, dict):
            problems.append(f"{marker_name(rank)} is unreadable")
        else:
            problems += marker_problems(path, rank, marker, meta.get("attempt"), check_crc=check_crc)
        if len(problems) >= 3:
            problems.append("...")
            break
    return problems


def marker_problems(
    path: Path, rank: int, marker: dict[str, Any], attempt: Any, *, check_crc: bool
) -> list[str]:
    name = marker_name(rank)
    if marker.get("attempt") != attempt:
        return [f"{name} is from attempt {marker.get('attempt')!r} but meta.json from {attempt!r}"]
    files = marker.get("files")
    expected = [rank_file_name(rank), *([SHARED_FILE] if rank == 0 else [])]
    if not isinstance(files, dict) or any(f not in files for f in expected):
        return [f"{name} does not list {', '.join(expected)}"]
    return [p for f in expected if (p := file_problem(path, f, files[f], check_crc=check_crc)) is not None]


def file_problem(path: Path, name: str, recorded: Any, *, check_crc: bool) -> str | None:
    """What is wrong with `name` under `path` against what its marker recorded (`{"size": ...,
    "crc32": ...}`), or None."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("size"), int):
        return f"no recorded size for {name}"
    problem = size_problem(path, name, recorded["size"])
    if problem is not None:
        return f"{problem} (truncated or replaced)"
    if check_crc and recorded.get("crc32") is not None:
        crc = file_crc32(path / name)
        if crc != recorded["crc32"]:
            return f"{name} has CRC32 {crc}, its marker says {recorded['crc32']} (corrupt)"
    return None


def size_problem(path: Path, name: str, size: int) -> str | None:
    """Whether `name` under `path` is missing or of another size than its marker's `size`; None
    when it is there at that size. The framework integrations' markers record sizes alone."""
    try:
        found = (path / name).stat().st_size
    except OSError:
        return f"{name} is missing"
    return None if found == size else f"{name} has {found} bytes, its marker says {size}"


def read_json(path: Path) -> Any:
    """The parsed file, None when it does not exist, "" when it cannot be parsed."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return ""
