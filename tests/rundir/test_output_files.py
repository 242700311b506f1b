"""result.json and preflight.json: written as the ranks wrote them, read back, and read where an
earlier version left keys out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurmddp.files import write_json
from slurmddp.rundir.outputs import PreflightReport, Result
from slurmddp.rundir.records import AttemptId, completed_by

ATTEMPT = AttemptId("77", 1)


def written(path: Path, data: Any) -> bytes:
    write_json(path, data)
    return path.read_bytes()


def test_a_result_is_what_rank_0_wrote(tmp_path: Path) -> None:
    result = Result({"loss": 0.1}, [{"loss": 0.1}, None], 2, 1, 100.0, 12.5, {"steps_per_s": 3.0}, ATTEMPT)
    result.write(tmp_path)
    old = {
        "result": {"loss": 0.1},
        "ranks": [{"loss": 0.1}, None],
        "world_size": 2,
        "num_nodes": 1,
        "started_at": 100.0,
        "train_seconds": 12.5,
        "telemetry": {"steps_per_s": 3.0},
        "job_id": "77",
        "restart_count": 1,
    }
    assert (tmp_path / "result.json").read_bytes() == written(tmp_path / "old.json", old)
    assert Result.read(tmp_path) == result
    assert completed_by(tmp_path, ATTEMPT)


def test_a_result_without_telemetry_reads_and_none_is_none(tmp_path: Path) -> None:
    assert Result.read(tmp_path) is None
    write_json(tmp_path / "result.json", {"result": 3, "ranks": [3], "world_size": 1, "num_nodes": 1})
    result = Result.read(tmp_path)
    assert result is not None and result.telemetry is None and result.result == 3


def test_a_preflight_report_is_what_rank_0_wrote(tmp_path: Path) -> None:
    links = [{"src": "node1", "dst": "node2", "gbps": 9.5}]
    ranks = [{"rank": 0, "host": "node1", "sum_ok": True}]
    report = PreflightReport(True, "ok", 9.5, 4096, 5, 0.25, [], links, ranks)
    report.write(tmp_path)
    old = {
        "ok": True,
        "message": "ok",
        "bus_gbps": 9.5,
        "bytes": 4096,
        "repeats": 5,
        "seconds": 0.25,
        "suspects": [],
        "links": links,
        "ranks": ranks,
    }
    assert (tmp_path / "preflight.json").read_bytes() == written(tmp_path / "old.json", old)
    assert PreflightReport.read(tmp_path) == report


def test_an_early_preflight_report_reads(tmp_path: Path) -> None:
    assert PreflightReport.read(tmp_path) is None
    write_json(tmp_path / "preflight.json", {"ok": False, "message": "slow"})
    assert PreflightReport.read(tmp_path) == PreflightReport(False, "slow")
