"""What changed between the Slurm releases slurmddp is tested on (22.05 and 24.11) in what a batch
script means or what a setting is called, each with the words of Slurm's NEWS (the upstream
changelog shipped with 24.11.5's source) and what slurmddp does about it. Pure: a version in,
facts out; `slurm.version()` reads the version once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]


@dataclass(frozen=True)
class Change:
    since: Version
    """The first release that behaves the new way."""
    name: str
    said: str
    """Slurm's own words (NEWS, or where NEWS is silent, what the man pages and a run showed)."""
    handled: str
    """What slurmddp does about it."""
    setting: str | None = None
    """Its key in `scontrol show config`, when it is a setting."""


SRUN_CPUS_FROM_ENV: Version = (23, 11, 0)
"""From here srun reads SLURM_CPUS_PER_TASK again; 22.05 and 23.02 read SRUN_CPUS_PER_TASK only."""

CHANGES = (
    Change(
        (22, 5, 0),
        "srun and --cpus-per-task",
        'NEWS 22.05.0rc1: "Make it so srun no longer inherits SLURM_CPUS_PER_TASK. It now will only '
        'inherit SRUN_CPUS_PER_TASK."',
        "before 23.11 the batch script exports SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK, so srun's "
        "tasks (the ranks) get resources.cpus_per_task CPUs for their loader workers and threads, "
        "as they do from 23.11 on",
    ),
    Change(
        SRUN_CPUS_FROM_ENV,
        "srun and --cpus-per-task",
        'NEWS 23.11.0rc1: "Replace SRUN_CPUS_PER_TASK with SLURM_CPUS_PER_TASK and get back the '
        'previous behavior before Slurm 22.05 since now we have the new external launcher step."',
        "nothing exported: srun takes the job's SLURM_CPUS_PER_TASK itself",
    ),
    Change(
        (23, 11, 0),
        "GPUs per task in the tasks' environment",
        'NEWS 23.11.0rc1: "Requesting --cpus-per-task will now set SLURM_TRES_PER_TASK=cpu:# in the '
        "environment.\" Seen on 24.11.5: a --gpus-per-task job's tasks have SLURM_TRES_PER_TASK="
        '"cpu=2,gres/gpu=1" and no SLURM_GPUS_PER_TASK (22.05.8 sets SLURM_GPUS_PER_TASK)',
        "a rank takes resources.gpu_binding=task from either variable (job.distenv.gpus_per_task)",
    ),
    Change(
        (23, 2, 0),
        "MaxBatchRequeue",
        'NEWS 23.02.0rc1: "Add configurable job requeue limit parameter - MaxBatchRequeue - in '
        'slurm.conf to permit changes from the old hard-coded value of 5."',
        "doctor shows it; it limits Slurm's own requeues of a batch job that failed to launch, not "
        "the `scontrol requeue` of a stopped attempt, whose budgets are requeue.max_*",
        "MaxBatchRequeue",
    ),
    Change(
        (23, 11, 0),
        "TreeWidth",
        'NEWS 23.11.0rc1: "Change TreeWidth default from 50 to 16."',
        "nothing: slurmddp does not depend on slurmctld's message fan-out",
        "TreeWidth",
    ),
    Change(
        (23, 11, 0),
        "PriorityType",
        'NEWS 23.11.0rc1: "Changed default value of PriorityType from priority/basic to '
        'priority/multifactor."',
        "nothing: a scaling study orders its jobs by --dependency=afterany, not by priority",
        "PriorityType",
    ),
    Change(
        (23, 2, 0),
        "preempt_send_user_signal",
        "NEWS is silent (so the release that renamed it is not known here; 23.02 is the first after "
        "22.05); 22.05.8's slurm.conf(5) documents SlurmctldParameters=preempt_send_user_signal, "
        "24.11.5's documents PreemptParameters=send_user_signal, and 24.11.5's slurmctld reads both "
        "(src/slurmctld/node_scheduler.c)",
        "doctor accepts either spelling",
        "PreemptParameters",
    ),
)


def parse_version(text: str) -> Version | None:
    """`sbatch --version`'s "slurm 22.05.8" or "slurm-wlm 24.11.5" -> (22, 5, 8)."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def shown(version: Version | None) -> str:
    return "unknown" if version is None else f"{version[0]}.{version[1]:02d}.{version[2]}"


def exports_srun_cpus(version: Version | None) -> bool:
    """Whether the batch script exports SRUN_CPUS_PER_TASK: on the releases that read only it (an
    unknown version too: on a later one srun reads its own variable and ignores this one)."""
    return version is None or version < SRUN_CPUS_FROM_ENV


def in_effect(version: Version | None) -> list[tuple[Change, bool]]:
    """Every change with whether `version` behaves the new way (an unknown version: the newest)."""
    return [(change, version is None or version >= change.since) for change in CHANGES]
