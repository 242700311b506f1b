"""Running a sweep (or a scaling study) without Slurm, and following a submitted one to its end."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from slurmddp.errors import EXIT_JOB_FAILED
from slurmddp.experiment.load import Loaded, SweepElement
from slurmddp.experiment.sweep import describe
from slurmddp.manage import index, report, runs, then
from slurmddp.manage.actions import FAILED_STATES
from slurmddp.manage.display import print_block
from slurmddp.manage.follow import FINAL_OK, follow
from slurmddp.manage.outcome import COMMAND
from slurmddp.rundir.manifest import SweepManifest
from slurmddp.rundir.trial import TrialRecord
from slurmddp.search import trial
from slurmddp.search.study import StudyRef
from slurmddp.submit import submitter
from slurmddp.submit.plan import SubmissionPlan
from slurmddp.submit.prepare import plan_for

ALL_COMPLETED = 0
"""Exit status when every element completed; otherwise EXIT_JOB_FAILED."""


def run_local(
    plan: SubmissionPlan, loaded: Loaded, elements: list[SweepElement], argv: list[str], out: TextIO
) -> int:
    """Without Slurm the elements run one after another on this machine, each as its own job."""
    created = submitter.make_run_dir(plan.run_dir, loaded.experiment)
    try:
        manifest = submitter.sweep_manifest(plan, loaded, elements, argv)
    except BaseException:
        submitter.discard(plan.run_dir, created)
        raise
    manifest.write(plan.run_dir)
    index.remember(plan.run_dir, "sweep", plan.job_name, "local")
    out.write(f"slurmddp: running a sweep of {len(elements)} elements here, one after another\n")
    out.write(f"  sweep dir: {plan.run_dir}\n")
    failed = run_each(plan.run_dir, manifest, [(e, describe(e.overrides)) for e in elements], argv, out)
    print_end(plan.run_dir, print_status(plan.run_dir, out), out)
    then_failed = then.submit_then(plan.run_dir, out)
    return EXIT_JOB_FAILED if failed or then_failed else ALL_COMPLETED


def run_each(
    run_dir: Path,
    manifest: SweepManifest,
    labelled: Sequence[tuple[SweepElement, str]],
    argv: list[str],
    out: TextIO,
) -> int:
    """Run the elements of a sweep or study here, one after another, each as its own job in its
    directory under `run_dir`, followed to its end; how many did not complete."""
    failed = 0
    for element, label in labelled:
        asked = None
        if manifest.search is not None:
            element, asked = with_trial(run_dir, element)
            label = f"trial {asked.number}: {describe(element.overrides)}"
        element_plan = plan_for(element.loaded, executor="local", run_dir=run_dir / element.dir_name)
        sub = submitter.submit(element_plan, element.loaded, argv, trial=asked)
        manifest = record(run_dir, manifest, element, label, sub, out)
        failed += follow(sub, out) != FINAL_OK
    return failed


def with_trial(sweep_dir: Path, element: SweepElement) -> tuple[SweepElement, TrialRecord]:
    """A search's element run here: its trial asked before it starts, its config with the trial's
    values (on Slurm the element's batch script asks, and its ranks add the values)."""
    ref = StudyRef.of_sweep(sweep_dir)
    assert ref is not None
    record = trial.ask(ref, sweep_dir / element.dir_name, element.index)
    resolved = trial.applied_to(element.loaded.resolved, record)
    experiment = dataclasses.replace(element.loaded.experiment, train=resolved["train"])
    loaded = dataclasses.replace(element.loaded, experiment=experiment, resolved=resolved)
    return dataclasses.replace(element, overrides=record.params, loaded=loaded), record


def record(
    run_dir: Path,
    manifest: SweepManifest,
    element: SweepElement,
    label: str,
    sub: submitter.Submission,
    out: TextIO,
) -> SweepManifest:
    """Record an element submitted on its own in the sweep manifest, and say so; the manifest as
    written."""
    updated = submitter.record_submission(run_dir, manifest, sub, element.index)
    out.write(f"slurmddp: element {element.index} ({label}): job {sub.job_id}\n")
    return updated


def wait(sweep_dir: Path, out: TextIO, poll_s: float = 5.0, closing: bool = False) -> int:
    """Poll until no element is pending or running, then print the status table (`closing`: and
    the block that ends `submit --wait`)."""
    target = runs.load(sweep_dir)
    quiet = 0
    seen: dict[int | None, str] = {}
    # Two quiet polls in a row: a requeued element can be between two states for a moment.
    while quiet < 2:
        polled = runs.rows(target, with_usage=False)
        say_changes(polled, seen, out)
        active = any(row.state in runs.ACTIVE_STATES for row in polled)
        quiet = 0 if active else quiet + 1
        time.sleep(poll_s if active else 1.0)
    rows = print_status(sweep_dir, out)
    if closing:
        print_end(sweep_dir, rows, out)
    return ALL_COMPLETED if all(row.state == FINAL_OK for row in rows) else EXIT_JOB_FAILED


def say_changes(rows: Sequence[runs.Row], seen: dict[int | None, str], out: TextIO) -> None:
    """A line for each element whose state is new since the last poll (`seen`, updated): a sweep
    of hours would otherwise print nothing between its submission and its final table."""
    ended = sum(row.state not in runs.ACTIVE_STATES for row in rows)
    for row in rows:
        if seen.get(row.index) == row.state:
            continue
        seen[row.index] = row.state
        where = f" at step {row.step}" if row.step is not None and row.state != "PENDING" else ""
        label = f" ({describe(row.overrides)})" if row.overrides else ""
        out.write(f"slurmddp: element {row.index}{label} {row.state}{where}; {ended} of {len(rows)} ended\n")
    out.flush()


def print_status(run_dir: Path, out: TextIO) -> list[runs.Row]:
    target = runs.load(run_dir)
    rows = runs.rows(target)
    out.write(report.status_table(target, rows, target.metric) + "\n")
    out.flush()
    return rows


def print_end(sweep_dir: Path, rows: Sequence[runs.Row], out: TextIO) -> None:
    """After the status table of a sweep that ended, the block that ends `submit --wait` of a
    run: where the sweep is, and the commands to go on with."""
    print_block(out, [("sweep dir", str(sweep_dir))], next_steps(sweep_dir, rows))


def next_steps(sweep_dir: Path, rows: Sequence[runs.Row]) -> list[tuple[str, str]]:
    """The commands to try next on a sweep whose elements ended as `rows` say."""
    ref = shlex.quote(str(sweep_dir))
    steps = [
        (f"{COMMAND} status {ref}", "each element's state, step, metrics and time"),
        (f"{COMMAND} results {ref}", "the elements ranked by the sweep's metric, and a CSV"),
    ]
    failed = [row for row in rows if row.state != FINAL_OK]
    if failed:
        first = failed[0].index
        steps.append((f"{COMMAND} logs --err --index {first} {ref}", f"element {first}'s rank 0 errors"))
    if any(row.state in FAILED_STATES for row in failed):
        steps.append(
            (f"{COMMAND} resubmit --failed {ref}", "run the failed elements again from their checkpoints")
        )
    return steps
