"""`results`: a sweep's elements ranked by a metric, written as CSV and a plot where asked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurmddp.errors import SlurmddpError
from slurmddp.files import write_atomic
from slurmddp.manage import report, runs
from slurmddp.rundir.layout import RESULTS_CSV


@dataclass(frozen=True)
class Ranking:
    ranked: list[runs.Row]
    """Best first."""
    keys: list[str]
    """The sweep's override keys, one column each."""
    metrics: list[str]
    """The metric ranked by, then every other metric logged."""
    mode: str = "min"


def is_study(target: runs.Target) -> bool:
    """A scaling study's directory: its results are the study's report, not a ranking."""
    return target.sweep is not None and target.sweep.study is not None


def rank(target: runs.Target, metric: str | None, mode: str | None) -> Ranking:
    """Rank `target`'s elements by `metric` (default: the sweep's, else the first logged), best by
    `mode` (default: the sweep's, else min)."""
    rows = runs.rows(target)
    names = report.metric_names(rows)
    sweep = target.sweep
    metric = metric or target.metric or (names[0] if names else None)
    if metric is None:
        raise SlurmddpError(f"{target.dir}: no metric was logged yet (ctx.log in the training function)")
    mode = mode or (sweep.mode if sweep else None) or "min"
    ranked = report.ranked(rows, metric, mode)
    keys = list(sweep.keys) if sweep else []
    return Ranking(ranked, keys, [metric, *(m for m in names if m != metric)], mode)


def default_csv(target: runs.Target, ranking: Ranking, asked: bool) -> Path:
    """SWEEP_DIR/results.csv for the ranking `results` makes when asked for none; another one
    (`asked`: --metric or --mode, other than the sweep's own) gets a file of its own,
    results-METRIC-MODE.csv, and leaves results.csv as it was."""
    sweep = target.sweep
    own = sweep is not None and (ranking.metrics[0], ranking.mode) == (sweep.metric, sweep.mode or "min")
    if not asked or own:
        return target.dir / RESULTS_CSV
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in ranking.metrics[0])
    return target.dir / f"{Path(RESULTS_CSV).stem}-{safe}-{ranking.mode}.csv"


def verdict(ranking: Ranking) -> str:
    """What the ranking is by and who won: "ranked by the last val_loss each element logged,
    lowest first; best: element 2 (lr=0.01), val_loss 0.231 at step 880"."""
    metric = ranking.metrics[0]
    order = "lowest" if ranking.mode == "min" else "highest"
    said = f"ranked by the last {metric} each element logged, {order} first"
    best = ranking.ranked[0] if ranking.ranked else None
    if best is None or metric not in best.metrics:
        return said
    values = ", ".join(f"{k.removeprefix('train.')}={v}" for k, v in best.overrides.items())
    where = f"element {best.index}" + (f" ({values})" if values else "")
    at = f" at step {best.step}" if best.step is not None else ""
    pruned = " (pruned)" if best.shown_state == "PRUNED" else ""
    return f"{said}; best: {where}{pruned}, {metric} {best.metrics[metric]:.6g}{at}"


def write(ranking: Ranking, csv: Path | None, plot: Path | None, csv_named: bool) -> None:
    """Write the CSV to `csv` and the plot to `plot`, each where given; `csv_named`: the user gave
    the CSV's path (--csv), which an error then names."""
    writing = ""
    try:
        if csv:
            writing = f"--csv {csv}" if csv_named else str(csv)
            write_atomic(csv, report.results_csv(ranking.ranked, ranking.keys, ranking.metrics))
        if plot:
            writing = f"--plot {plot}"
            report.plot(ranking.ranked, ranking.metrics[0], plot, ranking.mode)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise SlurmddpError(
            f"{writing}: cannot write it ({where}{exc.strerror or exc}); "
            "name a file in a directory you can write"
        ) from None
