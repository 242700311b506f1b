"""`submit`, `dryrun` and `mpilaunch`: the commands that start an experiment (or show how they would)."""

from __future__ import annotations

import argparse
import sys

from slurmddp.cli import dryrun, mpilaunch
from slurmddp.cli.arguments import experiment_args, wait_arg
from slurmddp.errors import EXIT_INTERRUPTED, EXIT_JOB_FAILED
from slurmddp.experiment.load import Loaded, SweepElement, expand, load_experiment
from slurmddp.manage import ctrl_c, explain, index, sweep_runs
from slurmddp.manage.display import print_block
from slurmddp.manage.follow import FINAL_OK, Follower
from slurmddp.manage.outcome import next_steps, outcome
from slurmddp.manage.signal_lead import short_lead_warning
from slurmddp.submit import submitter
from slurmddp.submit.plan import SubmissionPlan
from slurmddp.submit.prepare import plan_for


def parsers() -> dict[str, argparse.ArgumentParser]:
    submit = argparse.ArgumentParser(prog="slurmddp submit", description="Submit an experiment.")
    experiment_args(submit)
    wait_arg(submit, "follow the job to its end and exit with its status (default: only for local runs)")
    submit.set_defaults(func=_submit)
    preview = argparse.ArgumentParser(
        prog="slurmddp dryrun", description="Print the batch script and rank environments; submit nothing."
    )
    experiment_args(preview)
    preview.set_defaults(func=_dryrun)
    launch = argparse.ArgumentParser(
        prog="slurmddp mpilaunch",
        description="Run an experiment on the ranks that mpiexec started (mpiexec -n N ... mpilaunch).",
    )
    experiment_args(launch)
    launch.set_defaults(func=lambda args: mpilaunch.run(args.experiment, args.overrides))
    return {"submit": submit, "dryrun": preview, "mpilaunch": launch}


def _submit(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    elements = expand(loaded) if loaded.sweep is not None else []
    plan = plan_for(loaded, elements=elements)
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
    follower = Follower(sub, sys.stdout)
    interrupted = False
    try:
        final = follower.run()
    except KeyboardInterrupt:
        if not ctrl_c.stop(sub, sys.stdout):
            return EXIT_INTERRUPTED
        interrupted = True
        final = follower.run()
    if final != FINAL_OK and not interrupted:
        for line in explain.summary(plan.run_dir):
            print(line)
    result = outcome(sub, final, follower.elapsed_s)
    print_block(sys.stdout, result.rows, result.next_steps)
    if interrupted:
        return EXIT_INTERRUPTED
    return 0 if final == FINAL_OK else EXIT_JOB_FAILED


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
    return sweep_runs.wait(plan.run_dir, sys.stdout)


def _dryrun(args: argparse.Namespace) -> int:
    loaded = load_experiment(args.experiment, args.overrides)
    elements = expand(loaded) if loaded.sweep is not None else []
    dryrun.show(loaded, elements, plan_for(loaded, elements=elements), sys.stdout)
    return 0
