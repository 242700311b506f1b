"""`results`: a sweep's elements ranked by a metric, written as CSV (and a plot if asked)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurmddp.errors import SlurmddpError
from slurmddp.files import write_atomic
from slurmddp.layout import RESULTS_CSV
from slurmddp.manage import report, runs


@dataclass(frozen=True)
class Ranking:
    ranked: list[runs.Row]
    """Best first."""
    keys: list[str]
    """The sweep's override keys, one column each."""
    metrics: list[str]
    """The metric ranked by, then every other metric logged."""
    csv_path: Path
    """Where the CSV was written."""


def is_study(target: runs.Target) -> bool:
    """A scaling study's directory: its results are the study's report, not a ranking."""
    return "study" in target.manifest


def rank_and_write(
    target: runs.Target, metric: str | None, mode: str | None, csv: Path | None, plot: Path | None
) -> Ranking:
    """Rank `target`'s elements by `metric` (default: the sweep's, else the first logged), best by
    `mode` (default: the sweep's, else min); write the CSV to `csv` (default: SWEEP_DIR/results.csv)
    and, if given, the plot to `plot`."""
    rows = runs.rows(target)
    names = report.metric_names(rows)
    metric = metric or target.manifest.get("metric") or (names[0] if names else None)
    if metric is None:
        raise SlurmddpError(f"{target.dir}: no metric was logged yet (ctx.log in the training function)")
    ranked = report.ranked(rows, metric, mode or target.manifest.get("mode") or "min")
    keys = list(target.manifest.get("keys") or [])
    metrics = [metric, *(m for m in names if m != metric)]
    csv_path = csv or target.dir / RESULTS_CSV
    writing = f"--csv {csv_path}" if csv else str(csv_path)
    try:
        write_atomic(csv_path, report.results_csv(ranked, keys, metrics))
        if plot:
            writing = f"--plot {plot}"
            report.plot(ranked, metric, plot)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise SlurmddpError(
            f"{writing}: cannot write it ({where}{exc.strerror or exc}); "
            "name a file in a directory you can write"
        ) from None
    return Ranking(ranked, keys, metrics, csv_path)
