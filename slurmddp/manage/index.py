"""The user's index of submissions ($XDG_STATE_HOME/slurmddp/runs.jsonl): what `list` shows and
where a bare `status` or a job id finds its run. Written by the commands that submit."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from slurmddp.defaults import RunKind


def index_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "slurmddp" / "runs.jsonl"


def remember(run_dir: Path, kind: RunKind, name: str, job_id: str) -> None:
    """Add a submission to the user's index (best effort: a read-only home must not fail a submit)."""
    record = {"dir": str(run_dir), "kind": kind, "name": name, "job_id": job_id, "time": time.time()}
    try:
        path = index_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError:
        pass


def recent(limit: int) -> list[dict[str, Any]]:
    """The newest `limit` submissions whose directory still exists, newest first."""
    try:
        lines = index_path().read_text().splitlines()
    except OSError:
        return []
    found: list[dict[str, Any]] = []
    seen: set[str] = set()
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record["dir"] not in seen and Path(record["dir"]).is_dir():
            seen.add(record["dir"])
            found.append(record)
        if len(found) >= limit:
            break
    return found


def records() -> list[dict[str, Any]]:
    """Every submission in the index, oldest first."""
    try:
        return [json.loads(line) for line in index_path().read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []
