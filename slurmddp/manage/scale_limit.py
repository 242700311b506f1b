"""How large a scaling study may grow before it is submitted: a size the cluster cannot hold would
wait in the queue for ever."""

from __future__ import annotations

from slurmddp.cluster import slurm
from slurmddp.experiment.schema import Experiment
from slurmddp.submit.planner import resolve_executor


def cluster_nodes(exp: Experiment) -> int | None:
    """The nodes of the experiment's partition; None where scontrol cannot say or off Slurm."""
    # Without Slurm every size runs on this machine: there is no cluster to outgrow.
    if resolve_executor(exp.executor) != "slurm":
        return None
    return slurm.partition_nodes(exp.resources.partition)
