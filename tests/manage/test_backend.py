"""A run's backend, chosen once from its manifest: what each says of a run's state without a final
record, and which jobs a cancel stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmddp.cluster import slurm
from slurmddp.manage import backend, runs
from slurmddp.manage.backend import LOCAL, SLURM, SaveFirst, for_manifest
from slurmddp.rundir.layout import FAILURE, RESULT
from slurmddp.rundir.manifest import RunManifest


@pytest.mark.parametrize(
    ("manifest", "chosen"),
    [({"executor": "local"}, LOCAL), ({"executor": "slurm"}, SLURM), ({}, SLURM)],
)
def test_the_manifest_chooses_the_backend(manifest: dict[str, str], chosen: object) -> None:
    # A manifest without an executor was written before they named one, on Slurm.
    assert for_manifest(RunManifest.from_json({"job_id": "7", **manifest})) is chosen


def test_a_slurm_run_is_what_the_scheduler_says(tmp_path: Path) -> None:
    assert SLURM.state(tmp_path, None, {}) is None
    assert SLURM.state(tmp_path, "7", {"7": "PENDING"}) == "PENDING"
    assert SLURM.state(tmp_path, "8", {"7": "PENDING"}) == "UNKNOWN"


def test_a_local_run_is_what_its_directory_and_process_say(tmp_path: Path) -> None:
    assert LOCAL.job_states(["1"]) == {} and LOCAL.allocations(["1"]) is None
    assert LOCAL.state(tmp_path, None, {}) == "UNKNOWN"
    (tmp_path / FAILURE).write_text("{}")
    assert LOCAL.state(tmp_path, "99999999", {}) == "FAILED"
    (tmp_path / RESULT).write_text("{}")
    assert LOCAL.state(tmp_path, "99999999", {}) == "COMPLETED"


def test_status_reads_a_local_sweep_without_asking_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "job_states", lambda ids: pytest.fail("asked squeue about a local run"))
    element = tmp_path / "000"
    element.mkdir()
    (element / RESULT).write_text("{}")
    sweep = {
        "executor": "local",
        "logs": str(tmp_path / "logs"),
        "elements": [{"index": 0, "dir": "000", "overrides": {}}],
        "submissions": [{"elements": [0], "job_id": "99999999"}],
    }
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    target = runs.load(tmp_path)
    assert target.executor == "local"
    assert [row.state for row in runs.rows(target)] == ["COMPLETED"]


def test_slurm_cancels_a_whole_sweep_by_its_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled: list[list[str]] = []
    monkeypatch.setattr(slurm, "cancel_queued", lambda ids: cancelled.append(list(ids)))
    SLURM.cancel(["40_1"], array_ids=["40", "41"])
    SLURM.cancel(["40_1"])
    assert cancelled == [["40", "41"], ["40_1"]]


def test_a_slurm_cancel_stops_the_running_ranks_and_waits_for_them_before_scancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a plain scancel loses: its SIGTERM reaches every process of the step, and the
    # DataLoader workers die of it before their rank can save. The order here is the fix's.
    queue = {"40_0": "RUNNING", "40_1": "RUNNING", "40_2": "PENDING"}
    done: list[tuple[str, ...]] = []

    def signal(job: str, name: str) -> None:
        done.append(("signal", job, name))

    def queue_state(job: str) -> str | None:
        if job == "40_1" and ("signal", "40_1", "USR2") in done:
            queue.pop("40_1", None)  # its ranks saved and the job ended
        return queue.get(job)

    monkeypatch.setattr(slurm, "queue_state", queue_state)
    monkeypatch.setattr(slurm, "signal", signal)
    monkeypatch.setattr(slurm, "cancel_pending", lambda ids: done.append(("pending", *ids)))
    monkeypatch.setattr(slurm, "cancel_queued", lambda ids: done.append(("scancel", *ids)))
    monkeypatch.setattr(backend, "CANCEL_POLL_S", 0.01)
    told: list[list[str]] = []
    save = SaveFirst("USR2", 0.2, lambda jobs: told.append(list(jobs)))
    assert SLURM.cancel(["40_0", "40_1", "40_2"], array_ids=["40"], save=save) == ["40_1"]
    assert told == [["40_0", "40_1"]]
    assert done == [
        ("pending", "40"),
        ("signal", "40_0", "USR2"),
        ("signal", "40_1", "USR2"),
        ("scancel", "40"),  # after the wait: 40_0 never ended by itself
    ]
    done.clear()
    SLURM.cancel(["40_0"])  # `cancel --now`
    assert done == [("scancel", "40_0")]


def test_a_job_completing_after_the_stop_signal_counts_as_ended_by_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # COMPLETING: the batch script and its steps are over; the nodes' cleanup can hold the job in
    # the queue past the save's wait on a loaded cluster.
    monkeypatch.setattr(slurm, "queue_state", lambda job: {"50": "COMPLETING"}.get(job, "RUNNING"))
    monkeypatch.setattr(slurm, "signal", lambda job, name: None)
    monkeypatch.setattr(slurm, "cancel_pending", lambda ids: None)
    monkeypatch.setattr(slurm, "cancel_queued", lambda ids: None)
    monkeypatch.setattr(backend, "CANCEL_POLL_S", 0.01)
    save = SaveFirst("USR2", 0.1, lambda jobs: None)
    assert SLURM.cancel(["50"], save=save) == []  # never RUNNING: nothing was signalled
    states = iter(["RUNNING", "COMPLETING"])
    monkeypatch.setattr(slurm, "queue_state", lambda job: next(states, "COMPLETING"))
    assert SLURM.cancel(["51"], save=save) == ["51"]
