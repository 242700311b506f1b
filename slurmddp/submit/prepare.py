"""The one way from a loaded experiment to a SubmissionPlan, as torchx's Runner is: every command
that submits or previews (submit, dryrun, a local sweep, resubmit, doctor's probe, the MPI launcher)
asks here, so they agree on the executor, the run directory, the interpreter and the array."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from slurmddp.cluster import slurm
from slurmddp.defaults import Executor, RunExecutor
from slurmddp.errors import SubmitError
from slurmddp.experiment.load import Loaded, SweepElement
from slurmddp.rundir.layout import new_run_dir
from slurmddp.submit.plan import SubmissionPlan, build


@dataclass(frozen=True)
class ExecutorChoice:
    executor: RunExecutor
    why: str | None = None
    """Said to the user where `auto` did not take Slurm although sbatch is there."""


def choose_executor(requested: Executor) -> ExecutorChoice:
    """`auto` means Slurm where sbatch is on PATH and a controller answers, else the local executor."""
    has_sbatch = slurm.available("sbatch")
    if requested == "slurm" and not has_sbatch:
        raise SubmitError(
            "executor is slurm but there is no sbatch on PATH; run on a login node or use executor=local"
        )
    if requested != "auto":
        return ExecutorChoice(requested)
    if not has_sbatch:
        return ExecutorChoice("local")
    silence = slurm.controller_silence()
    if silence is None:
        return ExecutorChoice("slurm")
    return ExecutorChoice(
        "local",
        f"sbatch is on PATH but no Slurm controller answers (scontrol ping: {silence}); running "
        "locally. Set executor=slurm to insist.",
    )


def resolve_executor(requested: Executor) -> RunExecutor:
    """The executor alone, for callers that plan several runs and say nothing of the choice."""
    return choose_executor(requested).executor


def interpreter() -> str:
    """The interpreter the ranks start: the one running slurmddp, so the same environment."""
    return shlex.quote(sys.executable)


def plan_for(
    loaded: Loaded,
    *,
    elements: Sequence[SweepElement] = (),
    executor: RunExecutor | None = None,
    run_dir: Path | None = None,
    workdir: Path | None = None,
    submission: int = 0,
    max_parallel: int | None = None,
) -> SubmissionPlan:
    """The plan of a run, or of a sweep of `elements` (on Slurm one array of them; without Slurm
    the elements run one after another, each planned on its own).

    By default the executor is what the experiment asks for, the run directory a new one under its
    output_dir, the working directory this one, and the array's parallelism the sweep's. A
    resubmission names the sweep directory, the submission's number in the sweep manifest, and the
    parallelism recorded there.
    """
    exp = loaded.experiment
    choice = ExecutorChoice(executor) if executor else choose_executor(exp.executor)
    chosen = choice.executor
    where = run_dir or new_run_dir(exp.output_dir, exp.name)
    array = tuple((e.loaded, where / e.dir_name) for e in elements) if chosen == "slurm" else ()
    if max_parallel is None and loaded.sweep is not None:
        max_parallel = loaded.sweep.max_parallel
    plan = build(
        loaded,
        executor=chosen,
        workdir=workdir or Path.cwd(),
        run_dir=where,
        interpreter=interpreter(),
        elements=array,
        submission=submission if array else None,
        max_parallel=max_parallel,
        slurm_version=slurm.version() if chosen == "slurm" else None,
    )
    return plan if choice.why is None else replace(plan, notes=(choice.why, *plan.notes))
