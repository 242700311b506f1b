"""A run's backend, chosen once from its manifest: what each says of a run's state without a final
record, and which jobs a cancel stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmddp.cluster import slurm
from slurmddp.manage import runs
from slurmddp.manage.backend import LOCAL, SLURM, for_manifest
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
    monkeypatch.setattr(slurm, "cancel", lambda ids: cancelled.append(list(ids)))
    SLURM.cancel(["40_1"], array_ids=["40", "41"])
    SLURM.cancel(["40_1"])
    assert cancelled == [["40", "41"], ["40_1"]]
