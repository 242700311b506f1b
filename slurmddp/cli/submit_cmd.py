"""`submit`, `dryrun`, `config` and `mpilaunch`: the commands that start an experiment (or show how
they would)."""

from __future__ import annotations

import argparse
import sys

from slurmddp import yamlio
from slurmddp.cli import dryrun, mpilaunch, waiting
from slurmddp.cli.arguments import experiment_args, wait_arg
from slurmddp.errors import ConfigError
from slurmddp.experiment.load import Loaded, SweepElement, expand, load_experiment
from slurmddp.manage import after, ctrl_c, index, sweep_runs
from slurmddp.manage.display import print_block
from slurmddp.manage.outcome import next_steps
from slurmddp.manage.signal_lead import short_lead_warning
from slurmddp.submit import submitter
from slurmddp.submit.plan import SubmissionPlan, waiting_for
from slurmddp.submit.prepare import plan_for, resolve_executor


def parsers() -> dict[str, argparse.ArgumentParser]:
    submit = argparse.ArgumentParser(prog="slurmddp submit", description="Submit an experiment.")
    experiment_args(submit)
    wait_arg(submit, "follow the job to its end and exit with its status (default: only for local runs)")
    queued = submit.add_mutually_exclusive_group()
    queued.add_argument(
        "--after", metavar="RUN", help="start once RUN (a run or sweep directory, a job id) completed"
    )
    queued.add_argument("--after-any", metavar="RUN", help="start once RUN ended, however (afterany)")
    submit.set_defaults(func=_submit)
    preview = argparse.ArgumentParser(
        prog="slurmddp dryrun", description="Print the batch script and rank environments; submit nothing."
    )
    experiment_args(preview)
    preview.set_defaults(func=_dryrun)
    config = argparse.ArgumentParser(
        prog="slurmddp config",
        description="Print the resolved experiment as YAML, as the run's config.yaml would hold it; "
        "submit nothing.",
    )
    experiment_args(config)
    config.add_argument("--index", type=int, help="a sweep's element (default: the config they start from)")
    config.set_defaults(func=_config)
    launch = argparse.ArgumentParser(
        prog="slurmddp mpilaunch",
        description="Run an experiment on the ranks that mpiexec started (mpiexec -n N ... mpilaunch).",
    )
    experiment_args(launch)
    launch.set_defaults(func=lambda args: mpilaunch.run(args.experiment, args.overrides))
    return {"submit": submit, "dryrun": preview, "config": config, "mpilaunch": launch}


def _submit(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    elements = expand(loaded) if loaded.sweep is not None else []
    plan = plan_for(loaded, elements=elements)
    plan = _queued_behind(args, plan)
    for note in plan.notes:
        print(f"slurmddp: {note}")
    warning = short_lead_warning(plan, loaded.experiment)
    if warning:
        print(f"slurmddp: warning: {warning}")
    if loaded.sweep is not None:
        return _submit_sweep(args, plan, loaded, elements)
    with ctrl_c.out_of_reach(plan.executor):
        sub = submitter.submit(plan, loaded, sys.argv)
    index.remember(plan.run_dir, "run", plan.job_name, sub.job_id)
    print(f"slurmddp: submitted {plan.executor} job {sub.job_id} ({plan.world_size} ranks)")
    print(f"  run dir: {plan.run_dir}")
    print(f"  logs:    {sub.log_path(0)} (rank 0; one file per rank)")
    wait = args.wait if args.wait is not None else plan.executor == "local"
    if not wait:
        print_block(sys.stdout, [], next_steps(str(plan.run_dir), None))
        return 0
    return waiting.follow_to_end(sub, sys.stdout)


def _queued_behind(args: argparse.Namespace, plan: SubmissionPlan) -> SubmissionPlan:
    """The plan held in the queue behind --after / --after-any's run, where one is given."""
    for flag, kind in after.KINDS.items():
        ref = getattr(args, flag)
        if ref is None:
            continue
        if plan.executor != "slurm":
            raise ConfigError(
                f"--{flag.replace('_', '-')} {ref}: a local run starts at once; submit it once that run ended"
            )
        waited = after.dependency(ref, kind)
        if waited is None:
            print(f"slurmddp: {ref} has ended; nothing to wait for")
            return plan
        print(f"slurmddp: queued behind {waited.dir} ({waited.sbatch})")
        return waiting_for(plan, waited)
    return plan


def _submit_sweep(
    args: argparse.Namespace, plan: SubmissionPlan, loaded: Loaded, elements: list[SweepElement]
) -> int:
    if plan.executor == "local":
        return sweep_runs.run_local(plan, loaded, elements, sys.argv, sys.stdout)
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
    return sweep_runs.wait(plan.run_dir, sys.stdout, closing=True)


def _dryrun(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    elements = expand(loaded) if loaded.sweep is not None else []
    dryrun.show(loaded, elements, plan_for(loaded, elements=elements, preview=True), sys.stdout)
    return 0


def _config(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    elements = expand(loaded) if loaded.sweep is not None else []
    # Planned for the executor submit would use, and the plan dropped: what submit refuses (an
    # entrypoint that names no function, an image for the local executor, ...) is refused here
    # too. The controller is not pinged: `config` works with none, and at once.
    plan_for(loaded, elements=elements, executor=resolve_executor(loaded.experiment.executor))
    if args.index is None:
        resolved = loaded.resolved
        if elements:
            # On stderr: stdout stays the YAML alone, for a program to read.
            print(
                f"slurmddp: a sweep of {len(elements)} elements; this is the config they start from, "
                "--index I prints element I's",
                file=sys.stderr,
            )
    elif not elements:
        raise ConfigError(f"--index {args.index}: {args.experiment} has no sweep; drop --index")
    elif not 0 <= args.index < len(elements):
        raise ConfigError(f"--index {args.index}: the sweep's indices are 0-{len(elements) - 1}")
    else:
        resolved = elements[args.index].loaded.resolved
    # The text write_config puts in RUN_DIR/config.yaml.
    sys.stdout.write(yamlio.dump(dict(resolved)))
    return 0
