"""The one rule for when a checkpoint counts as complete, for every kind of checkpoint slurmddp
writes or marks: its own (CheckpointStore, integrity.py), and the framework integrations' (Lightning's
step directories, transformers' `checkpoint-N`, accelerate's state directories).

A checkpoint counts only when every rank's completion marker exists, each names the same attempt as
the checkpoint's own record, and every file has the size its marker recorded (and, when asked, the
CRC32 it recorded). What differs between kinds is data, given here as parameters:
- `Marker`s: which markers vouch for the checkpoint and which files each must list. slurmddp's and
  Lightning's have one per rank; transformers' and accelerate's have one, written by rank 0 after
  every rank's files are durable, which stands for every rank's.
- `attempt`: the attempt the markers must name. The store's record (meta.json) names it; Lightning's
  checkpoints have no record, so their markers must agree among themselves (AGREE); a single
  marker written for every rank names none (UNCHECKED).
- `Kind`: how the marker records its files (`{"size", "crc32"}` or a bare size), whether every file
  it lists is checked or only those it must list, sentinels whose presence means a save is still
  running (transformers' JIT checkpoint leaves `checkpoint-is-incomplete.txt`), how many problems
  are worth reporting, and each kind's wording of them (`Wording`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmddp.job.checkpoint.io import file_crc32


class _AttemptRule:
    """How the markers' attempt is checked when no record names it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


CHANGED = "{problem} (truncated or replaced)"
"""slurmddp's own wording of a file missing or of another size than its marker recorded."""
AGREE = _AttemptRule("AGREE")
"""No record names the attempt: every marker must name the same one."""
UNCHECKED = _AttemptRule("UNCHECKED")
"""The markers name no attempt (one marker, written for every rank once all are done)."""


@dataclass(frozen=True)
class Wording:
    """How one kind of checkpoint words its problems. Fields: {marker} (the marker's file name),
    {rank} (the rank that writes it), {error} (why it could not be read), {required} (the files it
    must list), {unlisted} (one it does not), {found} and {expected} (attempts),
    {sentinel}, {problem} (a file's size problem)."""

    missing: str
    """The marker does not exist."""
    unreadable: str
    """The marker exists but is no JSON object."""
    malformed: str
    """The marker holds no listing of files in the form this kind writes."""
    unlisted: str
    """The marker does not list a file it must (said of each such file)."""
    other_attempt: str = "{marker} is from attempt {found!r} but meta.json from {expected!r}"
    mixed_attempts: str = "its markers come from different attempts"
    sentinel: str = "it holds {sentinel} (a save that did not finish)"
    changed: str = CHANGED
    """A file missing or of another size than recorded."""


@dataclass(frozen=True)
class Kind:
    """What differs between kinds of checkpoint in how the one rule is applied (module docstring)."""

    wording: Wording
    sentinels: tuple[str, ...] = ()
    """Files whose presence means the save did not finish."""
    bare_sizes: bool = False
    """The marker records each file as its size alone (no CRC32), not as {"size", "crc32"}."""
    every_listed: bool = False
    """Check every file the marker lists (in name order), not only the files it must list."""
    limit: int | None = None
    """Stop after the marker at which this many problems were found, adding "..."."""


@dataclass(frozen=True)
class Marker:
    """One completion marker a checkpoint needs."""

    name: str
    """Its file name in the checkpoint's directory."""
    rank: int | None = None
    """The rank that writes it; None: rank 0 writes it for every rank."""
    lists: tuple[str, ...] = ()
    """The files it must list."""


def problems(
    path: Path, kind: Kind, markers: Sequence[Marker], *, attempt: Any = AGREE, check_crc: bool = False
) -> list[str]:
    """Why the checkpoint in `path` is not complete under `kind`'s reading of the rule; empty: it
    is. `attempt`: the attempt its record names, or AGREE, or UNCHECKED."""
    for sentinel in kind.sentinels:
        if (path / sentinel).exists():
            return [kind.wording.sentinel.format(sentinel=sentinel)]
    found: list[str] = []
    attempts: set[Any] = set()
    for marker in markers:
        found += _marker_problems(path, kind, marker, attempt, attempts, check_crc=check_crc)
        if kind.limit is not None and len(found) >= kind.limit:
            found.append("...")
            break
    if attempt is AGREE and len(attempts) > 1:
        found.append(kind.wording.mixed_attempts)
    return found


def _marker_problems(
    path: Path, kind: Kind, marker: Marker, attempt: Any, attempts: set[Any], *, check_crc: bool
) -> list[str]:
    """What is wrong with one marker and the files it vouches for; adds its attempt to `attempts`."""
    words = kind.wording
    fields: dict[str, Any] = {"marker": marker.name, "rank": marker.rank, "required": ", ".join(marker.lists)}
    record, error = _read(path / marker.name)
    if record is None:
        return [(words.missing if error is None else words.unreadable).format(**fields, error=error)]
    if attempt not in (AGREE, UNCHECKED) and record.get("attempt") != attempt:
        return [words.other_attempt.format(**fields, found=record.get("attempt"), expected=attempt)]
    listed = record.get("files")
    if not isinstance(listed, dict):
        error = "'files'" if listed is None else "'files' is not an object"
        return [words.malformed.format(**fields, error=error)]
    if attempt is AGREE:
        attempts.add(record.get("attempt"))
    unlisted = [words.unlisted.format(**fields, unlisted=name) for name in marker.lists if name not in listed]
    if unlisted:
        # A wording naming every required file says it once.
        return list(dict.fromkeys(unlisted))
    names = sorted(listed) if kind.every_listed else marker.lists
    checked = (_recorded_problem(path, kind, name, listed[name], check_crc=check_crc) for name in names)
    return [problem for problem in checked if problem is not None]


def _recorded_problem(path: Path, kind: Kind, name: str, recorded: Any, *, check_crc: bool) -> str | None:
    if kind.bare_sizes:
        recorded = {"size": recorded}
    return file_problem(path, name, recorded, check_crc=check_crc, changed=kind.wording.changed)


def _read(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object at `path`, None), or (None, None) when it does not exist, or (None, why it
    cannot be read)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, str(exc)
    return (record, None) if isinstance(record, dict) else (None, "not a JSON object")


def file_problem(
    path: Path, name: str, recorded: Any, *, check_crc: bool, changed: str = CHANGED
) -> str | None:
    """What is wrong with `name` under `path` against what its marker recorded (`{"size": ...,
    "crc32": ...}`), or None. `changed` words a missing file or one of another size."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("size"), int):
        return f"no recorded size for {name}"
    problem = size_problem(path, name, recorded["size"])
    if problem is not None:
        return changed.format(problem=problem)
    if check_crc and recorded.get("crc32") is not None:
        crc = file_crc32(path / name)
        if crc != recorded["crc32"]:
            return f"{name} has CRC32 {crc}, its marker says {recorded['crc32']} (corrupt)"
    return None


def size_problem(path: Path, name: str, size: int) -> str | None:
    """Whether `name` under `path` is missing or of another size than its marker's `size`; None
    when it is there at that size."""
    try:
        found = (path / name).stat().st_size
    except OSError:
        return f"{name} is missing"
    return None if found == size else f"{name} has {found} bytes, its marker says {size}"


def newest_complete(
    candidates: Iterable[Path], problems_of: Callable[[Path], list[str]]
) -> tuple[Path | None, list[tuple[Path, list[str]]]]:
    """The first complete checkpoint of `candidates` (give them newest first; None: none is), and
    those before it, each with why it is not complete. Stops at the first complete one."""
    skipped: list[tuple[Path, list[str]]] = []
    for path in candidates:
        found = problems_of(path)
        if not found:
            return path, skipped
        skipped.append((path, found))
    return None, skipped
