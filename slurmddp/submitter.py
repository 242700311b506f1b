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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
import yaml
from submitit.core.utils import FailedJobError
from submitit.slurm.slurm import _make_sbatch_string

from slurmddp import plan as planning
from slurmddp import runs
from slurmddp.attempts import SWEEP
from slurmddp.config import Element, Loaded
from slurmddp.errors import SubmitError
from slurmddp.fsutil import write_atomic, write_json
from slurmddp.rank import Rank
from slurmddp.runs import MANIFEST

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
    parameters = dict(plan.parameters)
    if len(plan.array) > 1:
        # submitit adds this itself when it submits a batch of more than one job as an array.
        parameters["map_count"] = len(plan.array)
    return str(_make_sbatch_string(command=planning.command(plan), folder=plan.folder, **parameters))


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
        raise SubmitError(f"sbatch refused the job; nothing was submitted. sbatch said:\n{said}{_hint(said)}")


def _hint(said: str) -> str:
    # Seen on 22.05.8: slurmctld logs "MaxJobCount limit from slurm.conf reached" and sbatch only
    # says this. Ended jobs (each task of a cancelled array) count until MinJobAge has passed.
    if "Resource temporarily unavailable" in said:
        return (
            "\nslurmctld is busy or holds MaxJobCount jobs (ended ones count until MinJobAge has "
            "passed); retry in a minute, or ask the admins which limit was hit"
        )
    return ""


def submit(
    plan: planning.SubmissionPlan, loaded: Loaded, argv: list[str], remember: bool = True
) -> Submission:
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
        said = str(exc)
        raise SubmitError(
            f"sbatch refused the job; nothing was submitted. sbatch said:\n{said}{_hint(said)}"
        ) from None
    except BaseException:
        shutil.rmtree(plan.run_dir, ignore_errors=True)
        raise
    manifest = {**_described(plan, loaded, argv), "job_id": str(job.job_id)}
    write_json(plan.run_dir / MANIFEST, manifest)
    if remember:
        runs.remember(plan.run_dir, "run", plan.job_name, str(job.job_id))
    return Submission(plan=plan, job=job, manifest=manifest)


def max_array_size() -> int | None:
    """The cluster's MaxArraySize: array task ids must be below it (Slurm's default is 1001)."""
    proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return None


def check_array_size(count: int, limit: int | None) -> None:
    if limit is not None and count > limit:
        raise SubmitError(
            f"the sweep has {count} elements but this cluster's MaxArraySize is {limit} (array task ids "
            f"0-{limit - 1}); nothing was submitted. Split the sweep (for example with fewer "
            "sweep.random.trials or fewer grid values) or ask the admins to raise MaxArraySize"
        )


def submit_sweep(
    plan: planning.SubmissionPlan,
    loaded: Loaded,
    elements: list[Element],
    argv: list[str],
) -> str:
    """Create the sweep directory and every element's, submit one array, record the manifest;
    returns the array job id. On refusal nothing is left behind."""
    check_array_size(len(elements), max_array_size())
    check_schedulable(plan)
    sweep_dir = plan.run_dir
    sweep_dir.mkdir(parents=True, exist_ok=False)
    try:
        manifest = sweep_manifest(plan, loaded, elements, argv)
        for element in elements:
            # Plain writes: a thousand fsyncs would dominate the submit; the manifest, written
            # durably after them, is what makes the sweep exist.
            (sweep_dir / element.dir_name).mkdir()
            (sweep_dir / element.dir_name / CONFIG).write_text(_yaml(element.loaded.resolved))
        job_id = submit_array(plan, manifest, [e.index for e in elements])
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        raise
    runs.remember(sweep_dir, "sweep", plan.job_name, job_id)
    return job_id


def sweep_manifest(
    plan: planning.SubmissionPlan, loaded: Loaded, elements: list[Element], argv: list[str]
) -> dict[str, Any]:
    """SWEEP_DIR/sweep.json's content before any submission; writes the base config beside it."""
    assert loaded.sweep is not None
    write_atomic(plan.run_dir / CONFIG, _yaml(loaded.resolved))
    return {
        **_described(plan, loaded, argv),
        "kind": "sweep",
        "max_parallel": loaded.sweep.max_parallel,
        "metric": loaded.sweep.metric,
        "mode": loaded.sweep.mode,
        "keys": list(loaded.sweep.keys),
        "elements": [{"index": e.index, "dir": e.dir_name, "overrides": e.overrides} for e in elements],
        "submissions": [],
    }


def record_submission(sweep_dir: Path, manifest: dict[str, Any], sub: Submission, index: int) -> None:
    """A local sweep runs its elements one after another, each as its own job."""
    manifest["submissions"].append(
        {"elements": [index], "job_id": sub.job_id, "submitted_at": time.time(), "logs": str(sub.plan.folder)}
    )
    write_json(sweep_dir / SWEEP, manifest)


def submit_array(plan: planning.SubmissionPlan, manifest: dict[str, Any], indices: list[int]) -> str:
    """Submit `plan.array` (the elements `indices`, in order) as submission number N of the sweep.

    The submission is recorded before sbatch: an array task may start before sbatch returns, and
    its batch script looks up its element in the manifest.
    """
    sweep_dir = plan.run_dir
    submission: dict[str, Any] = {
        "elements": indices,
        "job_id": None,
        "submitted_at": time.time(),
        "logs": str(plan.folder),
    }
    manifest["submissions"].append(submission)
    write_json(sweep_dir / SWEEP, manifest)
    executor = _executor(plan)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), executor.batch():
            jobs = [executor.submit(Rank(spec)) for spec in plan.array]
    except FailedJobError as exc:
        manifest["submissions"].pop()
        write_json(sweep_dir / SWEEP, manifest)
        said = str(exc)
        raise SubmitError(
            f"sbatch refused the sweep; nothing was submitted. sbatch said:\n{said}{_hint(said)}"
        ) from None
    # submitit names array tasks ARRAYID_TASK; a one-element batch is a plain job.
    job_id = str(jobs[0].job_id).split("_")[0]
    submission["job_id"] = job_id
    write_json(sweep_dir / SWEEP, manifest)
    return job_id


def _described(plan: planning.SubmissionPlan, loaded: Loaded, argv: list[str]) -> dict[str, Any]:
    """What a run's or a sweep's manifest says of how it was submitted."""
    return {
        "name": plan.job_name,
        "executor": plan.executor,
        "submitted_at": dt.datetime.now().isoformat(timespec="seconds"),
        "experiment": str(loaded.source.resolve()),
        "overrides": list(loaded.overrides),
        "argv": argv,
        "workdir": plan.rank.workdir,
        "run_dir": str(plan.run_dir),
        "world_size": plan.world_size,
        "logs": str(plan.folder),
    }


def _executor(plan: planning.SubmissionPlan) -> Any:
    executor: Any
    if plan.executor == "slurm":
        executor = submitit.SlurmExecutor(folder=plan.folder, python=plan.python)
    else:
        executor = submitit.LocalExecutor(folder=plan.folder, python=plan.python)
    executor.update_parameters(**plan.parameters)
    return executor


def _yaml(data: dict[str, Any]) -> str:
    # PyYAML directly: OmegaConf.to_yaml builds a config first (~20 ms each, most of a 1000-element
    # sweep's submit). The safe dumper quotes strings a YAML 1.1 reader would take for numbers.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter, ~10x faster
    return str(yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True))
