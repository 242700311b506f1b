"""The processes of a local run, found in /proc: submitit's local controller and its tasks (the
ranks), and nothing else.

submitit 1.5's LocalExecutor starts a controller (`python -m submitit.local._local LOGS`) whose
process id is the job id (the name of every log file in LOGS: `JOBID_RANK_log.out`); the
controller starts one task per rank as its own children, each running `... -m
submitit.core._submit LOGS` with SUBMITIT_LOCAL_JOB_ID=JOBID, and starts them again after a rank
exits with LOCAL_REQUEUE_STATUS. A process counts as a rank of the run only when all of that holds:
its parent is the run's controller (not a process that reuses an old job id: its command line
names the run's LOGS), its command line names LOGS, and its environment the job id. A rank's
forked DataLoader workers share its command line and environment but not its parent, and a script
rank's child runs `slurmddp.job.script.scriptrun`: neither is taken for a rank.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

CONTROLLER = b"submitit.local._local"
TASK = b"submitit.core._submit"
SCRIPT = b"slurmddp.job.script.scriptrun"


@dataclass(frozen=True)
class Task:
    pid: int
    rank: int
    catches: frozenset[int]
    """The signals the process has a handler for (its stop-signal flag once it is installed)."""
    script_catches: frozenset[int] | None = None
    """A script rank's script (job/script/scriptrun.py, the rank's child): the signals it has a handler
    for; None while it has not been started."""


def controller(job_id: str, logs: Path, proc: Path = Path("/proc")) -> int | None:
    """The process id of the run's controller while it runs; None once it has ended."""
    if not job_id.isdigit():
        return None
    found = _cmdline(proc / job_id)
    if found is not None and CONTROLLER in found and _names(found, logs):
        return int(job_id)
    return None


def is_controller(job_id: str, proc: Path = Path("/proc")) -> bool:
    """Whether the process `job_id` is a submitit local controller (of whichever run)."""
    found = _cmdline(proc / job_id) if job_id.isdigit() else None
    return found is not None and CONTROLLER in found


def tasks(job_id: str, logs: Path, proc: Path = Path("/proc")) -> list[Task]:
    """The rank processes the run's controller runs now (none once it has ended), by rank."""
    parent = controller(job_id, logs, proc)
    if parent is None:
        return []
    statuses = {
        int(entry.name): status
        for entry in proc.iterdir()
        if entry.name.isdigit() and (status := _status(entry)) is not None
    }
    found = []
    for pid, status in statuses.items():
        if status.get("PPid") != str(parent):
            continue
        cmdline = _cmdline(proc / str(pid))
        if cmdline is None or TASK not in cmdline or not _names(cmdline, logs):
            continue
        environ = _environ(proc / str(pid))
        if environ is None or environ.get("SUBMITIT_LOCAL_JOB_ID") != job_id:
            continue
        rank = environ.get("SUBMITIT_LOCAL_GLOBALID", "")
        if not rank.isdigit():
            continue
        scripts = [
            _caught(child.get("SigCgt", "0"))
            for child_pid, child in statuses.items()
            if child.get("PPid") == str(pid) and SCRIPT in (_cmdline(proc / str(child_pid)) or [])
        ]
        caught = _caught(status.get("SigCgt", "0"))
        found.append(Task(pid, int(rank), caught, scripts[0] if scripts else None))
    return sorted(found, key=lambda task: task.rank)


def world_size(job_id: str, logs: Path, proc: Path = Path("/proc")) -> int | None:
    """How many tasks the controller runs (its SUBMITIT_LOCAL_NTASKS); None once it has ended."""
    parent = controller(job_id, logs, proc)
    environ = _environ(proc / str(parent)) if parent is not None else None
    count = environ.get("SUBMITIT_LOCAL_NTASKS", "") if environ is not None else ""
    return int(count) if count.isdigit() else None


def send(pids: list[int], signum: int) -> list[int]:
    """Signal each process; the ones that were still there."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue
        sent.append(pid)
    return sent


def signal_number(name: str) -> int:
    """USR2 -> SIGUSR2's number."""
    return int(getattr(signal, f"SIG{name}"))


def _names(cmdline: list[bytes], logs: Path) -> bool:
    """Whether an argument of `cmdline` is the folder `logs` (as given, or resolved)."""
    return bool({str(logs).encode(), str(logs.resolve()).encode()} & set(cmdline))


def _cmdline(entry: Path) -> list[bytes] | None:
    try:
        return (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None


def _environ(entry: Path) -> dict[str, str] | None:
    """The environment the process started with (another user's: None, it cannot be read)."""
    try:
        data = (entry / "environ").read_bytes()
    except OSError:
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in data.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def _status(entry: Path) -> dict[str, str] | None:
    try:
        text = (entry / "status").read_text()
    except OSError:
        return None
    fields = (line.partition(":") for line in text.splitlines())
    return {key: value.strip() for key, _, value in fields}


def _caught(mask: str) -> frozenset[int]:
    """/proc's SigCgt (hex; bit N-1 for signal N) as signal numbers."""
    try:
        bits = int(mask, 16)
    except ValueError:
        return frozenset()
    return frozenset(n + 1 for n in range(64) if bits >> n & 1)
