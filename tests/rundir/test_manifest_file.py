"""manifest.json and sweep.json: what a submission writes reads back the same, byte for byte, and
the manifests of earlier versions, without the newer keys, still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurmddp.files import write_json
from slurmddp.rundir.manifest import (
    ElementEntry,
    RunManifest,
    StudySettings,
    StudySize,
    Submitted,
    SweepManifest,
    SweepSubmission,
    submitted_fields,
)

DESCRIBED: dict[str, Any] = {
    "name": "exp",
    "executor": "slurm",
    "submitted_at": "2026-11-27T10:00:00",
    "experiment": "/home/u/exp.yaml",
    "overrides": ["train.lr=0.1"],
    "argv": ["slurmddp", "submit", "exp.yaml"],
    "workdir": "/home/u",
    "run_dir": "/out/exp/20261127-100000-abcd",
    "world_size": 4,
    "logs": "/out/exp/20261127-100000-abcd/logs",
}
SUBMITTED = Submitted(**DESCRIBED)


def written(path: Path, data: Any) -> bytes:
    """The bytes the submit path wrote before the records: write_json of the plain mapping."""
    write_json(path, data)
    return path.read_bytes()


def test_a_run_manifest_writes_what_the_submit_wrote(tmp_path: Path) -> None:
    manifest = RunManifest.of(SUBMITTED, "4242")
    manifest.write(tmp_path)
    assert (tmp_path / "manifest.json").read_bytes() == written(
        tmp_path / "old.json", {**DESCRIBED, "job_id": "4242"}
    )
    assert RunManifest.read(tmp_path) == manifest
    assert manifest.jobs == ("4242",)


def test_a_resubmit_keeps_every_key_and_adds_its_own(tmp_path: Path) -> None:
    before = {**DESCRIBED, "job_id": "4242"}
    after = RunManifest.from_json(before).resubmitted("4300", 8, "2026-11-27T11:00:00", ["resubmit"])
    after.write(tmp_path)
    old = {
        **before,
        "job_id": "4300",
        "previous_jobs": ["4242"],
        "world_size": 8,
        "resubmitted_at": "2026-11-27T11:00:00",
        "resubmit_argv": ["resubmit"],
    }
    assert (tmp_path / "manifest.json").read_bytes() == written(tmp_path / "old.json", old)
    assert after.resubmitted("4400", 8, "t", []).jobs == ("4242", "4300", "4400")


def test_an_early_run_manifest_reads_and_is_written_back_as_it_was(tmp_path: Path) -> None:
    early = {"job_id": "7", "logs": "/out/logs", "executor": "slurm"}
    (tmp_path / "manifest.json").write_text(json.dumps(early))
    manifest = RunManifest.read(tmp_path)
    assert (manifest.world_size, manifest.workdir, manifest.name, manifest.previous_jobs) == (
        None,
        None,
        None,
        None,
    )
    assert manifest.to_json() == early


def sweep_json(**more: Any) -> dict[str, Any]:
    return {
        **DESCRIBED,
        "kind": "sweep",
        "max_parallel": None,
        "metric": "loss",
        "mode": "min",
        "keys": ["train.lr"],
        "elements": [{"index": 0, "dir": "000-aaaa", "overrides": {"train.lr": 0.1}}],
        "submissions": [],
        **more,
    }


def test_a_sweep_manifest_writes_what_the_submit_wrote_at_each_submission(tmp_path: Path) -> None:
    manifest = SweepManifest(
        **submitted_fields(SUBMITTED),
        metric="loss",
        mode="min",
        keys=["train.lr"],
        elements=[ElementEntry(0, "000-aaaa", {"train.lr": 0.1})],
    )
    manifest.write(tmp_path)
    assert (tmp_path / "sweep.json").read_bytes() == written(tmp_path / "old.json", sweep_json())
    pending = manifest.with_submission(SweepSubmission([0], None, 1.5, "/out/logs"))
    submitted = pending.with_last_job("50")
    submitted.write(tmp_path)
    entry = {"elements": [0], "job_id": "50", "submitted_at": 1.5, "logs": "/out/logs"}
    assert (tmp_path / "sweep.json").read_bytes() == written(
        tmp_path / "old.json", sweep_json(submissions=[entry])
    )
    assert SweepManifest.read(tmp_path) == submitted
    assert pending.without_last_submission() == manifest


def test_a_study_manifest_keeps_each_size_and_its_settings(tmp_path: Path) -> None:
    size = StudySize("size", "2 nodes", 2, 8, None)
    element = ElementEntry(1, "001-2nodes", {"resources.nodes": 2}, size)
    manifest = SweepManifest(
        **submitted_fields(SUBMITTED),
        max_parallel=1,
        mode="max",
        keys=["resources.nodes"],
        elements=[element],
        study=StudySettings("weak", "train.batch"),
    )
    manifest.write(tmp_path)
    old_element = {
        "index": 1,
        "role": "size",
        "label": "2 nodes",
        "nodes": 2,
        "ranks": 8,
        "bucket_cap_mb": None,
        "overrides": {"resources.nodes": 2},
        "dir": "001-2nodes",
    }
    old = sweep_json(
        max_parallel=1,
        metric=None,
        mode="max",
        keys=["resources.nodes"],
        elements=[old_element],
        study={"mode": "weak", "batch_key": "train.batch"},
    )
    assert (tmp_path / "sweep.json").read_bytes() == written(tmp_path / "old.json", old)
    assert SweepManifest.read(tmp_path) == manifest


def test_an_early_sweep_manifest_reads(tmp_path: Path) -> None:
    early = {
        "executor": "slurm",
        "elements": [{"index": 0, "dir": "000"}],
        "submissions": [{"elements": [0], "job_id": 40}],
    }
    (tmp_path / "sweep.json").write_text(json.dumps(early))
    manifest = SweepManifest.read(tmp_path)
    assert manifest.logs is None and manifest.metric is None and manifest.keys == []
    assert manifest.elements == [ElementEntry(0, "000", {})]
    assert manifest.submissions == [SweepSubmission([0], "40")]
    assert manifest.study is None
