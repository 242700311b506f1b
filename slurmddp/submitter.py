"""SubmissionPlan -> a job: the only module that talks to submitit and writes the run directory."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import secrets
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError
from submitit.slurm.slurm import _make_sbatch_string

from slurmddp import plan as planning
from slurmddp.config import Loaded
from slurmddp.errors import SubmitError
from slurmddp.fsutil import write_atomic, write_json
from slurmddp.rank import Rank

MANIFEST = "manifest.json"
CONFIG = "config.yaml"


@dataclass(frozen=True)
class Submission:
    plan: planning.SubmissionPlan
    job: Any
    """The submitit job (SlurmJob or LocalJob)."""
    manifest: dict[str, Any]

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    def log_path(self, task: int, stream: str = "out") -> Path:
        return self.plan.folder / f"{self.job_id}_{task}_log.{stream}"


def resolve_executor(requested: str) -> str:
    """`auto` means Slurm where sbatch is on PATH, else the local executor."""
    has_sbatch = shutil.which("sbatch") is not None
    if requested == "auto":
        return "slurm" if has_sbatch else "local"
    if requested == "slurm" and not has_sbatch:
        raise SubmitError(
            "executor is slurm but there is no sbatch on PATH; run on a login node or use executor=local"
        )
    return requested


def new_run_dir(output_dir: str, name: str, now: dt.datetime | None = None) -> Path:
    """OUTPUT_DIR/NAME/YYYYmmdd-HHMMSS-xxxx, absolute: the ranks run elsewhere."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return (Path(output_dir) / name / f"{stamp}-{secrets.token_hex(2)}").resolve()


def interpreter() -> str:
    """The interpreter the ranks start: the one running slurmddp, so the same environment."""
    return shlex.quote(sys.executable)


def sbatch_script(plan: planning.SubmissionPlan) -> str:
    """The batch script submitit writes for this plan, byte for byte."""
    # submitit's own renderer (module-level, underscore-named): rendering it ourselves would drift
    # from what submitit submits; tests/test_cluster.py compares it with a submitted script.
    return str(_make_sbatch_string(command=planning.command(plan), folder=plan.folder, **plan.parameters))


def check_schedulable(plan: planning.SubmissionPlan) -> None:
    """Ask Slurm whether it could ever run the job, before submitting it.

    Slurm 22.05 (without EnforcePartLimits) accepts a job that asks for more nodes, CPUs or GPUs
    than its partition has, and leaves it pending forever with reason PartitionConfig; `sbatch
    --test-only` refuses it in ~10 ms and says why.
    """
    proc = subprocess.run(
        ["sbatch", "--test-only"], input=sbatch_script(plan), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        said = proc.stderr.strip() or proc.stdout.strip()
        raise SubmitError(f"sbatch refused the job; nothing was submitted. sbatch said:\n{said}")


def submit(plan: planning.SubmissionPlan, loaded: Loaded, argv: list[str]) -> Submission:
    """Create the run directory, submit, record the manifest; on refusal leave nothing behind."""
    if plan.executor == "slurm":
        check_schedulable(plan)
    plan.run_dir.mkdir(parents=True, exist_ok=False)
    try:
        write_atomic(plan.run_dir / CONFIG, _yaml(loaded.resolved))
        executor = _executor(plan)
        stderr = io.StringIO()
        # submitit prints sbatch's stderr itself before raising; it is shown once, in our error.
        with contextlib.redirect_stderr(stderr):
            job = executor.submit(Rank(plan.rank))
    except FailedJobError as exc:
        shutil.rmtree(plan.run_dir, ignore_errors=True)
        raise SubmitError(f"sbatch refused the job; nothing was submitted. sbatch said:\n{exc}") from None
    except BaseException:
        shutil.rmtree(plan.run_dir, ignore_errors=True)
        raise
    manifest = {
        "name": plan.job_name,
        "executor": plan.executor,
        "job_id": str(job.job_id),
        "submitted_at": dt.datetime.now().isoformat(timespec="seconds"),
        "experiment": str(loaded.source.resolve()),
        "overrides": list(loaded.overrides),
        "argv": argv,
        "workdir": plan.rank.workdir,
        "run_dir": str(plan.run_dir),
        "world_size": plan.world_size,
        "logs": str(plan.folder),
    }
    write_json(plan.run_dir / MANIFEST, manifest)
    return Submission(plan=plan, job=job, manifest=manifest)


def _executor(plan: planning.SubmissionPlan) -> Any:
    executor: Any
    if plan.executor == "slurm":
        executor = submitit.SlurmExecutor(folder=plan.folder, python=plan.python)
    else:
        executor = submitit.LocalExecutor(folder=plan.folder, python=plan.python)
    executor.update_parameters(**plan.parameters)
    return executor


def _yaml(data: dict[str, Any]) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(data))
