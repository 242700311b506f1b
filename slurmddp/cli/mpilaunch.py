"""`mpiexec -n N python -m slurmddp mpilaunch exp.yaml [KEY=VALUE ...]`: run the experiment's
function on the ranks an MPI launcher started, outside Slurm and submitit. Every rank loads the
experiment; rank 0 creates the run directory and broadcasts where it is."""

from __future__ import annotations

from pathlib import Path

from slurmddp.defaults import ALWAYS_STOP_ON, STOP_SIGNAL
from slurmddp.errors import SlurmddpError
from slurmddp.experiment.load import load_experiment
from slurmddp.job.launch.runtime import run_rank
from slurmddp.job.process import mpi, signals
from slurmddp.rundir.config import write_config
from slurmddp.rundir.layout import new_run_dir
from slurmddp.submit import submitter
from slurmddp.submit.prepare import plan_for


def run(experiment: Path, overrides: list[str]) -> int:
    """Run this MPI rank of the experiment; its exit status."""
    # As early as this process allows: a stop signal that lands first must not kill the rank.
    signals.install((STOP_SIGNAL, ALWAYS_STOP_ON))
    loaded = load_experiment(experiment, [*overrides, "dist.launcher=mpi"])
    exp = loaded.experiment
    if exp.entrypoint.function is None:
        raise SlurmddpError("mpilaunch runs function entrypoints; a script or module can call mpiexec itself")
    # After the checks: MPI's start makes a shared-memory segment that an error exit left behind in
    # /dev/shm (MPICH), one per refused command.
    world = mpi.mpi().COMM_WORLD
    fresh = str(new_run_dir(exp.output_dir, exp.name)) if world.Get_rank() == 0 else None
    run_dir = Path(world.bcast(fresh, root=0))
    plan = plan_for(loaded, executor="local", run_dir=run_dir)
    if world.Get_rank() == 0:
        submitter.make_run_dir(run_dir, exp)
        write_config(run_dir, loaded.resolved)
        print(f"slurmddp: {world.Get_size()} MPI ranks; run dir {run_dir}", flush=True)
    world.Barrier()
    run_rank(plan.rank)
    return 0
