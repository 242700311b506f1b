"""`init`: write a runnable starter (an experiment and its training function) into a directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from slurmddp.cluster import slurm
from slurmddp.experiment import starter


def parsers() -> dict[str, argparse.ArgumentParser]:
    init = argparse.ArgumentParser(
        prog="slurmddp init",
        description="Write a starter experiment and training function to begin a project with.",
        epilog="Where a Slurm controller answers, also writes a cluster profile (configs/CLUSTER.yaml) "
        "guessed from scontrol and sinfo, which the experiment names. Never overwrites a file.",
    )
    init.add_argument(
        "directory", metavar="DIR", type=Path, nargs="?", default=Path(), help="where (default: here)"
    )
    init.set_defaults(func=_init)
    return {"init": init}


def _init(args: argparse.Namespace) -> int:
    cluster = starter.discover()
    written = starter.write(args.directory, starter.starter_files(cluster))
    for path in written:
        print(f"slurmddp: wrote {path}")
    if cluster is None and slurm.installed():
        print(
            "slurmddp: no Slurm controller answers here: submit refuses until one does "
            "(executor=local trains on this machine instead)"
        )
    elif cluster is None:
        print("slurmddp: no Slurm here: the experiment runs its ranks on this machine")
    else:
        where = f"partition {cluster.partition}" if cluster.partition else "the default partition"
        gpus = f", {cluster.gpus_per_node} GPUs per node" if cluster.gpus_per_node else ""
        print(f"slurmddp: guessed the profile {cluster.name}: {where}{gpus}; check it before submitting")
    experiment = args.directory / starter.EXPERIMENT
    print(f"  next: python -m slurmddp dryrun {experiment}")
    print(f"        python -m slurmddp submit {experiment}")
    return 0
