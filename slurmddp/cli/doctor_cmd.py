"""`python -m slurmddp doctor`: is this cluster set up the way slurmddp relies on?

The checks live in slurmddp.cluster.checks, the `--probe` job in slurmddp.manage.probe_run; this
module takes the arguments and turns the verdicts into the exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from slurmddp.cluster.checks import Examination, describe_generation, examine, failed, format_checks
from slurmddp.errors import ConfigError
from slurmddp.manage.probe_run import probe_experiment, run_probe


def parsers() -> dict[str, argparse.ArgumentParser]:
    doctor = argparse.ArgumentParser(
        prog="slurmddp doctor",
        description="Check the Slurm tools and the cluster settings slurmddp relies on.",
    )
    doctor.add_argument(
        "--probe",
        action="store_true",
        help="also submit a small 2-node job, send it the stop signal and check that every rank saw it",
    )
    doctor.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="for the probe job, e.g. resources.partition=debug"
    )
    doctor.set_defaults(func=lambda args: main(sys.stdout, args.probe, args.overrides))
    return {"doctor": doctor}


def main(out: TextIO, probe_job: bool, overrides: Sequence[str]) -> int:
    """What `slurmddp doctor` does; returns its exit status (1 when a check failed)."""
    if overrides and not probe_job:
        raise ConfigError(
            f"doctor: {overrides[0]!r}: KEY=VALUE overrides configure the probe job; add --probe or drop them"
        )
    loaded = probe_experiment(overrides) if probe_job else None
    found = examine()
    show(out, found)
    if failed(found.checks):
        if probe_job:
            out.write("slurmddp doctor: no probe: fix the failed checks first\n")
        return 1
    if loaded is not None and not run_probe(out, loaded, sys.argv):
        return 1
    return 0


def show(out: TextIO, found: Examination) -> None:
    """Print the checks, after the cluster's release and what changed in it where slurmctld answered."""
    if found.config is not None:
        config = found.config
        release, cluster = config.get("SLURM_VERSION", "?"), config.get("ClusterName", "?")
        out.write(f"slurmddp doctor: Slurm {release}, cluster {cluster}\n")
        out.write(describe_generation(found.found, config) + "\n")
    out.write(format_checks(found.checks) + "\n")
    out.flush()
