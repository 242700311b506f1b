"""What a script (a plain loop, or a framework's through its integration) gets of a search:
`slurmddp.report(step, **metrics)`, its `ctx.log`, and `slurmddp.params()`, its trial's values.

`report` appends to RUN_DIR/metrics.jsonl on rank 0 (`status`, `results` and the study read it)
and, in a search's trial, reports the sweep's metric to the study and asks the pruner. A pruned
trial stops as a preemption does: `should_stop()` says True on every rank at the same step, the
script saves and calls `exit_for_requeue()`, and the run ends PRUNED, not requeued (its trial
record says so before the stop is asked). Free outside a slurmddp job and on other ranks.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

from slurmddp.errors import ConfigError
from slurmddp.job.process import stop
from slurmddp.job.script import scriptrun
from slurmddp.rundir.metrics import MetricRecord, append_metric, drop_metrics_from
from slurmddp.rundir.trial import TrialRecord
from slurmddp.search.trial import Reporter

RUN_DIR_ENV = "SLURMDDP_RUN_DIR"
_reporter: Reporter | Literal[False] | None = None
_reported = False


def report(step: int, **metrics: Any) -> None:
    """Record `metrics` (numbers, or one-element tensors) at `step`, from rank 0; in a search's
    trial, the sweep's metric goes to the study and the pruner may ask for the stop."""
    global _reporter
    where = os.environ.get(RUN_DIR_ENV)
    if not where or os.environ.get("RANK", "0") != "0":
        return
    run_dir = Path(where)
    values = {name: float(getattr(v, "item", lambda v=v: v)()) for name, v in metrics.items()}
    if _first_report():
        # A script that resumed from a checkpoint of its own older than the stop logs those
        # steps again: the earlier attempt's records of them go, as a resumed ctx.loop's do, and
        # the step fixes where this attempt resumed (progress and goodput count from it).
        drop_metrics_from(run_dir, int(step))
        scriptrun.anchor(int(step))
    append_metric(run_dir, MetricRecord(int(step), round(time.time(), 3), values))
    if _reporter is None:
        _reporter = Reporter.open(run_dir) or False
    if _reporter is False:
        return
    if _reporter.report(int(step), values):
        record = TrialRecord.read(run_dir)
        if record is not None:
            record.ended("pruned", step=int(step)).write(run_dir)
        stop.ask()
    problem = _reporter.never_logged()
    if problem is not None:
        raise ConfigError(problem)


def total_steps(total: int) -> None:
    """Say how many optimizer steps the whole run makes, from any rank, once or whenever it
    changes: `status` and `submit --wait` then show a script's ETA and share done. slurmddp's
    Trainer integrations say it themselves (HF's max_steps, Lightning's estimated_stepping_batches)."""
    scriptrun.expect_total(int(total))


def _first_report() -> bool:
    """Whether this is the process's first `report`: its attempt's first."""
    global _reported
    first, _reported = not _reported, True
    return first


def in_search() -> bool:
    """Whether this run is a search's trial (a framework's integration then reports its logs)."""
    where = os.environ.get(RUN_DIR_ENV)
    return bool(where) and TrialRecord.read(Path(where or ".")) is not None


def numbers(values: dict[str, Any]) -> dict[str, float]:
    """The values a framework logged that are numbers (or one-element tensors)."""
    out = {}
    for name, value in values.items():
        value = value.item() if getattr(value, "numel", lambda: 0)() == 1 else value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[str(name)] = float(value)
    return out


def params() -> dict[str, Any]:
    """The values this run's search trial chose, by their key under train: (`lr`, `opt.lr`); {}
    where the run is no search's trial. Every rank reads the same."""
    where = os.environ.get(RUN_DIR_ENV)
    record = TrialRecord.read(Path(where)) if where else None
    return {} if record is None else {k.removeprefix("train."): v for k, v in record.params.items()}


def pruned() -> bool:
    """Whether the stop `should_stop()` says is the pruner's (no need to save), not a preemption's."""
    where = os.environ.get(RUN_DIR_ENV)
    record = TrialRecord.read(Path(where)) if where else None
    return record is not None and record.state == "pruned"
