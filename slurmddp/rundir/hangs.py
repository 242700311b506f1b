"""RUN_DIR/hangs/ATTEMPT/: the watchdog's findings on a hang (job/process/watchdog.py). Each rank
writes its report, rank_R.json (its step or start-up phase, host, whether it waits in a
collective, its innermost frame); the rank that gives the verdict gathers them and writes
summary.json, the verdict with every report. A report's keys are the watchdog's, so it stays a
mapping here; this module holds the files' names and their reading."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurmddp.files import write_json

SUMMARY = "summary.json"


def report_path(folder: Path, rank: int) -> Path:
    return folder / f"rank_{rank}.json"


def summary_path(folder: Path) -> Path:
    return folder / SUMMARY


def write_report(folder: Path, report: Mapping[str, Any]) -> None:
    write_json(report_path(folder, int(report["rank"])), report)


def read_reports(folder: Path) -> list[dict[str, Any]]:
    """Every report written whole so far, by file name; one being written is left out."""
    reports = []
    for path in sorted(folder.glob("rank_*.json")):
        try:
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return reports


def reported_ranks(folder: Path) -> list[int]:
    """The ranks whose report file exists (whole or not yet), lowest first."""
    return sorted(int(path.stem.removeprefix("rank_")) for path in folder.glob("rank_*.json"))


def write_summary(folder: Path, verdict: Mapping[str, Any], reports: Sequence[Mapping[str, Any]]) -> None:
    write_json(summary_path(folder), {**verdict, "reports": list(reports)})
