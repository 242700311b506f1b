"""`python -m slurmddp ...`: parse arguments, call the modules that do the work, map errors to exits."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from slurmddp.cli import doctor, dryrun, mpilaunch
from slurmddp.cluster import slurm
from slurmddp.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED, SlurmddpError
from slurmddp.experiment import study as study_spec
from slurmddp.experiment.load import Loaded, SweepElement, expand, load_experiment
from slurmddp.files import write_atomic
from slurmddp.layout import RESULT, RESULTS_CSV
from slurmddp.manage import actions, index, logs, report, runs
from slurmddp.manage import scaling_study as study
from slurmddp.manage import sweep_runs as sweeps
from slurmddp.manage.follow import FINAL_OK, follow
from slurmddp.submit import submitter
from slurmddp.submit.plan import SubmissionPlan
from slurmddp.submit.prepare import plan_for, resolve_executor


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args))
    except SlurmddpError as exc:
        print(f"slurmddp: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurmddp: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _parse(argv: list[str]) -> argparse.Namespace:
    # One parser per command, each parsed with parse_intermixed_args so options may stand
    # anywhere among the KEY=VALUE overrides (argparse's subparsers do not allow that).
    submit = argparse.ArgumentParser(prog="slurmddp submit", description="Submit an experiment.")
    _experiment_args(submit)
    submit.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="follow the job to its end and exit with its status (default: only for local runs)",
    )
    submit.set_defaults(func=_submit)
    preview = argparse.ArgumentParser(
        prog="slurmddp dryrun", description="Print the batch script and rank environments; submit nothing."
    )
    _experiment_args(preview)
    preview.set_defaults(func=_dryrun)
    interrupt = argparse.ArgumentParser(
        prog="slurmddp interrupt",
        description="Send a running job what Slurm sends on a preemption or a time limit (to test resume).",
    )
    _run_arg(interrupt)
    _index_arg(interrupt)
    kind = interrupt.add_mutually_exclusive_group(required=True)
    kind.add_argument("--preempt", dest="reason", action="store_const", const="preemption")
    kind.add_argument("--timeout", dest="reason", action="store_const", const="timeout")
    interrupt.set_defaults(func=_interrupt)
    launch = argparse.ArgumentParser(
        prog="slurmddp mpilaunch",
        description="Run an experiment on the ranks that mpiexec started (mpiexec -n N ... mpilaunch).",
    )
    _experiment_args(launch)
    launch.set_defaults(func=lambda args: mpilaunch.run(args.experiment, args.overrides))
    commands = {
        "submit": submit,
        "scale": _scale_parser(),
        "dryrun": preview,
        "interrupt": interrupt,
        "mpilaunch": launch,
        "doctor": _doctor_parser(),
        **_manage_parsers(),
    }

    top = argparse.ArgumentParser(prog="slurmddp", description="Multi-node PyTorch DDP on Slurm.")
    top.add_argument(
        "command",
        choices=sorted(commands),
        help="; ".join(f"{name}: {parser.description}" for name, parser in sorted(commands.items())),
    )
    if not argv or argv[0] not in commands:
        top.parse_args(argv[:1])  # prints usage and exits 2, or help for -h
    return commands[argv[0]].parse_intermixed_args(argv[1:])


ACCOUNTING_HELP = (
    "Accounting (Slurm runs; empty for local ones), over every allocation of every job of the run, "
    "requeued ones included (sacct --duplicates): cpu_h = CPU hours, the sum of sacct's CPUTimeRAW "
    "(elapsed x allocated CPUs) / 3600; gpu_h = GPU hours, elapsed x the gres/gpu count in AllocTRES "
    "(0 where the cluster does not account gres/gpu); lost = time lost to requeues: for each "
    "allocation that ended in a requeue, the work redone after its last checkpoint (for a stop on "
    "preemption or time limit, the time after the checkpointed stop; for a crash or a killed job, its "
    "whole elapsed time) plus the wait in the queue until the next allocation started. A sweep's "
    "total line sums its elements."
)


def _scale_parser() -> argparse.ArgumentParser:
    scale = argparse.ArgumentParser(
        prog="slurmddp scale",
        description="Measure how an experiment scales: run it at several sizes and a 1-rank baseline.",
        epilog="Prints nodes, ranks, throughput, speedup and efficiency over the 1-rank baseline, step "
        "time, the share of the step in exposed communication and in waiting for data, and a "
        "barrier's latency; flags efficiency under 90%% or exposed communication over 10%% with the "
        "causes the telemetry shows. Writes STUDY_DIR/study.csv and study.png. Each size runs after "
        "the one before, so none shares the machines with another.",
    )
    _experiment_args(scale)
    scale.add_argument("--nodes", required=True, help="node counts to measure, e.g. 1,2,4")
    scale.add_argument(
        "--ranks-per-node", type=_positive_int, help="ranks (GPUs) per node (default: the experiment's)"
    )
    scale.add_argument(
        "--mode",
        choices=study_spec.MODES,
        default="weak",
        help="weak: the same batch per rank (default); strong: the same global batch",
    )
    scale.add_argument("--steps", type=_positive_int, help="steps per size (telemetry.max_steps)")
    scale.add_argument(
        "--batch-key",
        help=f"the train: key of the global batch (default: {study_spec.BATCH_KEY}, if there is one)",
    )
    scale.add_argument(
        "--bucket-cap-mb", help="also run these DDP bucket sizes at the largest size, e.g. 5,25,100"
    )
    scale.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="follow the study to its end and print the report (default: yes)",
    )
    scale.set_defaults(func=_scale)
    return scale


def _scale(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    nodes = study_spec.numbers(args.nodes, "--nodes", int)
    # Without Slurm every size runs on this machine: there is no cluster to outgrow.
    on_slurm = resolve_executor(loaded.experiment.executor) == "slurm"
    cluster = slurm.partition_nodes(loaded.experiment.resources.partition) if on_slurm else None
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
        cluster_nodes=cluster,
    )
    return study.submit(loaded, planned, sys.argv, sys.stdout, args.wait)


def _manage_parsers() -> dict[str, argparse.ArgumentParser]:
    status = argparse.ArgumentParser(
        prog="slurmddp status",
        description="Show the state of a run or of every element of a sweep.",
        epilog=ACCOUNTING_HELP,
    )
    _run_arg(status, optional=True)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(func=_status)
    logs = argparse.ArgumentParser(prog="slurmddp logs", description="Print (or follow) a rank's log.")
    _run_arg(logs)
    _index_arg(logs)
    logs.add_argument("--rank", type=int, default=0, help="the rank whose log to show (default 0)")
    logs.add_argument("--err", action="store_true", help="show the rank's stderr instead of its stdout")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    logs.set_defaults(func=_logs)
    cancel = argparse.ArgumentParser(
        prog="slurmddp cancel", description="Cancel a run, a whole sweep, or one element of it."
    )
    _run_arg(cancel)
    _index_arg(cancel)
    cancel.set_defaults(func=_cancel)
    resubmit = argparse.ArgumentParser(
        prog="slurmddp resubmit",
        description="Submit a run that ended without completing again, or a sweep's failed elements "
        "(--failed); they resume from their latest checkpoints with fresh budgets.",
        epilog="A single run takes overrides of where it runs and how it is kept going: "
        "resources.time=04:00:00, resources.partition=long, resources.nodes=1, ... With another "
        "number of ranks the global batch and the order of samples stay (ctx.loader), and "
        "ddp.accumulate grows so that each rank's micro-batch is no larger than before.",
    )
    _run_arg(resubmit)
    resubmit.add_argument("--failed", action="store_true", help="a sweep's elements that failed")
    resubmit.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="follow the run to its end and exit with its status (default: only for local runs)",
    )
    resubmit.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. resources.nodes=1")
    resubmit.set_defaults(func=_resubmit)
    listing = argparse.ArgumentParser(prog="slurmddp list", description="List recent runs and sweeps.")
    listing.add_argument("-n", "--limit", type=_positive_int, default=20, help="how many (default 20)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_list)
    results = argparse.ArgumentParser(
        prog="slurmddp results",
        description="A sweep's elements ranked by a metric; writes CSV.",
        epilog="cpu_h, gpu_h and lost (CSV: cpu_hours, gpu_hours, lost_hours) are defined in "
        "`slurmddp status --help`.",
    )
    _run_arg(results)
    results.add_argument("--metric", help="the metric to rank by (default: the sweep's sweep.metric)")
    results.add_argument("--mode", choices=("min", "max"), help="best is min or max (default: sweep.mode)")
    results.add_argument("--csv", type=Path, help="where to write the CSV (default: SWEEP_DIR/results.csv)")
    results.add_argument("--plot", type=Path, help="also write a PNG of the metric over steps per element")
    results.add_argument("--json", action="store_true", help="print JSON instead of a table")
    results.set_defaults(func=_results)
    return {
        "status": status,
        "logs": logs,
        "cancel": cancel,
        "resubmit": resubmit,
        "list": listing,
        "results": results,
    }


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _run_arg(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    parser.add_argument(
        "run",
        metavar="RUN",
        nargs="?" if optional else None,
        help="a run or sweep directory, or a job id"
        + (" (default: the newest submission)" if optional else ""),
    )


def _index_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", type=int, help="the sweep element (its index in status)")


def _experiment_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="the experiment YAML file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. resources.nodes=2 lr=0.1")


def _submit(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    elements = expand(loaded) if loaded.sweep is not None else []
    plan = plan_for(loaded, elements=elements)
    for note in plan.notes:
        print(f"slurmddp: {note}")
    _warn_short_lead(plan, loaded)
    if loaded.sweep is not None:
        return _submit_sweep(args, plan, loaded, elements)
    sub = submitter.submit(plan, loaded, sys.argv)
    index.remember(plan.run_dir, "run", plan.job_name, sub.job_id)
    print(f"slurmddp: submitted {plan.executor} job {sub.job_id} ({plan.world_size} ranks)")
    print(f"  run dir: {plan.run_dir}")
    print(f"  logs:    {sub.log_path(0)} (rank 0; one file per rank)")
    wait = args.wait if args.wait is not None else plan.executor == "local"
    if not wait:
        return 0
    final = follow(sub, sys.stdout)
    result = plan.run_dir / RESULT
    if final == FINAL_OK and result.is_file():
        print(f"  result:  {result}")
    return 0 if final == FINAL_OK else EXIT_JOB_FAILED


def _submit_sweep(
    args: argparse.Namespace, plan: SubmissionPlan, loaded: Loaded, elements: list[SweepElement]
) -> int:
    if plan.executor == "local":
        return sweeps.run_local(plan, loaded, elements, sys.argv, sys.stdout)
    job_id = submitter.submit_sweep(plan, loaded, elements, sys.argv)
    index.remember(plan.run_dir, "sweep", plan.job_name, job_id)
    assert loaded.sweep is not None
    limit = loaded.sweep.max_parallel
    print(
        f"slurmddp: submitted sweep of {len(elements)} elements as array job {job_id} "
        f"({plan.world_size} ranks each, {f'at most {limit}' if limit else 'no limit on how many'} at once)"
    )
    print(f"  sweep dir: {plan.run_dir}")
    print(f"  status:    python -m slurmddp status {plan.run_dir}")
    if not args.wait:
        return 0
    return sweeps.wait(plan.run_dir, sys.stdout)


def _warn_short_lead(plan: SubmissionPlan, loaded: Loaded) -> None:
    exp = loaded.experiment
    save_s = actions.last_save_seconds(Path(exp.output_dir), exp.name)
    # The ranks stop one step after the signal, save, and the batch script requeues: the lead
    # must cover the save with room for a slow step and the requeue.
    if plan.executor == "slurm" and save_s is not None and exp.requeue.signal_lead_s < 2 * save_s + 10:
        lead = exp.requeue.signal_lead_s
        print(
            f"slurmddp: warning: requeue.signal_lead_s={lead} s may be too short: the last run of "
            f"{exp.name} took {save_s:.1f} s to save a checkpoint; give at least {2 * save_s + 10:.0f} s"
        )


def _interrupt(args: argparse.Namespace) -> int:
    print(f"slurmddp: {actions.interrupt(args.run, args.reason, args.index)}")
    return 0


def _status(args: argparse.Namespace) -> int:
    target = runs.resolve(args.run)
    rows = runs.rows(target)
    if args.json:
        print(json.dumps(report.status_json(target, rows), indent=2))
    else:
        print(report.status_table(target, rows, target.manifest.get("metric")))
    return 0


def _logs(args: argparse.Namespace) -> int:
    target = runs.resolve(args.run)
    element = target.element(args.index)
    logs.show(target, element, args.rank, "err" if args.err else "out", args.follow, sys.stdout)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    cancelled = actions.cancel(args.run, args.index)
    for line in cancelled:
        print(f"slurmddp: cancelled {line}")
    if not cancelled:
        print("slurmddp: nothing to cancel: no element is pending or running")
    return 0


def _resubmit(args: argparse.Namespace) -> int:
    target = runs.resolve(args.run)
    if target.kind == "sweep":
        if not args.failed:
            raise SlurmddpError(
                f"{target.dir} is a sweep: `resubmit --failed` submits its failed elements again"
            )
        if args.overrides:
            raise SlurmddpError(
                f"resubmit --failed takes no overrides ({args.overrides[0]!r}): a sweep's elements go "
                "again as they were; resubmit an element's directory on its own to change it"
            )
        again = actions.resubmit_failed(str(target.dir), sys.argv)
        for note in again.notes:
            print(f"slurmddp: {note}")
        print(f"slurmddp: resubmitted elements {', '.join(map(str, again.indices))} as job {again.job_id}")
        return 0
    done = actions.resubmit_run(str(target.dir), args.overrides, sys.argv)
    for note in done.notes:
        print(f"slurmddp: {note}")
    sub = done.submission
    index.remember(sub.plan.run_dir, "run", sub.plan.job_name, sub.job_id)
    changed = f" (changed: {', '.join(done.changed)})" if done.changed else ""
    ranks = sub.plan.world_size
    print(f"slurmddp: resubmitted {sub.plan.executor} job {sub.job_id} ({ranks} ranks){changed}")
    print(f"  run dir: {sub.plan.run_dir} (resumes from its latest checkpoint)")
    wait = args.wait if args.wait is not None else sub.plan.executor == "local"
    if not wait:
        return 0
    return 0 if follow(sub, sys.stdout) == FINAL_OK else EXIT_JOB_FAILED


def _list(args: argparse.Namespace) -> int:
    records = index.recent(args.limit)
    if args.json:
        print(json.dumps(records, indent=2))
    elif records:
        print(report.list_table(records))
    else:
        print(f"slurmddp: nothing submitted yet (index {index.index_path()})")
    return 0


def _results(args: argparse.Namespace) -> int:
    target = runs.resolve(args.run)
    if "study" in target.manifest:
        study.report(target, sys.stdout)
        return 0
    rows = runs.rows(target)
    names = report.metric_names(rows)
    metric = args.metric or target.manifest.get("metric") or (names[0] if names else None)
    if metric is None:
        raise SlurmddpError(f"{target.dir}: no metric was logged yet (ctx.log in the training function)")
    ranked = report.ranked(rows, metric, args.mode or target.manifest.get("mode") or "min")
    keys = list(target.manifest.get("keys") or [])
    metrics = [metric, *(m for m in report.metric_names(rows) if m != metric)]
    csv_path = args.csv or target.dir / RESULTS_CSV
    writing = f"--csv {csv_path}" if args.csv else str(csv_path)
    try:
        write_atomic(csv_path, report.results_csv(ranked, keys, metrics))
        if args.plot:
            writing = f"--plot {args.plot}"
            report.plot(ranked, metric, args.plot)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise SlurmddpError(
            f"{writing}: cannot write it ({where}{exc.strerror or exc}); "
            "name a file in a directory you can write"
        ) from None
    if args.json:
        print(json.dumps([dataclasses.asdict(row) for row in ranked], indent=2))
    else:
        print(report.results_table(ranked, keys, metrics))
        print(f"slurmddp: wrote {csv_path}" + (f" and {args.plot}" if args.plot else ""))
    return 0


def _dryrun(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    elements = expand(loaded) if loaded.sweep is not None else []
    dryrun.show(loaded, elements, plan_for(loaded, elements=elements), sys.stdout)
    return 0


def _doctor_parser() -> argparse.ArgumentParser:
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
    doctor.set_defaults(func=_doctor)
    return doctor


def _doctor(args: argparse.Namespace) -> int:
    return doctor.main(sys.stdout, args.probe, args.overrides)
