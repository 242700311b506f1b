"""The Slurm releases slurmddp is tested on, told apart by `sbatch --version`."""

from __future__ import annotations

import pytest

from slurmddp.cluster import generations
from slurmddp.cluster.checks import describe_generation
from slurmddp.cluster.generations import exports_srun_cpus, parse_version


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("slurm 22.05.8\n", (22, 5, 8)),  # Debian 12
        ("slurm-wlm 24.11.5\n", (24, 11, 5)),  # Debian 13
        ("slurm 23.11.0-0rc1", (23, 11, 0)),
        ("slurm 25.05", (25, 5, 0)),
        ("sbatch: command not found", None),
    ],
)
def test_parse_version(text: str, version: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == version


def test_srun_reads_the_cpus_per_task_itself_from_23_11() -> None:
    assert exports_srun_cpus((22, 5, 8)) and exports_srun_cpus((23, 2, 7))
    assert not exports_srun_cpus((23, 11, 0)) and not exports_srun_cpus((24, 11, 5))
    assert exports_srun_cpus(None)  # harmless where srun ignores it


def test_doctor_says_which_side_of_each_change_a_cluster_is_on() -> None:
    config = {"TreeWidth": "16", "PriorityType": "priority/multifactor", "MaxBatchRequeue": "5"}
    text = describe_generation((24, 11, 5), config)
    assert text.startswith("slurmddp doctor: batch scripts are written for Slurm 24.11.5 (sbatch --version)")
    assert "from 23.11.0: TreeWidth; here TreeWidth=16" in text
    assert "from 23.02.0: MaxBatchRequeue; here MaxBatchRequeue=5" in text
    assert "here PreemptParameters=(unset)" in text
    assert text.count("  from ") == len(generations.CHANGES)
    older = describe_generation((22, 5, 8), {"TreeWidth": "50"})
    assert "not yet 23.11.0: TreeWidth; here TreeWidth=50" in older
    assert "from 22.05.0: srun and --cpus-per-task" in older
    # Every change is quoted from Slurm's own words and says what slurmddp does.
    for change in generations.CHANGES:
        assert change.said and change.handled
