"""Acting on submitted runs from the login node: find a run, interrupt it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from slurmddp import yamlio
from slurmddp.attempts import INTERRUPT, PROGRESS
from slurmddp.errors import SlurmddpError
from slurmddp.fsutil import write_json
from slurmddp.submitter import MANIFEST


def resolve_run(ref: str) -> tuple[Path, str]:
    """(run directory, job id) from either of them."""
    path = Path(ref)
    if (path / MANIFEST).is_file():
        manifest = json.loads((path / MANIFEST).read_text())
        return path.resolve(), str(manifest["job_id"])
    if ref.replace("_", "").isdigit():
        command = _squeue(ref, "%o")
        # The batch script is RUN_DIR/logs/JOBID_submission.sh (submitit's folder layout).
        run_dir = Path(command).parent.parent
        if (run_dir / MANIFEST).is_file():
            return run_dir, ref
        raise SlurmddpError(f"job {ref} is not a slurmddp run (its batch script is {command})")
    raise SlurmddpError(f"{ref!r} is neither a run directory (no {MANIFEST}) nor a job id")


def interrupt(ref: str, reason: str) -> str:
    """Send the running job what Slurm sends on a preemption or near its time limit, and record
    which of the two it stands for; returns what was done."""
    run_dir, job_id = resolve_run(ref)
    state = _squeue(job_id, "%T")
    if state != "RUNNING":
        raise SlurmddpError(f"job {job_id} is {state}: only a running job can be interrupted")
    restarts = _scontrol_field(job_id, "Restarts")
    config: Any = yamlio.load((run_dir / "config.yaml").read_text())
    signal = str(config.get("requeue", {}).get("signal", "USR2"))
    write_json(run_dir / INTERRUPT, {"reason": reason, "job_id": job_id, "restart_count": int(restarts)})
    # --signal without --batch/--full reaches the steps' tasks only, as `sbatch --signal=SIG@T` does.
    proc = subprocess.run(["scancel", f"--signal={signal}", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SlurmddpError(f"scancel --signal={signal} {job_id} failed: {proc.stderr.strip()}")
    return f"sent SIG{signal} to the ranks of job {job_id} as a {reason}; run dir {run_dir}"


def last_save_seconds(output_dir: Path, name: str) -> float | None:
    """How long the newest earlier run of this experiment took to save a checkpoint, if known."""
    for progress in sorted((output_dir / name).glob(f"*/{PROGRESS}"), reverse=True):
        try:
            seconds = json.loads(progress.read_text()).get("last_save_s")
        except (OSError, ValueError):
            continue
        if seconds:
            return float(seconds)
    return None


def _squeue(job_id: str, field: str) -> str:
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", field], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SlurmddpError(f"job {job_id} is not in the queue: {proc.stderr.strip() or 'it has ended'}")
    return proc.stdout.strip().splitlines()[0]


def _scontrol_field(job_id: str, key: str) -> str:
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SlurmddpError(f"scontrol show job {job_id}: {proc.stderr.strip()}")
    for word in proc.stdout.split():
        name, _, value = word.partition("=")
        if name == key:
            return value
    raise SlurmddpError(f"scontrol show job {job_id} has no {key}")
