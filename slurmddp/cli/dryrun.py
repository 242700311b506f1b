"""`slurmddp dryrun`: what `submit` would do, printed, with nothing submitted: the exact batch
script (or the local command) and the environment of the first and last rank."""

from __future__ import annotations

import shlex
from typing import TextIO

from slurmddp.cluster.generations import Version, shown
from slurmddp.experiment.load import Loaded, SweepElement
from slurmddp.experiment.sweep import describe
from slurmddp.job.process import distenv
from slurmddp.submit.plan import SubmissionPlan, command, task_env

PREVIEW_JOB_ID = 12345


def rank_env(plan: SubmissionPlan, rank: int, job_id: int = PREVIEW_JOB_ID) -> dict[str, str]:
    """The variables rank `rank` of this plan gets as job `job_id` on nodes node[1-N]."""
    dist = distenv.from_environment(task_env(plan, rank, job_id), port=plan.rank.dist.port)
    env = distenv.rank_env(dist)
    env.update(plan.rank.env)
    return env


def _written_for(version: Version | None) -> str:
    if version is not None:
        return f"# slurmddp: written for Slurm {shown(version)} (sbatch --version)"
    # What cluster.generations.exports_srun_cpus assumes of an unknown release.
    return (
        "# slurmddp: warning: the Slurm release could not be found (sbatch --version printed none); "
        "written for any release from 22.05 on: the script exports SRUN_CPUS_PER_TASK, which 22.05 "
        "and 23.02 need and later releases ignore"
    )


def show(loaded: Loaded, elements: list[SweepElement], plan: SubmissionPlan, out: TextIO) -> None:
    lines = [f"# slurmddp: {note}" for note in plan.notes]
    if plan.rank.function is None:
        # The rank's own interpreter runs it, which may not be this one: shown as `python`.
        run = shlex.join(["python", *plan.rank.command()[1:]])
        lines.append(f"# slurmddp: each rank runs `{run}` in {plan.rank.workdir}, with torchrun's variables")
    if loaded.sweep is not None:
        lines.append(f"# ---- sweep: {len(elements)} elements ({loaded.sweep.kind}) ----")
        lines += [f"# {element.dir_name}: {describe(element.overrides)}" for element in elements]
    if plan.executor == "slurm":
        lines.append(_written_for(plan.slurm_version))
        lines += ["# ---- batch script (sbatch) ----", plan.batch_script()]
    else:
        lines += [f"# ---- local executor: {plan.world_size} processes, each running ----", command(plan)]
    for rank in sorted({0, plan.world_size - 1}):
        job = f"as job {PREVIEW_JOB_ID}; MASTER_PORT follows the job id"
        lines.append(f"# ---- environment of rank {rank} ({job}) ----")
        lines += [f"{key}={value}" for key, value in sorted(rank_env(plan, rank).items())]
    lines.append(f"# nothing was submitted; the run directory would be {plan.run_dir}")
    out.write("\n".join(lines) + "\n")
