"""What ran, per attempt: RUN_DIR/provenance/JOBID-RESTART.json (+ .diff when the code was dirty).

Written by rank 0 at the start of every attempt, since code, packages and nodes can all change
between a job's attempts (a requeued job runs whatever the shared filesystem holds by then).
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmddp.cluster import hostlist, slurm
from slurmddp.errors import HostlistError
from slurmddp.files import write_atomic, write_json
from slurmddp.rundir.layout import PROVENANCE

PACKAGES = ("slurmddp", "torch", "submitit", "omegaconf", "numpy", "mpi4py")


def collect(workdir: Path, env: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """The provenance record and the working tree's diff against its commit ("" when clean)."""
    commit = _git(workdir, "rev-parse", "HEAD")
    diff = _git(workdir, "diff", "HEAD", "--no-color") if commit else None
    untracked = _git(workdir, "ls-files", "--others", "--exclude-standard") if commit else None
    record = {
        "time": time.time(),
        "workdir": str(workdir),
        "git": None
        if commit is None
        else {
            "commit": commit.strip(),
            "dirty": bool((diff or "").strip() or (untracked or "").strip()),
            "untracked": (untracked or "").split(),
        },
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "slurm": slurm.version_text(),
        "host": socket.gethostname(),
        "nodes": _nodes(env.get("SLURM_JOB_NODELIST", "")),
        "array_task": env.get("SLURM_ARRAY_TASK_ID"),
    }
    return record, diff or ""


def record(
    run_dir: Path, workdir: Path, env: Mapping[str, str], config: dict[str, Any], job_id: str, restart: int
) -> Path:
    """Write the record of attempt `restart` of job `job_id` (with the resolved config)."""
    data, diff = collect(workdir, env)
    data.update(config=config, job_id=job_id, restart_count=restart)
    name = f"{job_id}-{restart}"
    path = run_dir / PROVENANCE / f"{name}.json"
    if diff:
        write_atomic(run_dir / PROVENANCE / f"{name}.diff", diff)
        data["git"]["diff_file"] = f"{name}.diff"
    write_json(path, data)
    return path


def _git(workdir: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(workdir), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nodes(nodelist: str) -> list[str]:
    try:
        return hostlist.expand(nodelist) if nodelist else [socket.gethostname()]
    except HostlistError:
        return [nodelist]
