"""The one way from a loaded experiment to a SubmissionPlan, as torchx's Runner is: every command
that submits or previews (submit, dryrun, a local sweep, resubmit, doctor's probe, the MPI launcher)
asks here, so they agree on the executor, the run directory, the interpreter and the array."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from slurmddp.cluster import slurm
from slurmddp.defaults import Executor, RunExecutor
from slurmddp.errors import SlurmCommandError, SubmitError
from slurmddp.experiment.load import Loaded, SweepElement
from slurmddp.rundir.layout import new_run_dir
from slurmddp.submit.plan import LocalMachine, SubmissionPlan, build


@dataclass(frozen=True)
class ExecutorChoice:
    executor: RunExecutor
    why: str | None = None
    """Said to the user with the plan: a preview's warning that no Slurm controller answers."""


def choose_executor(requested: Executor, *, preview: bool = False) -> ExecutorChoice:
    """The executor `resolve_executor` picks; Slurm also needs a controller that answers, and
    without one this is an error that says why and how to go on, except for a `preview`, which
    plans for Slurm and warns."""
    executor = resolve_executor(requested)
    silence = slurm.controller_unreachable() if executor == "slurm" and slurm.available("scontrol") else None
    if silence is None:
        return ExecutorChoice(executor)
    if preview:
        return ExecutorChoice(
            "slurm",
            f"warning: no Slurm controller answers (scontrol ping: {silence}): submit refuses until one "
            "does; executor=local trains on this machine instead",
        )
    raise SlurmCommandError(_silent_controller(silence))


def resolve_executor(requested: Executor) -> RunExecutor:
    """`auto` means Slurm wherever any of Slurm's commands is on PATH, and the local executor only
    where none is: a machine with Slurm never trains on itself unasked. Slurm needs sbatch. The
    controller is not asked: callers that plan several runs ask sbatch, which says when none answers."""
    if requested == "local":
        return "local"
    found = slurm.installed()
    if requested == "auto" and not found:
        return "local"
    if "sbatch" not in found:
        raise SubmitError(_no_sbatch(requested, found))
    return "slurm"


def _no_sbatch(requested: Executor, found: tuple[str, ...]) -> str:
    if not found:
        return "executor is slurm but there is no sbatch on PATH; run on a login node or use executor=local"
    return (
        f"{', '.join(found)} {'is' if len(found) == 1 else 'are'} on PATH but sbatch is not: with "
        f"Slurm on this machine, executor={requested} submits to it, and cannot without sbatch; nothing "
        "was submitted. Put Slurm's bin directory on PATH, or add executor=local to train on this "
        "machine on purpose"
    )


def _silent_controller(silence: str) -> str:
    conf = os.environ.get("SLURM_CONF")
    where = f"now SLURM_CONF={conf}" if conf else "it is unset now: Slurm's default config is read"
    return (
        f"no Slurm controller answers (scontrol ping: {silence}); nothing was submitted, and this "
        "machine has Slurm's commands, so slurmddp does not train on it instead. Wait for the "
        f"controller to come back, or fix SLURM_CONF if it names the wrong cluster ({where}), then "
        "submit again; to train on this machine on purpose, add executor=local"
    )


NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
"""One entry per GPU the NVIDIA driver drives: counted without torch, which the submit side must
not import."""


def visible_gpus(present: int, visible: str | None) -> tuple[int, ...]:
    """The indices of the GPUs a local run may use, of the `present` ones, given this shell's
    CUDA_VISIBLE_DEVICES (None: unset): read as CUDA reads it, up to the first entry that names no
    present GPU by index. "" hides them all; a UUID is not followed (submitit hands GPUs on by
    index), so ranks then run on the CPU."""
    if visible is None:
        return tuple(range(present))
    gpus: list[int] = []
    for entry in (part.strip() for part in visible.split(",")):
        if not entry.isdigit() or int(entry) >= present:
            break
        gpus.append(int(entry))
    return tuple(gpus)


def machine_gpus(driver: Path = NVIDIA_GPUS, env: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The GPUs of this machine a local run may use (`visible_gpus`), by index."""
    present = sum(1 for _ in driver.iterdir()) if driver.is_dir() else 0
    return visible_gpus(present, env.get("CUDA_VISIBLE_DEVICES"))


def this_machine() -> LocalMachine:
    """What a local run's plan needs of this machine: its GPUs, and the cores this process may use
    (its affinity, which a cgroup or taskset may narrow below os.cpu_count)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return LocalMachine(gpus=machine_gpus(), cores=cores)


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
    preview: bool = False,
) -> SubmissionPlan:
    """The plan of a run, or of a sweep of `elements` (on Slurm one array of them; without Slurm
    the elements run one after another, each planned on its own).

    By default the executor is what the experiment asks for, the run directory a new one under its
    output_dir, the working directory this one, and the array's parallelism the sweep's. A
    resubmission names the sweep directory, the submission's number in the sweep manifest, and the
    parallelism recorded there. A `preview` (dryrun) is planned for Slurm even where no controller
    answers, with a warning among its notes.

    Where the executor is chosen here (the command's own plan, not a sweep element's planned again
    with its executor named), the plan's warnings are said on stderr, once, before anything runs.
    """
    exp = loaded.experiment
    choice = ExecutorChoice(executor) if executor else choose_executor(exp.executor, preview=preview)
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
        machine=this_machine() if chosen == "local" else LocalMachine(),
    )
    if executor is None:
        for warning in plan.warnings:
            print(f"slurmddp: warning: {warning}", file=sys.stderr)
    return plan if choice.why is None else replace(plan, notes=(choice.why, *plan.notes))
