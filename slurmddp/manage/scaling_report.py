"""A scaling study's rows as a terminal table, a CSV of raw numbers and a PNG of speedup and
efficiency (the numbers and verdicts: manage/scaling.py)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import astuple, fields
from pathlib import Path

from slurmddp.errors import SlurmddpError
from slurmddp.manage.numbers import rate
from slurmddp.manage.report import table
from slurmddp.manage.scaling import EFFICIENCY_FLOOR, SCALING_NAMES, Row, ms, percent


def study_table(rows: Sequence[Row], unit: str) -> str:
    header = [
        "index",
        "element",
        "nodes",
        "ranks",
        unit,
        f"{unit} per rank",
        "speedup",
        "efficiency",
        "step ms",
        "comm exposed",
        "data wait",
        "barrier ms",
        "state",
    ]
    body = [
        [
            str(r.index),
            r.label,
            str(r.nodes),
            str(r.ranks),
            cell(r.throughput, rate),
            cell(r.per_rank, rate),
            cell(r.speedup, lambda v: f"{v:.2f}"),
            cell(r.efficiency, percent),
            cell(r.step_s, ms),
            cell(r.exposed_comm_frac, percent),
            cell(r.data_wait_frac, percent),
            cell(r.barrier_s, lambda v: f"{v * 1000:.2f}"),
            r.state,
        ]
        for r in rows
    ]
    return table(header, body)


def study_csv(rows: Sequence[Row], unit: str) -> str:
    """The rows' raw numbers (seconds and fractions, not ms and %); empty where not measured. The
    throughput columns are named by the unit (samples_per_s, samples_per_s_per_rank)."""
    key = unit.replace("/", "_per_")
    renamed = {"throughput": key, "per_rank": f"{key}_per_rank"}
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([renamed.get(f.name, f.name) for f in fields(Row)])
    for row in rows:
        writer.writerow(["" if value is None else value for value in astuple(row)])
    return out.getvalue()


def plot(rows: Sequence[Row], path: Path, mode: str) -> None:
    """A PNG: speedup against the ideal, and efficiency against the floor, over ranks (baseline and
    sizes only; needs the `plot` extra: matplotlib)."""
    measured = sorted(
        (r.ranks, r.speedup, 100 * r.efficiency)
        for r in rows
        if r.role in ("baseline", "size") and r.speedup is not None and r.efficiency is not None
    )
    baseline = next((r for r in rows if r.role == "baseline"), None)
    if baseline is None or not measured:
        raise SlurmddpError(
            "the scaling plot needs a speedup: no element has one (the baseline is missing or unmeasured)"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SlurmddpError("the scaling plot needs matplotlib: pip install 'slurmddp[plot]'") from None
    ranks, speedups, efficiencies = zip(*measured, strict=True)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(ranks, [n / baseline.ranks for n in ranks], "--", color="gray", label="ideal")
    left.plot(ranks, speedups, "o-", label="measured")
    left.set_xlabel("ranks")
    left.set_ylabel(f"speedup over {baseline.ranks} rank(s)")
    left.legend(fontsize="small")
    right.plot(ranks, efficiencies, "o-", label="measured")
    right.axhline(100 * EFFICIENCY_FLOOR, linestyle="--", color="gray", label=f"{EFFICIENCY_FLOOR:.0%}")
    right.set_ylim(0, max(100.0, *efficiencies) + 5)
    right.set_xlabel("ranks")
    right.set_ylabel("efficiency (%)")
    right.legend(fontsize="small")
    for axes in (left, right):
        axes.set_xticks(ranks)
    figure.suptitle(SCALING_NAMES[mode])
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)


def cell(value: float | None, shown: Callable[[float], str]) -> str:
    return "-" if value is None else shown(value)
