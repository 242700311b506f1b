"""SubmissionPlan -> a job: the only module that hands work to submitit and creates run directories.

It does not remember submissions in the user's index (`manage.index`): the commands that submit
do, so that submitting needs nothing from the login-node side that reads runs back."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError

from slurmddp.cluster import runtimes, slurm
from slurmddp.defaults import OUTPUT_DIR_MODES
from slurmddp.errors import ConfigError, SubmitError
from slurmddp.experiment.load import Loaded, SweepElement
from slurmddp.experiment.schema import Experiment
from slurmddp.files import make_dirs, no_group_write, remove_dirs
from slurmddp.job.rank import Rank
from slurmddp.rundir.config import replace_config, restore_config, write_config
from slurmddp.rundir.manifest import (
    ElementEntry,
    RunManifest,
    StudySettings,
    Submitted,
    SweepManifest,
    SweepSubmission,
    submitted_fields,
)
from slurmddp.rundir.trial import TrialRecord
from slurmddp.search import study as studies
from slurmddp.search.study import StudyRef
from slurmddp.submit.plan import SubmissionPlan


@dataclass(frozen=True)
class Submission:
    plan: SubmissionPlan
    job: Any
    """The submitit job (SlurmJob or LocalJob)."""
    manifest: RunManifest

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    def log_path(self, task: int, stream: str = "out") -> Path:
        return self.plan.folder / f"{self.job_id}_{task}_log.{stream}"


def check_schedulable(plan: SubmissionPlan) -> None:
    """Ask Slurm whether it could ever run the job, before submitting it.

    Slurm 22.05 (without EnforcePartLimits) accepts a job that asks for more nodes, CPUs or GPUs
    than its partition has, and leaves it pending forever with reason PartitionConfig; `sbatch
    --test-only` refuses it in ~10 ms and says why. Ranks in a container need its runtime on the
    cluster first (cluster/runtimes.py).
    """
    if plan.containers:
        offered = runtimes.offered(runtimes.srun_help, slurm.parse_config(slurm.show_config()))
        for runtime in plan.containers:
            offered.require(runtime)
    said = slurm.test_only(plan.batch_script())
    if said is not None:
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


def make_run_dir(run_dir: Path, exp: Experiment, folder: Path | None = None) -> list[Path]:
    """Create a run or sweep directory, OUTPUT_DIR/NAME where missing, and submitit's `folder`
    inside it, with the permissions `output_mode` gives; the directories created, for `discard`.

    The first thing a submission does: a path that cannot be created is a mistake in the config,
    refused with the OS's reason before Slurm is asked anything, and nothing is left behind.
    """
    mode = OUTPUT_DIR_MODES[exp.output_mode]
    created: list[Path] = []
    try:
        created = make_dirs(run_dir, mode)
        if folder is not None:
            created += make_dirs(folder, mode)
    except OSError as exc:
        remove_dirs(created)
        raise ConfigError(cannot_create(exp.output_dir, run_dir, exc)) from None
    return created


def cannot_create(output_dir: str, run_dir: Path, exc: OSError) -> str:
    """What to say when the run directory `run_dir` under `output_dir` cannot be created."""
    reason = exc.strerror or str(exc)
    where = f": {exc.filename}" if exc.filename else ""
    return (
        f"output_dir: cannot create the run directory {run_dir} (output_dir={output_dir!r}): "
        f"{reason}{where}; nothing was submitted. Set output_dir, in the experiment or as "
        "output_dir=PATH, to a directory you can create and write, on a filesystem the nodes share"
    )


def discard(run_dir: Path, created: list[Path]) -> None:
    """Remove a run directory that was never submitted, and the parents `make_run_dir` created."""
    shutil.rmtree(run_dir, ignore_errors=True)
    remove_dirs(created)


def submit(
    plan: SubmissionPlan, loaded: Loaded, argv: list[str], trial: TrialRecord | None = None
) -> Submission:
    """Create the run directory, submit, record the manifest; on refusal leave nothing behind.
    `trial`: the search's trial the run is, recorded before its ranks start."""
    created = make_run_dir(plan.run_dir, loaded.experiment, plan.folder)
    try:
        if plan.executor == "slurm":
            check_schedulable(plan)
        write_config(plan.run_dir, loaded.resolved)
        if trial is not None:
            trial.write(plan.run_dir)
        executor = _executor(plan)
        stderr = io.StringIO()
        # submitit prints sbatch's stderr itself before raising; it is shown once, in our error.
        # The job pickle it writes must not be group-writable, or the ranks refuse it (job.trust).
        with contextlib.redirect_stderr(stderr), no_group_write():
            job = executor.submit(Rank(plan.rank))
    except FailedJobError as exc:
        discard(plan.run_dir, created)
        said = str(exc)
        raise SubmitError(
            f"sbatch refused the job; nothing was submitted. sbatch said:\n{said}{_hint(said)}"
        ) from None
    except BaseException:
        discard(plan.run_dir, created)
        raise
    manifest = RunManifest.of(_described(plan, loaded, argv), str(job.job_id))
    manifest.write(plan.run_dir)
    return Submission(plan=plan, job=job, manifest=manifest)


def resubmit(plan: SubmissionPlan, loaded: Loaded, manifest: RunManifest, argv: list[str]) -> Submission:
    """Submit a run again in its own directory (it resumes from its checkpoints) with the config
    `loaded`, which replaces config.yaml. A refusal puts the old config back and removes nothing:
    the directory holds the run's checkpoints."""
    before = replace_config(plan.run_dir, loaded.resolved)
    try:
        executor = _executor(plan)
        with contextlib.redirect_stderr(io.StringIO()), no_group_write():
            job = executor.submit(Rank(plan.rank))
    except BaseException as exc:
        restore_config(plan.run_dir, before)
        if isinstance(exc, FailedJobError):
            said = str(exc)
            raise SubmitError(
                f"sbatch refused the job; nothing was submitted. sbatch said:\n{said}{_hint(said)}"
            ) from None
        raise
    at = dt.datetime.now().isoformat(timespec="seconds")
    updated = manifest.resubmitted(str(job.job_id), plan.world_size, at, argv)
    updated.write(plan.run_dir)
    return Submission(plan=plan, job=job, manifest=updated)


def check_array_size(count: int, limit: int | None) -> None:
    """Refuse a sweep larger than the cluster's MaxArraySize, before anything is submitted."""
    if limit is not None and count > limit:
        raise SubmitError(
            f"the sweep has {count} elements but this cluster's MaxArraySize is {limit} (array task ids "
            f"0-{limit - 1}); nothing was submitted. Split the sweep (for example with fewer "
            "sweep.random.trials or fewer grid values) or ask the admins to raise MaxArraySize"
        )


def submit_sweep(plan: SubmissionPlan, loaded: Loaded, elements: list[SweepElement], argv: list[str]) -> str:
    """Create the sweep directory and every element's, submit one array, record the manifest;
    returns the array job id. On refusal nothing is left behind."""
    sweep_dir = plan.run_dir
    created = make_run_dir(sweep_dir, loaded.experiment, plan.folder)
    mode = OUTPUT_DIR_MODES[loaded.experiment.output_mode]
    try:
        check_array_size(len(elements), slurm.max_array_size())
        check_schedulable(plan)
        manifest = sweep_manifest(plan, loaded, elements, argv)
        for element in elements:
            # Plain writes: a thousand fsyncs would dominate the submit; the manifest, written
            # durably after them, is what makes the sweep exist.
            make_dirs(sweep_dir / element.dir_name, mode)
            write_config(sweep_dir / element.dir_name, element.loaded.resolved, durable=False)
        job_id = submit_array(plan, manifest, [e.index for e in elements])
    except BaseException:
        discard(sweep_dir, created)
        raise
    if loaded.sweep is not None and loaded.sweep.then is not None:
        _queue_then(plan, loaded.experiment, job_id)
    return job_id


def _queue_then(plan: SubmissionPlan, exp: Experiment, array_id: str) -> None:
    """The job that submits `sweep.then` once every array task ended: one core, a few minutes,
    charged as the sweep is. Refused, the array is cancelled too: nothing is half-submitted."""
    res = exp.resources
    options = ["-J", f"{plan.job_name}-then", "-n", "1", "-c", "1", "-t", "10", "--chdir", plan.rank.workdir]
    options += ["-o", str(plan.folder / "then-%j.out")]
    for flag, value in (("--partition", res.partition), ("--account", res.account), ("--qos", res.qos)):
        if value:
            options.append(f"{flag}={value}")
    command = f"{shlex.quote(sys.executable)} -m slurmddp then {shlex.quote(str(plan.run_dir))}"
    try:
        then_job = slurm.submit_after(command, array_id, options)
    except BaseException:
        slurm.cancel_quietly(array_id)
        raise
    manifest = SweepManifest.read(plan.run_dir)
    dataclasses.replace(manifest, then_job=then_job).write(plan.run_dir)


def sweep_manifest(
    plan: SubmissionPlan, loaded: Loaded, elements: list[SweepElement], argv: list[str]
) -> SweepManifest:
    """SWEEP_DIR/sweep.json's content before any submission; writes the base config beside it,
    and makes a search's study (a storage, sampler or pruner Optuna refuses stops it here)."""
    sweep = loaded.sweep
    assert sweep is not None
    write_config(plan.run_dir, loaded.resolved)
    search = None
    if sweep.search is not None:
        assert sweep.metric is not None
        ref = StudyRef.of(sweep.search, plan.run_dir, plan.job_name, sweep.metric, sweep.mode)
        studies.create(ref)
        search = ref.to_manifest()
    return SweepManifest(
        **submitted_fields(_described(plan, loaded, argv)),
        max_parallel=sweep.max_parallel,
        metric=sweep.metric,
        mode=sweep.mode,
        keys=list(sweep.keys),
        elements=[ElementEntry(e.index, e.dir_name, e.overrides) for e in elements],
        search=search,
        then=sweep.then,
    )


def study_manifest(
    plan: SubmissionPlan,
    loaded: Loaded,
    argv: list[str],
    elements: list[ElementEntry],
    study: StudySettings,
) -> SweepManifest:
    """STUDY_DIR/sweep.json of a scaling study: a sweep whose elements are jobs of their own (each
    size asks Slurm for other resources), so status, logs and cancel treat it as one."""
    write_config(plan.run_dir, loaded.resolved)
    return SweepManifest(
        **submitted_fields(_described(plan, loaded, argv)),
        max_parallel=1,
        metric=None,
        mode="max",
        keys=sorted({key for e in elements for key in e.overrides}),
        elements=elements,
        study=study,
    )


def record_submission(sweep_dir: Path, manifest: SweepManifest, sub: Submission, index: int) -> SweepManifest:
    """A local sweep (and every study) runs its elements one by one, each as its own job; the
    manifest with this one's submission, as written."""
    updated = manifest.with_submission(
        SweepSubmission([index], sub.job_id, time.time(), str(sub.plan.folder))
    )
    updated.write(sweep_dir)
    return updated


def submit_array(plan: SubmissionPlan, manifest: SweepManifest, indices: list[int]) -> str:
    """Submit `plan.array` (the elements `indices`, in order) as submission number N of the sweep.

    The submission is recorded before sbatch: an array task may start before sbatch returns, and
    its batch script looks up its element in the manifest.
    """
    sweep_dir = plan.run_dir
    manifest = manifest.with_submission(SweepSubmission(indices, None, time.time(), str(plan.folder)))
    manifest.write(sweep_dir)
    executor = _executor(plan)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), no_group_write(), executor.batch():
            jobs = [executor.submit(Rank(spec)) for spec in plan.array]
    except FailedJobError as exc:
        manifest.without_last_submission().write(sweep_dir)
        said = str(exc)
        raise SubmitError(
            f"sbatch refused the sweep; nothing was submitted. sbatch said:\n{said}{_hint(said)}"
        ) from None
    # submitit names array tasks ARRAYID_TASK; a one-element batch is a plain job.
    job_id = str(jobs[0].job_id).split("_")[0]
    manifest.with_last_job(job_id).write(sweep_dir)
    return job_id


def _described(plan: SubmissionPlan, loaded: Loaded, argv: list[str]) -> Submitted:
    """What a run's or a sweep's manifest says of how it was submitted."""
    return Submitted(
        name=plan.job_name,
        executor=plan.executor,
        submitted_at=dt.datetime.now().isoformat(timespec="seconds"),
        experiment=str(loaded.source.resolve()),
        overrides=list(loaded.overrides),
        argv=argv,
        workdir=plan.rank.workdir,
        run_dir=str(plan.run_dir),
        world_size=plan.world_size,
        logs=str(plan.folder),
        after=plan.after,
    )


def _executor(plan: SubmissionPlan) -> Any:
    executor: Any
    if plan.executor == "slurm":
        executor = submitit.SlurmExecutor(folder=plan.folder, python=plan.python)
    else:
        executor = submitit.LocalExecutor(folder=plan.folder, python=plan.python)
    executor.update_parameters(**plan.parameters)
    return executor
