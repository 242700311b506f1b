"""Running a sweep without Slurm, and following a submitted one to its end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from slurmddp import plan as planning
from slurmddp import report, runs, submitter
from slurmddp.attempts import SWEEP
from slurmddp.config import Element, Loaded
from slurmddp.follow import FINAL_OK, follow
from slurmddp.fsutil import write_json
from slurmddp.sweep import describe

# Exit statuses, as the CLI's: 0 when every element completed, 1 otherwise.
ALL_COMPLETED = 0
SOME_FAILED = 1


def run_local(
    plan: planning.SubmissionPlan, loaded: Loaded, elements: list[Element], argv: list[str], out: TextIO
) -> int:
    """Without Slurm the elements run one after another on this machine, each as its own job."""
    plan.run_dir.mkdir(parents=True)
    manifest = submitter.sweep_manifest(plan, loaded, elements, argv)
    write_json(plan.run_dir / SWEEP, manifest)
    runs.remember(plan.run_dir, "sweep", plan.job_name, "local")
    out.write(f"slurmddp: running a sweep of {len(elements)} elements here, one after another\n")
    out.write(f"  sweep dir: {plan.run_dir}\n")
    failed = 0
    for element in elements:
        element_plan = planning.build(
            element.loaded,
            executor="local",
            workdir=Path.cwd(),
            run_dir=plan.run_dir / element.dir_name,
            interpreter=submitter.interpreter(),
        )
        sub = submitter.submit(element_plan, element.loaded, argv, remember=False)
        submitter.record_submission(plan.run_dir, manifest, sub, element.index)
        out.write(f"slurmddp: element {element.index} ({describe(element.overrides)}): job {sub.job_id}\n")
        failed += follow(sub, out) != FINAL_OK
    print_status(plan.run_dir, out)
    return SOME_FAILED if failed else ALL_COMPLETED


def wait(sweep_dir: Path, out: TextIO, poll_s: float = 5.0) -> int:
    """Poll until no element is pending or running, then print the status table."""
    target = runs.load(sweep_dir)
    quiet = 0
    # Two quiet polls in a row: a requeued element can be between two states for a moment.
    while quiet < 2:
        active = any(row.state in runs.ACTIVE_STATES for row in runs.rows(target))
        quiet = 0 if active else quiet + 1
        time.sleep(poll_s if active else 1.0)
    rows = print_status(sweep_dir, out)
    return ALL_COMPLETED if all(row.state == FINAL_OK for row in rows) else SOME_FAILED


def print_status(run_dir: Path, out: TextIO) -> list[runs.Row]:
    target = runs.load(run_dir)
    rows = runs.rows(target)
    out.write(report.status_table(target, rows, target.manifest.get("metric")) + "\n")
    out.flush()
    return rows
