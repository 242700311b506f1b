"""The files ranks leave for one another and for the login node: doctor's probe records, the
watchdog's hang reports, the trackers' run ids and a script's DDP bucket layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmddp.files import write_json
from slurmddp.rundir import hangs
from slurmddp.rundir.ddp import BucketLayout
from slurmddp.rundir.probe import ProbeReady, ProbeSeen
from slurmddp.rundir.trackers import TrackerIds


def test_the_probe_records_are_what_its_ranks_wrote(tmp_path: Path) -> None:
    ProbeReady(1, "node2", 5.0).write(tmp_path)
    write_json(tmp_path / "old-ready.json", {"rank": 1, "host": "node2", "time": 5.0})
    assert (tmp_path / "probe" / "ready-1.json").read_bytes() == (tmp_path / "old-ready.json").read_bytes()
    assert ProbeReady.count(tmp_path) == 1
    seen = ProbeSeen(1, "node2", "USR2", 6.5)
    seen.write(tmp_path)
    old = {"rank": 1, "host": "node2", "signal": "USR2", "received_at": 6.5}
    write_json(tmp_path / "old-seen.json", old)
    assert (tmp_path / "probe" / "rank-1.json").read_bytes() == (tmp_path / "old-seen.json").read_bytes()
    assert ProbeSeen.read(tmp_path, 1) == seen
    assert ProbeSeen.read(tmp_path, 0) is None
    assert ProbeSeen.count(tmp_path) == 1


def test_hang_reports_are_read_whole_and_summed_up(tmp_path: Path) -> None:
    report = {"rank": 1, "host": "node2", "step": 7, "waiting": False, "where": "train.py:3 in step"}
    hangs.write_report(tmp_path, report)
    (tmp_path / "rank_0.json").write_text('{"rank": 0')  # being written
    assert hangs.read_reports(tmp_path) == [report]
    assert hangs.reported_ranks(tmp_path) == [0, 1]
    assert hangs.report_path(tmp_path, 1).read_text() == json.dumps(report, indent=2, sort_keys=True) + "\n"
    hangs.write_summary(tmp_path, {"cause": "hung"}, [report])
    summary = json.loads(hangs.summary_path(tmp_path).read_text())
    assert summary == {"cause": "hung", "reports": [report]}


def test_tracker_ids_are_kept_for_the_next_attempt(tmp_path: Path) -> None:
    assert TrackerIds.read(tmp_path) == TrackerIds()
    TrackerIds({"wandb_run_id": "abc"}).write(tmp_path)
    write_json(tmp_path / "old.json", {"wandb_run_id": "abc"})
    assert (tmp_path / "trackers.json").read_bytes() == (tmp_path / "old.json").read_bytes()
    assert TrackerIds.read(tmp_path).ids == {"wandb_run_id": "abc"}
    (tmp_path / "trackers.json").write_text("{")
    with pytest.raises(ValueError):
        TrackerIds.read(tmp_path)


def test_a_bucket_layout_is_what_the_script_recorded(tmp_path: Path) -> None:
    layout = BucketLayout([[4, 2], [4]], [[1], [0]], [1048576, 26214400])
    layout.write(tmp_path, 0)
    old = {"shapes": [[4, 2], [4]], "buckets": [[1], [0]], "limits": [1048576, 26214400]}
    write_json(tmp_path / "old.json", old)
    assert (tmp_path / "ddp" / "0.json").read_bytes() == (tmp_path / "old.json").read_bytes()
    assert BucketLayout.read(tmp_path, 0) == layout
    assert BucketLayout.read(tmp_path, 1) is None
    (tmp_path / "ddp" / "2.json").write_text('{"shapes": []}')
    assert BucketLayout.read(tmp_path, 2) is None
