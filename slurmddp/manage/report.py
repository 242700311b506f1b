"""Rows of runs -> text tables, JSON, CSV and a plot, for status, list and results."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slurmddp.errors import SlurmddpError
from slurmddp.experiment.sweep import describe
from slurmddp.manage import accounting, after, explain, goodput, numbers, runs, trials
from slurmddp.rundir.metrics import read_metrics
from slurmddp.rundir.records import SkippedSaves, SlowNode


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; numbers would read better right-aligned, but the
    overrides column is free text and left alignment keeps it scannable."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *body, strict=False)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=False))
        for row in [header, *body]
    ]
    return "\n".join(line.rstrip() for line in lines)


def status_table(target: runs.Target, rows: list[runs.Row], metric: str | None) -> str:
    shown = metric or _first_metric(rows)
    study = trials.summary(target, rows)
    header = [
        "index",
        *(["trial"] if study is not None else []),
        "overrides",
        "state",
        "attempts",
        "step",
        shown or "metric",
        "throughput",
        "elapsed",
        "cpu_h",
        "gpu_h",
        "lost",
        "goodput",
        "job",
    ]
    body = [
        [
            "-" if row.index is None else str(row.index),
            *([_trial(row)] if study is not None else []),
            describe(row.overrides) or "-",
            row.shown_state,
            str(row.attempts),
            "-" if row.step is None else str(row.step),
            _number(row.metrics.get(shown)) if shown else "-",
            row.throughput or "-",
            numbers.duration(row.elapsed_s),
            *_usage_cells(row),
            row.job_id or "-",
        ]
        for row in rows
    ]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.shown_state] = counts.get(row.shown_state, 0) + 1
    summary = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items()))
    title = f"{target.kind} {target.manifest.name or ''} ({target.executor}) {target.dir}: {summary}"
    text = f"{title}\n{table(header, body)}"
    for row in rows:
        text += "".join(f"\n{line}" for line in _notes(target, row))
    if any(set(row.excluded) - set(row.set_aside) for row in rows):
        again = "resubmit --failed" if target.kind == "sweep" else "resubmit"
        text += f"\nhosts left out stay out of later attempts; `{again} --forget-exclusions` forgets them"
    used = runs.total_usage(rows)
    if target.kind == "sweep" and used is not None:
        text += (
            f"\ntotal: {_hours(used.cpu_hours)} CPU hours, {_hours(used.gpu_hours)} GPU hours, "
            f"{numbers.duration(used.lost_hours * 3600)} lost to requeues"
        )
    summed = goodput.total(row.goodput for row in rows)
    if target.kind == "sweep" and summed is not None:
        text += f"\ntotal: {goodput.describe(summed)}"
    if study is not None:
        text += "".join(f"\n{line}" for line in study.lines())
    sweep = target.sweep
    if sweep is not None and sweep.then is not None:
        queued = f" by job {sweep.then_job}" if sweep.then_job else ""
        text += (
            f"\nthen: {sweep.then} is submitted{queued} once every element ended, with the best one's values"
        )
    return text


def _trial(row: runs.Row) -> str:
    """ "3 complete", "5 pruned@44", "-" before the element asked for its trial."""
    found = row.trial
    if found is None:
        return "-"
    return f"{found.number} {found.state}" + (f"@{found.step}" if found.state == "pruned" else "")


def _notes(target: runs.Target, row: runs.Row) -> list[str]:
    """The lines under the table for one row: the table says what; these say why, where a run was
    requeued or left nodes out, and what a resubmit would do."""
    name = "run" if row.index is None else f"element {row.index}"
    lines = []
    waiting = after.note(target, row)
    if waiting is not None:
        lines.append(f"{name}: {waiting}")
    if len(row.ended) > 1:
        lines.append(f"{name}: {'; '.join(_ended(end) for end in row.ended)}")
    if row.last_end is not None and row.last_end != "completed":
        lines.append(f"{name}: last attempt: {row.last_end}")
    if row.skipped is not None:
        lines.append(f"{name}: {skipped_saves(row.skipped)}")
    if row.slow is not None:
        lines.append(f"{name}: {slow_node(row.slow)}")
    if row.goodput is not None:
        lines.append(f"{name}: {goodput.describe(row.goodput)}")
    if row.state not in runs.ACTIVE_STATES and row.state not in ("COMPLETED", "UNSUBMITTED"):
        lines.append(f"{name}: {resumes(row.resume)}")
    for reason in explain.reasons(target.element(row.index)):
        lines.append(f"{name}: {reason.one_line(explain.workdir(target))}")
    for host, why in row.excluded.items():
        lines.append(f"{name}: leaves out {host}: {why}")
    for rank, what in row.unwatched.items():
        lines.append(
            f"{name}: rank {rank}'s peer watch {what}: a rank dying without a word is found "
            "there only by srun and the collectives' timeouts, not within a second"
        )
    return lines


def _ended(end: runs.AttemptEnd) -> str:
    """ "attempt 1: preemption at step 13", "attempt 2: failure at step 40, restarted in its
    allocation": an attempt and how it ended."""
    where = f" at step {end.step}" if end.step is not None and end.reason != "completed" else ""
    restarted = ", restarted in its allocation" if end.in_job else ""
    return f"attempt {end.attempt}: {end.reason}{where}{restarted}"


def resumes(resume: runs.Resume) -> str:
    """Where a resubmit starts, in words."""
    if resume.checkpoint is None:
        return "a resubmit starts from step 0: no complete checkpoint was saved"
    if resume.saves:
        return (
            f"a resubmit runs the script again, which resumes from the newest checkpoint it saved: "
            f"step {resume.step} ({resume.checkpoint})"
        )
    return f"a resubmit resumes from step {resume.step} (checkpoint {resume.checkpoint})"


def slow_node(slow: SlowNode) -> str:
    """ "node2 is slow: ..." as rank 0 found it."""
    return (
        f"{slow.host} is slow: its ranks compute {slow.ratio:.2f}x the median node's per step, which "
        f"slows every step by {100 * slow.slows_by:.0f}% (found at step {slow.step})"
    )


def skipped_saves(skipped: SkippedSaves) -> str:
    """How many checkpoints were not saved, and why the latest was not."""
    count = f"{skipped.count} checkpoint{'s' if skipped.count != 1 else ''}"
    return f"{count} skipped, not saved (the latest at step {skipped.step}): {skipped.why}"


def status_json(target: runs.Target, rows: list[runs.Row]) -> dict[str, Any]:
    study = trials.summary(target, rows)
    return {
        **({"study": study.to_json()} if study is not None else {}),
        "kind": target.kind,
        "dir": str(target.dir),
        "name": target.manifest.name,
        "executor": target.executor,
        "elements": [
            {**_row_json(row), "failures": [r.to_json() for r in explain.reasons(target.element(row.index))]}
            for row in rows
        ],
        "total": {**_usage_json(runs.total_usage(rows)), "goodput": _goodput_json(rows)},
    }


def _goodput_json(rows: list[runs.Row]) -> dict[str, float | None] | None:
    summed = goodput.total(row.goodput for row in rows)
    return None if summed is None else {**asdict(summed), "share": summed.share}


def _row_json(row: runs.Row) -> dict[str, Any]:
    """A row as --json gives it: numbers as numbers, each unit in its key's name."""
    data = asdict(row)
    del data["throughput"], data["pace"]
    for unit in ("samples", "steps"):
        data[f"throughput_{unit}_per_s"] = (
            row.pace.per_s if row.pace is not None and row.pace.unit == unit else None
        )
    skipped = row.skipped
    data["skipped"] = (
        None if skipped is None else {"count": skipped.count, "step": skipped.step, "why": skipped.why}
    )
    return data


def ranked(rows: list[runs.Row], metric: str, mode: str) -> list[runs.Row]:
    """Rows sorted best first by `metric`; rows without it (or with NaN) go last."""
    if not any(metric in row.metrics for row in rows):
        known = sorted({name for row in rows for name in row.metrics})
        hint = f"; logged metrics: {', '.join(known)}" if known else "; nothing was logged yet (ctx.log)"
        raise SlurmddpError(f"no element logged a metric named {metric!r}{hint}")

    def key(row: runs.Row) -> tuple[int, float]:
        value = row.metrics.get(metric)
        if value is None or math.isnan(value):
            return (2, 0.0)
        # A pruned trial's value is an early one: it ranks after every trial that ran to its end.
        return (int(row.shown_state == "PRUNED"), value if mode == "min" else -value)

    return sorted(rows, key=key)


def results_table(rows: list[runs.Row], keys: list[str], metrics: list[str]) -> str:
    header = [
        "index",
        *(k.removeprefix("train.") for k in keys),
        "state",
        "step",
        *metrics,
        "cpu_h",
        "gpu_h",
        "lost",
        "goodput",
    ]
    return table(header, [_results_cells(row, keys, metrics) for row in rows])


def results_csv(rows: list[runs.Row], keys: list[str], metrics: list[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["index", *keys, "state", "step", *metrics, "cpu_hours", "gpu_hours", "lost_hours", "goodput", "dir"]
    )
    for row in rows:
        writer.writerow(
            [
                row.index,
                *(row.overrides.get(k, "") for k in keys),
                row.shown_state,
                "" if row.step is None else row.step,
                *(row.metrics.get(m, "") for m in metrics),
                *("" if value is None else value for value in (row.cpu_hours, row.gpu_hours, row.lost_hours)),
                "" if row.goodput is None or row.goodput.share is None else round(row.goodput.share, 4),
                row.dir,
            ]
        )
    return out.getvalue()


def _results_cells(row: runs.Row, keys: list[str], metrics: list[str]) -> list[str]:
    return [
        "-" if row.index is None else str(row.index),
        *(_number(row.overrides.get(k)) for k in keys),
        row.shown_state,
        "-" if row.step is None else str(row.step),
        *(_number(row.metrics.get(m)) for m in metrics),
        *_usage_cells(row),
    ]


def _usage_cells(row: runs.Row) -> list[str]:
    """CPU hours, GPU hours and the time lost to requeues ("-" where unknown: a local run), and
    the goodput ("-" before the first attempt)."""
    lost = "-" if row.lost_hours is None else numbers.duration(row.lost_hours * 3600)
    share = None if row.goodput is None else row.goodput.share
    return [
        _hours(row.cpu_hours),
        _hours(row.gpu_hours),
        lost,
        "-" if share is None else f"{100 * share:.1f}%",
    ]


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _usage_json(used: accounting.Usage | None) -> dict[str, float | None]:
    if used is None:
        return {"cpu_hours": None, "gpu_hours": None, "lost_hours": None}
    return {"cpu_hours": used.cpu_hours, "gpu_hours": used.gpu_hours, "lost_hours": used.lost_hours}


def plot(rows: list[runs.Row], metric: str, path: Path, mode: str = "min") -> None:
    """A PNG of `metric` over steps, one line per element (needs the `plot` extra: matplotlib); a
    search's beside its optimization history: each trial's value by trial number, the pruned ones
    at their last report, and the best so far."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SlurmddpError("--plot needs matplotlib: pip install 'slurmddp[plot]'") from None
    trials = sorted((row.trial.number, row) for row in rows if row.trial is not None)
    figure, panels = plt.subplots(1, 2 if trials else 1, figsize=(14 if trials else 8, 5), squeeze=False)
    axes = panels[0][0]
    if trials:
        _history(panels[0][1], trials, metric, mode)
    for row in rows:
        # A resumed attempt logs the steps since its checkpoint again: the newest value wins.
        by_step = {
            r.step: r.values[metric]
            for r in read_metrics(Path(row.dir))
            if metric in r.values and r.step is not None
        }
        if by_step:
            steps = sorted(by_step)
            label = f"{row.index}: {describe(row.overrides)}" if row.index is not None else "run"
            axes.plot(steps, [by_step[s] for s in steps], label=label)
    axes.set_xlabel("step")
    axes.set_ylabel(metric)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)


def _history(axes: Any, trials: list[tuple[int, runs.Row]], metric: str, mode: str) -> None:
    pick = min if mode == "min" else max
    done = [
        (n, row.trial.value) for n, row in trials if row.trial is not None and row.trial.value is not None
    ]
    pruned = [
        (n, row.metrics[metric]) for n, row in trials if row.shown_state == "PRUNED" and metric in row.metrics
    ]
    if done:
        axes.plot(*zip(*done, strict=True), "o", label="complete")
        best = [pick(v for m, v in done if m <= n) for n, _ in done]
        axes.step([n for n, _ in done], best, where="post", label=f"best so far ({mode})")
    if pruned:
        axes.plot(*zip(*pruned, strict=True), "x", label="pruned (last report)")
    axes.set_xlabel("trial")
    axes.set_ylabel(metric)
    axes.set_title("optimization history")
    axes.legend(fontsize="small")


def metric_names(rows: list[runs.Row]) -> list[str]:
    return sorted({name for row in rows for name in row.metrics})


def _first_metric(rows: list[runs.Row]) -> str | None:
    names = metric_names(rows)
    return names[0] if names else None


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
