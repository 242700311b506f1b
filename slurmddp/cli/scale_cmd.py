"""`scale`: a scaling study, the experiment run at several sizes and a 1-rank baseline."""

from __future__ import annotations

import argparse
import sys

from slurmddp.cli.arguments import experiment_args, positive_int, wait_arg
from slurmddp.experiment import study as study_spec
from slurmddp.experiment.load import load_experiment
from slurmddp.manage import scaling_study


def parsers() -> dict[str, argparse.ArgumentParser]:
    scale = argparse.ArgumentParser(
        prog="slurmddp scale",
        description="Measure how an experiment scales: run it at several sizes and a 1-rank baseline.",
        epilog="Prints nodes, ranks, throughput, speedup and efficiency over the 1-rank baseline, step "
        "time, the share of the step in exposed communication and in waiting for data, and a "
        "barrier's latency; flags efficiency under 90% or exposed communication over 10% with the "
        "causes the telemetry shows. Writes STUDY_DIR/study.csv and study.png. Each size runs after "
        "the one before, so none shares the machines with another.",
    )
    experiment_args(scale)
    scale.add_argument("--nodes", required=True, help="node counts to measure, e.g. 1,2,4")
    scale.add_argument(
        "--ranks-per-node", type=positive_int, help="ranks (GPUs) per node (default: the experiment's)"
    )
    scale.add_argument(
        "--mode",
        choices=study_spec.MODES,
        default="weak",
        help="weak: the same batch per rank (default); strong: the same global batch",
    )
    scale.add_argument("--steps", type=positive_int, help="steps per size (telemetry.max_steps)")
    scale.add_argument(
        "--batch-key",
        help=f"the train: key of the global batch (default: {study_spec.BATCH_KEY}, if there is one)",
    )
    scale.add_argument(
        "--bucket-cap-mb", help="also run these DDP bucket sizes at the largest size, e.g. 5,25,100"
    )
    wait_arg(scale, "follow the study to its end and print the report (default: yes)")
    scale.set_defaults(func=_scale)
    return {"scale": scale}


def _scale(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    nodes = study_spec.numbers(args.nodes, "--nodes", int)
    planned = study_spec.plan(
        loaded.experiment,
        nodes=nodes,
        ranks_per_node=args.ranks_per_node,
        mode=args.mode,
        steps=args.steps,
        batch_key=args.batch_key,
        bucket_caps=study_spec.numbers(args.bucket_cap_mb, "--bucket-cap-mb", float)
        if args.bucket_cap_mb
        else [],
        cluster_nodes=scaling_study.cluster_nodes(loaded.experiment),
    )
    return scaling_study.submit(loaded, planned, sys.argv, sys.stdout, args.wait)
