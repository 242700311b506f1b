"""Helpers shared by the benchmarks that drive the lab cluster through `python -m slurmddp`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ROOT / "examples" / "synthetic.yaml"
# The lab's own daemon control (tests/lab_control.py) and process finding (tests/lab_processes.py),
# which the tests use too.
sys.path.insert(0, str(ROOT / "tests"))

from lab_processes import resident_task  # noqa: E402


def submit(out: Path, *overrides: str, experiment: Path = SYNTHETIC) -> Path:
    """Submit `experiment` (the synthetic example) with `overrides`; return its run directory."""
    before = set(out.glob("*/*/manifest.json"))
    subprocess.run(
        [sys.executable, "-m", "slurmddp", "submit", str(experiment), *overrides, f"output_dir={out}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (manifest,) = set(out.glob("*/*/manifest.json")) - before
    if json.loads(manifest.read_text())["executor"] == "local":
        raise SystemExit("no Slurm answered (SLURM_CONF unset, or the lab down): the run went local")
    return manifest.parent


def job_id(run: Path) -> str:
    return str(json.loads((run / "manifest.json").read_text())["job_id"])


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for(what: str, check: Any, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)
    return value


def ends(run: Path) -> list[dict[str, Any]]:
    path = run / "attempts.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["event"] == "end"]


def step(run: Path) -> int:
    progress = read_json(run / "progress.json")
    return int(progress["step"]) if progress else -1


def gone(job: str) -> bool:
    return not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()


def state(job: str) -> str:
    """The job's state in squeue, "" once it has left the queue."""
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout
    return out.strip()


def run_processes(run: Path, variable: str) -> dict[int, int]:
    """The processes of `run`'s ranks whose environment holds `variable` (e.g. SLURM_NODEID=1), by
    PID, with their parents': the ranks and their forked loader workers, not srun."""
    logs, wanted = str(run / "logs").encode(), variable.encode()
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if any(arg.endswith(b"srun") for arg in cmdline):
            continue
        if b"submitit.core._submit" in cmdline and logs in cmdline and wanted in environ:
            found[int(entry.name)] = parent
    return found


def rank_processes(run: Path, variable: str) -> list[int]:
    """`run_processes` without the tasks that stay (requeue.resident_launcher): the ranks and
    their loader workers only."""
    found = run_processes(run, variable)
    return [pid for pid, parent in found.items() if parent in found or not resident_task(pid)]


def rank_pid(run: Path, rank: int) -> int:
    """The main process of one rank of `run` (srun and a rank's forked children left out); with
    requeue.resident_launcher, the task's child, not the task that stays."""
    found = run_processes(run, f"SLURM_PROCID={rank}")
    mains = [pid for pid, parent in found.items() if parent not in found]
    if len(mains) == 1 and resident_task(mains[0]):
        mains = [pid for pid, parent in found.items() if parent == mains[0]]
    if len(mains) != 1:
        raise SystemExit(f"rank {rank} of {run}: found processes {found}")
    return mains[0]


def records(run: Path) -> list[dict[str, Any]]:
    path = run / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def requeued(job: str) -> bool:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-P", "-j", job, "-o", "State"], capture_output=True, text=True
    ).stdout
    return "REQUEUED" in out


def digest(run: Path) -> str:
    return str(json.loads((run / "result.json").read_text())["result"]["param_sha256"])


INTERVAL_SAID = "slurmddp: in-memory snapshots every "
"""How rank 0's line saying the snapshot interval starts."""


def interval_said(run: Path) -> str:
    """The first snapshot interval rank 0 said ("every N steps (why)"); "" where none."""
    return next((f"every {rest}" for rest in rank_0_said(run, INTERVAL_SAID)), "")


def rank_0_said(run: Path, prefix: str) -> list[str]:
    """The rest of each line of rank 0's logs (every attempt's) that starts with `prefix`."""
    return [
        line.removeprefix(prefix)
        for log in sorted((run / "logs").glob("*_0_log.out"))
        for line in log.read_text().splitlines()
        if line.startswith(prefix)
    ]
