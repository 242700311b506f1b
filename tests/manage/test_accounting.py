"""CPU hours, GPU hours and the time lost to requeues: the pure sums over allocations and attempt
records, then `status` and `results` of a sweep with fake squeue/sacct on PATH."""

from __future__ import annotations

import csv
import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slurmddp.cli.main import main
from slurmddp.cluster.slurm import ACCOUNTING_FIELDS, Allocation, JobState, parse_sacct_time
from slurmddp.defaults import EndReason
from slurmddp.manage import accounting, runs
from slurmddp.manage.accounting import Usage
from slurmddp.rundir.records import AttemptEvent, AttemptId, Begin, End, Resubmit, append_attempt


def at(clock: str) -> float:
    """Unix time of HH:MM:SS on the day of the samples, as sacct's local times read."""
    value = parse_sacct_time(f"2026-11-22T{clock}")
    assert value is not None
    return value


def allocation(job: str, raw: str, state: JobState, start: str, end: str | None, **kw: Any) -> Allocation:
    """An allocation of 4 CPUs submitted when it started; `kw` replaces fields."""
    began, ended = at(start), None if end is None else at(end)
    elapsed = int((ended or began) - began)
    base = Allocation(job, raw, state, began, began, ended, elapsed, elapsed * 4, 4, 0, "node1")
    return replace(base, **kw)


def end_record(job: str, clock: str, reason: EndReason, requeue: bool, step: int | None = 100) -> End:
    message = "completed" if reason == "completed" else f"{reason} at step {step}"
    return End(reason, step, at(clock), requeue, not requeue, message, attempt_id=AttemptId(job, 0))


def begin_record(job: str, clock: str) -> Begin:
    return Begin(0, at(clock), "node1", "node1", AttemptId(job, 0))


# ---- the sums ----


def test_a_run_that_never_requeued_lost_nothing() -> None:
    used = accounting.usage(
        [allocation("5", "5", "COMPLETED", "10:00:00", "10:30:00", gpus=2)], [], at("11:00:00")
    )
    assert used == Usage(cpu_hours=2.0, gpu_hours=1.0, lost_hours=0.0)


def test_a_checkpointed_preemption_loses_only_the_time_after_its_stop_and_the_wait() -> None:
    allocations = [
        allocation("41", "41", "COMPLETED", "10:12:00", "10:20:00"),  # sacct's order is not run order
        allocation("41", "41", "REQUEUED", "10:00:00", "10:10:00"),
    ]
    records = [
        end_record("41", "10:09:50", "preemption", True),
        end_record("41", "10:20:00", "completed", False),
    ]
    used = accounting.usage(allocations, records, at("12:00:00"))
    assert used.cpu_hours == pytest.approx((600 + 480) * 4 / 3600)
    assert used.lost_hours * 3600 == pytest.approx(10 + 120)


def test_a_crash_loses_its_whole_allocation_and_records_of_other_jobs_do_not_count() -> None:
    allocations = [
        allocation("42", "42", "REQUEUED", "10:00:00", "10:05:00"),
        allocation("42", "42", "FAILED", "10:06:00", "10:08:00"),
    ]
    # A preemption record of another job at the same time must not be taken for this one's.
    records = [
        end_record("42", "10:04:59", "failure", True),
        end_record("43", "10:04:59", "preemption", True),
    ]
    used = accounting.usage(allocations, records, at("12:00:00"))
    assert used.lost_hours * 3600 == pytest.approx(300 + 60)
    # A stop without a step saved nothing the loop knows of: the whole allocation too.
    no_step = [end_record("42", "10:04:59", "preemption", True, step=None)]
    assert accounting.usage(allocations, no_step, at("12:00:00")).lost_hours * 3600 == pytest.approx(360)


def test_a_job_pending_again_loses_the_wait_until_now() -> None:
    requeued = allocation("9_0", "10", "REQUEUED", "10:00:00", "10:00:30")
    records = [end_record("10", "10:00:29", "timeout", True)]
    used = accounting.usage([requeued], records, at("10:01:30"))
    assert used.lost_hours * 3600 == pytest.approx(1 + 60)
    # Preempted in REQUEUE mode, the allocation may read PREEMPTED: squeue's PENDING tells.
    preempted = replace(requeued, state="PREEMPTED")
    assert accounting.usage([preempted], records, at("10:01:30")).lost_hours == 0.0
    assert accounting.usage([preempted], records, at("10:01:30"), {"9_0"}).lost_hours * 3600 == pytest.approx(
        61
    )


def test_totals_skip_runs_without_figures_and_none_without_any() -> None:
    assert accounting.total([Usage(1.0, 0.5, 0.25), None, Usage(2.0, 0.0, 0.0)]) == Usage(3.0, 0.5, 0.25)
    assert accounting.total([None, None]) is None and accounting.total([]) is None


def test_allocations_submitted_before_the_run_are_another_job_with_the_same_id() -> None:
    mine = allocation("45", "45", "COMPLETED", "11:00:00", "11:10:00")
    stale = replace(mine, submit=at("11:00:00") - 86400 * 30)
    assert accounting.submitted_since([stale, mine], at("10:59:00")) == [mine]
    assert accounting.submitted_since([stale, mine], None) == [stale, mine]


# ---- status and results of a sweep, with fake Slurm commands ----

# `sacct -D -X -n -P -o ...` for array 40 (elements 0-2) and job 45 (element 2 resubmitted): element
# 0 preempted once, element 2 crashed once, then failed for good, then ran again as job 45. The
# first line of 45 is an old job of an earlier cluster that had the same id.
ACCOUNTING = """\
45|45|COMPLETED|2025-01-01T00:00:00|2025-01-01T00:00:00|2025-01-01T10:00:00|36000|cpu=64,node=1|2304000|old
40_0|41|REQUEUED|2026-11-22T09:59:59|2026-11-22T10:00:00|2026-11-22T10:10:00|600|billing=4,cpu=4,gres/gpu=2,node=1|2400|node1
40_1|40|COMPLETED|2026-11-22T09:59:59|2026-11-22T10:00:00|2026-11-22T10:30:00|1800|billing=4,cpu=4,gres/gpu=2,node=1|7200|node2
40_2|42|REQUEUED|2026-11-22T09:59:59|2026-11-22T10:00:00|2026-11-22T10:05:00|300|billing=4,cpu=4,gres/gpu=2,node=1|1200|node3
40_2|42|FAILED|2026-11-22T10:05:00|2026-11-22T10:06:00|2026-11-22T10:08:00|120|billing=4,cpu=4,gres/gpu=2,node=1|480|node3
40_0|41|COMPLETED|2026-11-22T10:10:00|2026-11-22T10:12:00|2026-11-22T10:20:00|480|billing=4,cpu=4,gres/gpu=2,node=1|1920|node1
45|45|COMPLETED|2026-11-22T10:59:01|2026-11-22T11:00:00|2026-11-22T11:10:00|600|billing=4,cpu=4,gres/gpu=2,node=1|2400|node3
"""
STATES = "40_0|COMPLETED\n40_1|COMPLETED\n40_2|FAILED\n45|COMPLETED\n"


def fake_tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def write_lines(run_dir: Path, events: list[AttemptEvent]) -> None:
    for event in events:
        append_attempt(run_dir, event)


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A three-element sweep on Slurm whose jobs have ended, with squeue and sacct faked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "accounting.txt").write_text(ACCOUNTING)
    (tmp_path / "states.txt").write_text(STATES)
    fake_tool(bin_dir, "squeue", "exit 0")  # nothing queued any more
    fake_tool(
        bin_dir,
        "sacct",
        f'echo "$*" >> {tmp_path}/sacct.calls\n'
        f'case " $* " in *" -D "*) cat {tmp_path}/accounting.txt ;; *) cat {tmp_path}/states.txt ;; esac',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "sweep"
    dirs = ["000-aaaaaa", "001-bbbbbb", "002-cccccc"]
    for name in dirs:
        (root / name).mkdir(parents=True)
    logs = str(root / "logs")
    manifest = {
        "kind": "sweep",
        "name": "s",
        "executor": "slurm",
        "logs": logs,
        "metric": "loss",
        "mode": "min",
        "keys": ["train.lr"],
        "elements": [
            {"index": i, "dir": name, "overrides": {"train.lr": lr}}
            for i, (name, lr) in enumerate(zip(dirs, (0.1, 0.2, 0.3), strict=True))
        ],
        "submissions": [
            {"elements": [0, 1, 2], "job_id": "40", "submitted_at": at("09:59:58"), "logs": logs},
            {"elements": [2], "job_id": "45", "submitted_at": at("10:59:00"), "logs": logs},
        ],
    }
    (root / "sweep.json").write_text(json.dumps(manifest))
    write_lines(
        root / dirs[0],
        [
            begin_record("41", "10:00:01"),
            end_record("41", "10:09:50", "preemption", True, step=500),
            begin_record("41", "10:12:01"),
            end_record("41", "10:19:59", "completed", False, step=1000),
        ],
    )
    write_lines(
        root / dirs[1],
        [
            begin_record("40", "10:00:01"),
            end_record("40", "10:29:59", "completed", False, step=1000),
        ],
    )
    write_lines(
        root / dirs[2],
        [
            begin_record("42", "10:00:01"),
            end_record("42", "10:04:59", "failure", True, step=30),
            begin_record("42", "10:06:01"),
            end_record("42", "10:07:59", "failure", False, step=30),
            Resubmit(at("10:59:00"), ["resubmit"]),
            begin_record("45", "11:00:01"),
            end_record("45", "11:09:59", "completed", False, step=1000),
        ],
    )
    for name, loss in zip(dirs, (0.5, 0.25, 0.75), strict=True):
        (root / name / "metrics.jsonl").write_text(json.dumps({"step": 1000, "loss": loss}) + "\n")
    return root


# (cpu, gpu, lost) hours of each element, from ACCOUNTING and the attempt records.
EXPECTED = [
    ((600 + 480) * 4 / 3600, (600 + 480) * 2 / 3600, (10 + 120) / 3600),  # preempted once
    (2.0, 1.0, 0.0),
    ((300 + 120 + 600) * 4 / 3600, (300 + 120 + 600) * 2 / 3600, (300 + 60) / 3600),  # crashed once
]


@pytest.mark.process  # the fake squeue/sacct on PATH
def test_status_json_has_each_elements_hours_and_the_sweeps_total(
    sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", str(sweep), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    rows = shown["elements"]
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED", "COMPLETED"]
    assert [r["job_id"] for r in rows] == ["40_0", "40_1", "45"]
    for row, (cpu, gpu, lost) in zip(rows, EXPECTED, strict=True):
        assert (row["cpu_hours"], row["gpu_hours"], row["lost_hours"]) == pytest.approx((cpu, gpu, lost))
    total = shown["total"]
    assert (total["cpu_hours"], total["gpu_hours"], total["lost_hours"]) == pytest.approx(
        tuple(sum(column) for column in zip(*EXPECTED, strict=True))
    )
    calls = (sweep.parent / "sacct.calls").read_text().splitlines()
    accounting_calls = [c for c in calls if " -D " in f" {c} "]
    assert accounting_calls == [f"-D -X -n -P -j 40,45 -o {','.join(ACCOUNTING_FIELDS)}"]


@pytest.mark.process  # the fake squeue/sacct on PATH
def test_status_table_shows_the_hours_and_a_total_line(
    sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", str(sweep)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == [
        *("index", "overrides", "state", "attempts", "step", "loss", "throughput", "elapsed"),
        *("cpu_h", "gpu_h", "lost", "goodput", "job"),
    ]
    # Records without the phases of an attempt (versions before them): no goodput, not 0%.
    assert lines[2].split()[8:] == ["1.20", "0.60", "0:02:10", "-", "40_0"]
    assert lines[3].split()[8:] == ["2.00", "1.00", "0:00:00", "-", "40_1"]
    assert lines[4].split()[8:] == ["1.13", "0.57", "0:06:00", "-", "45"]
    assert lines[5:] == [
        "element 0: attempt 1: preemption at step 500; attempt 2: completed",
        "element 2: attempt 1: failure at step 30; attempt 2: failure at step 30; attempt 3: completed",
        "total: 4.33 CPU hours, 2.17 GPU hours, 0:08:10 lost to requeues",
    ]


@pytest.mark.process  # the fake squeue/sacct on PATH
def test_results_table_and_csv_have_the_hours_of_each_element(
    sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", str(sweep)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["index", "lr", "state", "step", "loss", "cpu_h", "gpu_h", "lost", "goodput"]
    assert lines[1].split() == ["1", "0.2", "COMPLETED", "1000", "0.25", "2.00", "1.00", "0:00:00", "-"]
    with (sweep / "results.csv").open() as handle:
        records = list(csv.DictReader(handle))
    by_index = {int(r["index"]): r for r in records}
    for index, (cpu, gpu, lost) in enumerate(EXPECTED):
        record = by_index[index]
        shown = (float(record["cpu_hours"]), float(record["gpu_hours"]), float(record["lost_hours"]))
        assert shown == pytest.approx((cpu, gpu, lost))


def test_a_local_run_has_no_hours_not_zero_hours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tool(bin_dir, "sacct", f"touch {tmp_path}/sacct.called; exit 1")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run = tmp_path / "run"
    run.mkdir()
    manifest = {"executor": "local", "job_id": "999999", "logs": str(run / "logs"), "world_size": 1}
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "result.json").write_text("{}")
    assert main(["status", str(run), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    (row,) = shown["elements"]
    assert row["state"] == "COMPLETED"
    assert (row["cpu_hours"], row["gpu_hours"], row["lost_hours"]) == (None, None, None)
    assert shown["total"] == {"cpu_hours": None, "gpu_hours": None, "lost_hours": None, "goodput": None}
    assert not (tmp_path / "sacct.called").exists()
    assert main(["status", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[-4:] == ["-", "-", "-", "999999"]
    assert runs.total_usage([]) is None
