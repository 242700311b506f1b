"""`sweep.then: EXP.yaml`: once a sweep ended, EXP is submitted with the best element's values and
its run directory (`train.best_run_dir`) as overrides: an evaluation of the best trial, a longer
run from it. On Slurm a one-core job queued behind the array (afterany) runs
`python -m slurmddp then SWEEP_DIR`; a local sweep does it as its last element ended."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from slurmddp.errors import EXIT_JOB_FAILED
from slurmddp.experiment.load import override_texts
from slurmddp.manage import report, runs

BEST_RUN_DIR = "train.best_run_dir"


def best(sweep_dir: Path) -> runs.Row | None:
    """The element that ran to its end with the best value of the sweep's metric; None: none did."""
    target = runs.load(sweep_dir)
    sweep = target.sweep
    if sweep is None or sweep.metric is None:
        return None
    done = [
        row
        for row in runs.rows(target, with_usage=False)
        if row.shown_state == "COMPLETED" and sweep.metric in row.metrics
    ]
    return report.ranked(done, sweep.metric, sweep.mode or "min")[0] if done else None


def command(sweep_dir: Path) -> list[str] | None:
    """The `submit` of the sweep's then-experiment; None where the sweep has none."""
    target = runs.load(sweep_dir)
    sweep = target.sweep
    if sweep is None or sweep.then is None:
        return None
    top = best(sweep_dir)
    if top is None:
        return []
    # Where the sweep ran: a local sweep's then-run stays here, a Slurm sweep's goes to its queue;
    # and beside the sweep, under its output_dir (OUTPUT_DIR/NAME/STAMP is the sweep's directory).
    overrides = [
        *override_texts(top.overrides),
        f"{BEST_RUN_DIR}={top.dir}",
        f"executor={target.executor}",
        f"output_dir={sweep_dir.resolve().parent.parent}",
    ]
    return [sys.executable, "-m", "slurmddp", "submit", sweep.then, *overrides, "--no-wait"]


def submit_then(sweep_dir: Path, out: TextIO) -> int:
    """Submit the then-experiment of the sweep in `sweep_dir`, as its command line says."""
    line = command(sweep_dir)
    if line is None:
        return 0
    if not line:
        out.write(
            f"slurmddp: sweep.then: no element of {sweep_dir} completed with its metric; nothing submitted\n"
        )
        return EXIT_JOB_FAILED
    workdir = runs.load(sweep_dir).manifest.workdir
    out.write(f"slurmddp: sweep.then: {shlex.join(line[2:])}\n")
    out.flush()
    proc = subprocess.run(line, cwd=workdir, capture_output=True, text=True, check=False)
    out.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode
