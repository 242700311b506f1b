"""`status`, `logs`, `interrupt`, `cancel`, `resubmit`, `list` and `results`: the commands that read
back or act on runs already submitted."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmddp.cli import waiting
from slurmddp.cli.arguments import index_arg, positive_int, run_arg, wait_arg
from slurmddp.errors import SlurmddpError
from slurmddp.manage import actions, ctrl_c, index, listing, logs, ranking, report, runs, scaling_study, then

# The README defines these figures once ("Sweeps and managing runs"); the help only points there.
ACCOUNTING_HELP = (
    "cpu_h, gpu_h and lost (CSV: cpu_hours, gpu_hours, lost_hours): what each run cost in CPU hours, "
    "GPU hours and time lost to requeues, over every allocation of every job it had (empty for local "
    'runs); README.md, section "Sweeps and managing runs", says how each is counted.'
)


def parsers() -> dict[str, argparse.ArgumentParser]:
    return {
        "status": _status_parser(),
        "logs": _logs_parser(),
        "interrupt": _interrupt_parser(),
        "cancel": _cancel_parser(),
        "resubmit": _resubmit_parser(),
        "list": _list_parser(),
        "results": _results_parser(),
        "then": _then_parser(),
    }


def _then_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmddp then",
        description="Submit a sweep's `sweep.then` experiment with its best element's values (the "
        "sweep's own then-job runs this once every element ended).",
    )
    parser.add_argument("sweep", type=Path, help="the sweep directory")
    parser.set_defaults(func=lambda args: then.submit_then(args.sweep, sys.stdout))
    return parser


def _status_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmddp status",
        description="Show the state of a run or of every element of a sweep.",
        epilog=ACCOUNTING_HELP,
    )
    run_arg(parser, optional=True)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=_status)
    return parser


def _logs_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurmddp logs", description="Print (or follow) a rank's log.")
    run_arg(parser, optional=True)
    index_arg(parser)
    parser.add_argument("--rank", type=int, default=0, help="the rank whose log to show (default 0)")
    parser.add_argument("--err", action="store_true", help="show the rank's stderr instead of its stdout")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    parser.set_defaults(func=_logs)
    return parser


def _interrupt_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmddp interrupt",
        description="Send a running job what Slurm sends on a preemption or a time limit (to test resume).",
    )
    run_arg(parser, optional=True)
    index_arg(parser)
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument(
        "--preempt",
        dest="reason",
        action="store_const",
        const="preemption",
        help="as Slurm preempting it: the ranks save a checkpoint and the job requeues itself "
        "(counted against requeue.max_preemptions)",
    )
    kind.add_argument(
        "--timeout",
        dest="reason",
        action="store_const",
        const="timeout",
        help="as its time limit drawing near: the ranks save a checkpoint and the job requeues itself "
        "(counted against requeue.max_timeouts)",
    )
    parser.set_defaults(func=_interrupt)
    return parser


def _cancel_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmddp cancel", description="Cancel a run, a whole sweep, or one element of it."
    )
    run_arg(parser, optional=True)
    index_arg(parser)
    parser.add_argument(
        "--yes", action="store_true", help="without RUN: cancel the newest submission without asking"
    )
    parser.add_argument(
        "--now",
        action="store_true",
        help="Slurm: scancel at once; the running ranks do not stop at an agreed step and save first",
    )
    parser.set_defaults(func=_cancel)
    return parser


def _resubmit_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmddp resubmit",
        description="Submit a run that ended without completing again, or a sweep's failed elements "
        "(--failed); they resume from their latest checkpoints with fresh budgets.",
        epilog="A single run takes overrides of where it runs and how it is kept going: "
        "resources.time=04:00:00, resources.partition=long, resources.nodes=1, ... With another "
        "number of ranks the global batch and the order of samples stay (ctx.loader), and "
        "ddp.accumulate grows so that each rank's micro-batch is no larger than before.",
    )
    run_arg(parser, optional=True)
    parser.add_argument("--failed", action="store_true", help="a sweep's elements that failed")
    parser.add_argument(
        "--trials", type=int, metavar="N", help="a search: N more trials in the same study, as one new array"
    )
    parser.add_argument(
        "--forget-exclusions",
        action="store_true",
        help="forget the nodes the run (a sweep: its failed elements) left out after faults "
        "(RUN_DIR/excluded.json, listed by status): they may be given ranks again; your own "
        "resources.exclude stays",
    )
    wait_arg(parser, "follow the run to its end and exit with its status (default: only for local runs)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. resources.nodes=1")
    parser.set_defaults(func=_resubmit)
    return parser


def _list_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slurmddp list", description="List recent runs and sweeps.")
    parser.add_argument("-n", "--limit", type=positive_int, default=20, help="how many (default 20)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=_list)
    return parser


def _results_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmddp results",
        description="A sweep's elements ranked by a metric; writes CSV (unless --json).",
        epilog=ACCOUNTING_HELP,
    )
    run_arg(parser, optional=True)
    parser.add_argument("--metric", help="the metric to rank by (default: the sweep's sweep.metric)")
    parser.add_argument("--mode", choices=("min", "max"), help="best is min or max (default: sweep.mode)")
    parser.add_argument(
        "--csv",
        type=Path,
        help="where to write the CSV (default: SWEEP_DIR/results.csv, or results-METRIC-MODE.csv for "
        "a --metric or --mode other than the sweep's; with --json, none unless named)",
    )
    parser.add_argument("--plot", type=Path, help="also write a PNG of the metric over steps per element")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=_results)
    return parser


def _status(args: argparse.Namespace) -> int:
    target = runs.resolve(args.run)
    rows = runs.rows(target)
    if args.json:
        print(json.dumps(report.status_json(target, rows), indent=2))
    else:
        print(report.status_table(target, rows, target.metric))
    return 0


def _logs(args: argparse.Namespace) -> int:
    target = runs.resolve(args.run)
    element = target.element(args.index)
    logs.show(target, element, args.rank, "err" if args.err else "out", args.follow, sys.stdout)
    return 0


def _interrupt(args: argparse.Namespace) -> int:
    print(f"slurmddp: {actions.interrupt(args.run, args.reason, args.index)}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    ref = args.run
    if ref is None:
        # Without RUN, the newest submission is a guess: it is named, and asked for on a terminal.
        newest = runs.resolve(None)
        if not _newest_confirmed(newest, args.yes):
            print("slurmddp: nothing cancelled")
            return 0
        ref = str(newest.dir)
    cancelled = actions.cancel(ref, args.index, args.now, _saving)
    for line in cancelled:
        print(f"slurmddp: cancelled {line}")
    if not cancelled:
        print("slurmddp: nothing to cancel: no element is pending or running")
    return 0


def _saving(jobs: Sequence[str], wait_s: float) -> None:
    print(
        f"slurmddp: stopping job {', '.join(jobs)}: its ranks stop at an agreed step and save first "
        f"(up to {wait_s:.0f} s; `cancel --now` does not wait)",
        flush=True,
    )


def _newest_confirmed(newest: runs.Target, yes: bool) -> bool:
    """Whether to cancel the newest submission: --yes, or a "y" on a terminal. Without a terminal
    (a script, CI) and without --yes nothing is guessed: the error says what to add."""
    # A sweep's elements by their array's ids (1234, not 1234_0 ... 1234_99).
    jobs = sorted({element.job_id.split("_")[0] for element in newest.elements if element.job_id})
    what = f"{newest.dir} (job {', '.join(jobs) or 'not submitted'})"
    if yes:
        print(f"slurmddp: cancelling the newest submission: {what}")
        return True
    if not sys.stdin.isatty():
        raise SlurmddpError(
            f"cancel names no run, and the newest submission is {what}: name it "
            f"(`python -m slurmddp cancel {newest.dir}`) or pass --yes to cancel the newest"
        )
    print(f"slurmddp: cancel the newest submission, {what}? [y/N] ", end="", flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _resubmit(args: argparse.Namespace) -> int:
    # `resubmit resources.time=04:00:00` names no run: its first override lands in RUN.
    if args.run is not None and "=" in args.run and not Path(args.run).exists():
        args.run, args.overrides = None, [args.run, *args.overrides]
    target = runs.resolve(args.run)
    if target.kind == "sweep" and args.trials is not None:
        added = actions.add_trials(str(target.dir), args.trials)
        span = f"{added.indices[0]}-{added.indices[-1]}"
        print(f"slurmddp: added {len(added.indices)} trials as elements {span}, array job {added.job_id}")
        return 0
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
        again = actions.resubmit_failed(str(target.dir), sys.argv, args.forget_exclusions)
        for note in again.notes:
            print(f"slurmddp: {note}")
        print(f"slurmddp: resubmitted elements {', '.join(map(str, again.indices))} as job {again.job_id}")
        return 0
    with ctrl_c.out_of_reach(target.backend.executor):
        done = actions.resubmit_run(str(target.dir), args.overrides, sys.argv, args.forget_exclusions)
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
    return waiting.follow_to_end(sub, sys.stdout)


def _list(args: argparse.Namespace) -> int:
    records = listing.with_states(index.recent(args.limit))
    if args.json:
        print(json.dumps(records, indent=2))
    elif records:
        print(listing.table(records))
    else:
        print(f"slurmddp: nothing submitted yet (index {index.index_path()})")
    return 0


def _results(args: argparse.Namespace) -> int:
    target = runs.resolve(args.run)
    if ranking.is_study(target):
        scaling_study.report(target, sys.stdout)
        return 0
    found = ranking.rank(target, args.metric, args.mode)
    # --json is for a program reading stdout: it writes a file only where one is named.
    asked = args.metric is not None or args.mode is not None
    csv = args.csv or (None if args.json else ranking.default_csv(target, found, asked))
    ranking.write(found, csv, args.plot, csv_named=args.csv is not None)
    if args.json:
        print(json.dumps([dataclasses.asdict(row) for row in found.ranked], indent=2))
    else:
        print(report.results_table(found.ranked, found.keys, found.metrics))
        print(f"slurmddp: {ranking.verdict(found)}")
        print(f"slurmddp: wrote {csv}" + (f" and {args.plot}" if args.plot else ""))
    return 0
