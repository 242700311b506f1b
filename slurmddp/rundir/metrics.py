"""RUN_DIR/metrics.jsonl: rank 0's `ctx.log` records, one JSON object a line (MetricRecord).

Appended at every `ctx.log`, read by `status`, `results` and `submit --wait`. A resumed attempt
first drops the records of the steps past its checkpoint (`drop_metrics_from`), so the file reads
as one uninterrupted run. A line cut short by a killed rank 0 is skipped by every reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmddp.rundir.layout import METRICS


@dataclass(frozen=True)
class MetricRecord:
    """One line: the step, when it was logged (Unix time, to the millisecond), and the values."""

    step: int | None
    time: float | None
    values: dict[str, Any]
    """Every other key of the line: the metrics the user logged (and the loop's perf/ figures)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricRecord:
        values = {name: value for name, value in data.items() if name not in ("step", "time")}
        return cls(data.get("step"), data.get("time"), values)

    @classmethod
    def from_line(cls, line: str) -> MetricRecord | None:
        """The record of a line; None for a line cut short or not a record."""
        try:
            data = json.loads(line)
        except ValueError:
            return None
        return cls.from_json(data) if isinstance(data, dict) else None

    def to_json(self) -> dict[str, Any]:
        known = {"step": self.step, "time": self.time}
        return {**{key: value for key, value in known.items() if value is not None}, **self.values}


def append_metric(run_dir: Path, record: MetricRecord) -> None:
    with (run_dir / METRICS).open("a") as handle:
        handle.write(json.dumps(record.to_json()) + "\n")


def read_metrics(run_dir: Path) -> list[MetricRecord]:
    """Every record, oldest first; none where the file is missing."""
    try:
        text = (run_dir / METRICS).read_text()
    except OSError:
        return []
    return [record for record in map(MetricRecord.from_line, text.splitlines()) if record is not None]


def latest_values(records: Iterable[MetricRecord]) -> tuple[dict[str, Any], int | None]:
    """The newest value of each metric, and the newest step logged."""
    latest: dict[str, Any] = {}
    step: int | None = None
    for record in records:
        step = record.step if record.step is not None else step
        latest.update(record.values)
    return latest, step


def drop_metrics_from(run_dir: Path, step: int) -> None:
    """Keep only the records of steps before `step`: the ones after it were logged by an attempt
    that went on past its last checkpoint, and this attempt logs those steps again."""
    path = run_dir / METRICS
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return
    kept = [line for line in lines if _step_of(line) < step]
    if len(kept) != len(lines):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)


def _step_of(line: str) -> float:
    """A record's step; a line torn by a killed writer counts as past every step."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")
