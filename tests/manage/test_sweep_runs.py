"""Runs and sweeps read back from their directories and the user's index: status rows, the status
table, ranking by a metric, and finding a run by directory, job id or as the newest submission."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from slurmddp.cluster import slurm
from slurmddp.errors import SlurmddpError
from slurmddp.manage import actions, index, report, runs, sweep_runs
from slurmddp.rundir.records import AttemptEvent, AttemptId, Begin, End, append_attempt


def test_status_rows_read_the_run_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = tmp_path / "sweep"
    dirs = ["000-aaaaaa", "001-bbbbbb"]
    for name in dirs:
        (sweep / name).mkdir(parents=True)
    (sweep / "sweep.json").write_text(
        json.dumps(
            {
                "kind": "sweep",
                "name": "s",
                "executor": "slurm",
                "logs": str(sweep / "logs"),
                "world_size": 2,
                "metric": "loss",
                "elements": [
                    {"index": 0, "dir": dirs[0], "overrides": {"train.lr": 0.1}},
                    {"index": 1, "dir": dirs[1], "overrides": {"train.lr": 0.2}},
                ],
                "submissions": [{"elements": [0, 1], "job_id": "40", "logs": str(sweep / "logs")}],
            }
        )
    )
    task = AttemptId("40_0", 0)
    lines: list[AttemptEvent] = [
        Begin(0, 100.0, "node1", "node1", task),
        End("preemption", 10, 130.0, requeue=True, final=False, message="preemption", attempt=0),
        Begin(1, 150.0, "node1", "node1", task),
        End("completed", 20, 170.0, requeue=False, final=True, message="completed", attempt=1),
    ]
    for line in lines:
        append_attempt(sweep / dirs[0], line)
    (sweep / dirs[0] / "metrics.jsonl").write_text(
        '{"step": 0, "loss": 2.5}\n{"step": 50, "perf/samples_per_s": 812.34, "perf/step_s": 0.08}\n'
        '{"step": 90, "loss": 1.5}\n{"step"'
    )
    target = runs.load(sweep / dirs[1])  # an element's directory finds its sweep
    assert target.kind == "sweep" and target.element(1).job_id == "40_1"
    asked: list[list[str]] = []
    monkeypatch.setattr(slurm, "job_states", lambda ids: asked.append(ids) or {"40_1": "PENDING"})
    monkeypatch.setattr(slurm, "allocations", lambda ids: None)  # sacct without accounting
    rows = runs.rows(target)
    assert asked == [["40_0", "40_1"]]
    assert [(r.state, r.attempts, r.step, r.metrics, r.elapsed_s) for r in rows] == [
        ("COMPLETED", 2, 90, {"loss": 1.5}, 50.0),  # the cut-off last line of metrics is skipped
        ("PENDING", 0, None, {}, 0.0),
    ]
    text = report.status_table(target, rows, "loss")
    assert "1 completed, 1 pending" in text
    # The loop's perf/ records are throughput, not metrics of the user's.
    cells = [
        "0",
        "lr=0.1",
        "COMPLETED",
        "2",
        "90",
        "1.5",
        "812",
        "samples/s",
        "0:00:50",
        "-",
        "-",
        "-",
        "-",  # records without the attempts' phases (versions before them): no goodput, not 0%
        "40_0",
    ]
    assert text.splitlines()[2].split() == cells  # no accounting: no hours, not zero hours
    assert rows[0].throughput == "812 samples/s" and rows[1].throughput is None
    assert [r.index for r in report.ranked(rows, "loss", "min")] == [0, 1]
    with pytest.raises(SlurmddpError, match="no element logged a metric named 'acc'; logged metrics: loss"):
        report.ranked(rows, "acc", "max")
    with pytest.raises(SlurmddpError, match="no element 7; the sweep's indices are 0-1"):
        target.element(7)


def test_the_index_finds_the_newest_submission_and_job_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with pytest.raises(SlurmddpError, match="nothing submitted yet"):
        runs.resolve(None)
    for job in ("7", "8"):
        run = tmp_path / f"run{job}"
        run.mkdir()
        (run / "manifest.json").write_text(
            json.dumps({"job_id": job, "logs": str(run / "logs"), "executor": "slurm"})
        )
        index.remember(run, "run", "exp", job)
    assert runs.resolve(None).dir == tmp_path / "run8"
    assert runs.resolve("7").dir == tmp_path / "run7"
    assert [r["job_id"] for r in index.recent(5)] == ["8", "7"]
    with pytest.raises(SlurmddpError, match="neither a run or sweep directory nor a job id"):
        runs.resolve("no-such-thing")


def test_an_array_task_id_or_an_elements_directory_names_that_element(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `logs 40_1` once said the sweep needs --index while `status 40_1` took it; `cancel 40_1`
    # cancelled every element.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    sweep = tmp_path / "sweep"
    dirs = ["000-aaaaaa", "001-bbbbbb"]
    for name in dirs:
        (sweep / name).mkdir(parents=True)
    manifest = {
        "kind": "sweep",
        "name": "s",
        "executor": "slurm",
        "logs": str(sweep / "logs"),
        "elements": [{"index": i, "dir": d, "overrides": {}} for i, d in enumerate(dirs)],
        "submissions": [{"elements": [0, 1], "job_id": "40", "logs": str(sweep / "logs")}],
    }
    (sweep / "sweep.json").write_text(json.dumps(manifest))
    index.remember(sweep, "sweep", "s", "40")
    whole = runs.resolve("40")
    assert whole.whole_sweep and whole.named is None
    for ref in ("40_1", str(sweep / dirs[1])):
        named = runs.resolve(ref)
        assert not named.whole_sweep and named.element(None).dir == sweep / dirs[1], ref
        assert named.element(0).dir == sweep / dirs[0]  # --index still wins
    with pytest.raises(SlurmddpError, match=r"job 40_5: .* no element that ran as that array task"):
        runs.resolve("40_5")

    monkeypatch.setattr(slurm, "job_states", lambda ids: dict.fromkeys(ids, "PENDING"))
    monkeypatch.setattr(slurm, "queue_state", lambda job: "PENDING")
    cancelled: list[list[str]] = []
    monkeypatch.setattr(slurm, "cancel_queued", lambda ids: cancelled.append(list(ids)))
    assert actions.cancel("40_1") == [f"element 1 job 40_1 ({sweep / dirs[1]})"]
    assert cancelled == [["40_1"]]
    assert not (sweep / dirs[0] / "attempts.jsonl").exists()


def test_a_sweeps_wait_says_each_elements_change_of_state_once() -> None:
    def row(index: int, state: runs.RunState, step: int | None) -> runs.Row:
        return runs.Row(index, {"lr": 0.1 * (index + 1)}, state, 1, step, {}, 0.0, "7", f"{index}")

    out = io.StringIO()
    seen: dict[int | None, str] = {}
    sweep_runs.say_changes([row(0, "RUNNING", 3), row(1, "PENDING", None)], seen, out)
    sweep_runs.say_changes([row(0, "RUNNING", 40), row(1, "PENDING", None)], seen, out)
    sweep_runs.say_changes([row(0, "COMPLETED", 80), row(1, "RUNNING", 2)], seen, out)
    assert out.getvalue().splitlines() == [
        "slurmddp: element 0 (lr=0.1) RUNNING at step 3; 0 of 2 ended",
        "slurmddp: element 1 (lr=0.2) PENDING; 0 of 2 ended",
        "slurmddp: element 0 (lr=0.1) COMPLETED at step 80; 1 of 2 ended",
        "slurmddp: element 1 (lr=0.2) RUNNING at step 2; 1 of 2 ended",
    ]
