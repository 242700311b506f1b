"""`python -m slurmddp ...`: parse arguments, call the modules that do the work, map errors to exits."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slurmddp import manage, submitter
from slurmddp import plan as planning
from slurmddp.config import Loaded, load_experiment
from slurmddp.errors import SlurmddpError
from slurmddp.follow import FINAL_OK, follow

EXIT_USER_ERROR = 2
EXIT_JOB_FAILED = 1


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args))
    except SlurmddpError as exc:
        print(f"slurmddp: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("slurmddp: interrupted", file=sys.stderr)
        return 130


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
    dryrun = argparse.ArgumentParser(
        prog="slurmddp dryrun", description="Print the batch script and rank environments; submit nothing."
    )
    _experiment_args(dryrun)
    dryrun.set_defaults(func=_dryrun)
    interrupt = argparse.ArgumentParser(
        prog="slurmddp interrupt",
        description="Send a running job what Slurm sends on a preemption or a time limit (to test resume).",
    )
    interrupt.add_argument("run", metavar="RUN", help="a run directory or a job id")
    kind = interrupt.add_mutually_exclusive_group(required=True)
    kind.add_argument("--preempt", dest="reason", action="store_const", const="preemption")
    kind.add_argument("--timeout", dest="reason", action="store_const", const="timeout")
    interrupt.set_defaults(func=_interrupt)
    commands = {"submit": submit, "dryrun": dryrun, "interrupt": interrupt}

    top = argparse.ArgumentParser(prog="slurmddp", description="Multi-node PyTorch DDP on Slurm.")
    top.add_argument(
        "command",
        choices=sorted(commands),
        help="; ".join(f"{name}: {parser.description}" for name, parser in sorted(commands.items())),
    )
    if not argv or argv[0] not in commands:
        top.parse_args(argv[:1])  # prints usage and exits 2, or help for -h
    return commands[argv[0]].parse_intermixed_args(argv[1:])


def _experiment_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", type=Path, help="the experiment YAML file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. resources.nodes=2 lr=0.1")


def _plan(args: argparse.Namespace) -> tuple[planning.SubmissionPlan, Loaded]:
    loaded = load_experiment(args.experiment, args.overrides)
    exp = loaded.experiment
    plan = planning.build(
        loaded,
        executor=submitter.resolve_executor(exp.executor),
        workdir=Path.cwd(),
        run_dir=submitter.new_run_dir(exp.output_dir, exp.name),
        interpreter=submitter.interpreter(),
    )
    return plan, loaded


def _submit(args: argparse.Namespace) -> int:
    plan, loaded = _plan(args)
    for note in plan.notes:
        print(f"slurmddp: {note}")
    _warn_short_lead(plan, loaded)
    sub = submitter.submit(plan, loaded, sys.argv)
    print(f"slurmddp: submitted {plan.executor} job {sub.job_id} ({plan.world_size} ranks)")
    print(f"  run dir: {plan.run_dir}")
    print(f"  logs:    {sub.log_path(0)} (rank 0; one file per rank)")
    wait = args.wait if args.wait is not None else plan.executor == "local"
    if not wait:
        return 0
    final = follow(sub, sys.stdout)
    result = plan.run_dir / "result.json"
    if final == FINAL_OK and result.is_file():
        print(f"  result:  {result}")
    return 0 if final == FINAL_OK else EXIT_JOB_FAILED


def _warn_short_lead(plan: planning.SubmissionPlan, loaded: Loaded) -> None:
    exp = loaded.experiment
    save_s = manage.last_save_seconds(Path(exp.output_dir), exp.name)
    # The ranks stop one step after the signal, save, and the batch script requeues: the lead
    # must cover the save with room for a slow step and the requeue.
    if plan.executor == "slurm" and save_s is not None and exp.requeue.signal_lead_s < 2 * save_s + 10:
        lead = exp.requeue.signal_lead_s
        print(
            f"slurmddp: warning: requeue.signal_lead_s={lead} s may be too short: the last run of "
            f"{exp.name} took {save_s:.1f} s to save a checkpoint; give at least {2 * save_s + 10:.0f} s"
        )


def _interrupt(args: argparse.Namespace) -> int:
    print(f"slurmddp: {manage.interrupt(args.run, args.reason)}")
    return 0


def _dryrun(args: argparse.Namespace) -> int:
    plan, _ = _plan(args)
    for note in plan.notes:
        print(f"# slurmddp: {note}")
    if plan.executor == "slurm":
        print("# ---- batch script (sbatch) ----")
        print(submitter.sbatch_script(plan))
    else:
        print(f"# ---- local executor: {plan.world_size} processes, each running ----")
        print(planning.command(plan))
    job_id = 12345
    for rank in sorted({0, plan.world_size - 1}):
        print(f"# ---- environment of rank {rank} (as job {job_id}; MASTER_PORT follows the job id) ----")
        for key, value in sorted(planning.preview_env(plan, rank, job_id).items()):
            print(f"{key}={value}")
    print(f"# nothing was submitted; the run directory would be {plan.run_dir}")
    return 0
