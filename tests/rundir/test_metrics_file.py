"""metrics.jsonl: ctx.log's records, appended as before, read back without the torn line a killed
rank 0 leaves, and cut back to a resumed checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from slurmddp.rundir.metrics import (
    MetricRecord,
    append_metric,
    drop_metrics_from,
    latest_values,
    read_metrics,
)


def test_a_record_is_the_line_ctx_log_wrote(tmp_path: Path) -> None:
    append_metric(tmp_path, MetricRecord(3, 1700000000.123, {"loss": 0.5, "perf/steps_per_s": 2.0}))
    old = {"step": 3, "time": 1700000000.123, "loss": 0.5, "perf/steps_per_s": 2.0}
    assert (tmp_path / "metrics.jsonl").read_text() == json.dumps(old) + "\n"
    assert read_metrics(tmp_path) == [MetricRecord(3, 1700000000.123, {"loss": 0.5, "perf/steps_per_s": 2.0})]
    assert MetricRecord.from_json(old).to_json() == old


def test_the_reader_skips_a_torn_line_and_an_early_record_reads(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 0, "loss": 1.0}\n[1]\n{"step": 2, "acc": 0.9}\n{"step": 4'
    )
    records = read_metrics(tmp_path)
    assert records == [MetricRecord(0, None, {"loss": 1.0}), MetricRecord(2, None, {"acc": 0.9})]
    assert latest_values(records) == ({"loss": 1.0, "acc": 0.9}, 2)
    assert read_metrics(tmp_path / "none") == []
    assert latest_values([]) == ({}, None)


def test_metrics_past_the_checkpoint_are_dropped_and_a_torn_line_with_them(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = [{"step": s, "loss": 1.0 / (s + 1)} for s in range(0, 12, 2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 1')
    drop_metrics_from(tmp_path, 6)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 2, 4]
    drop_metrics_from(tmp_path / "none", 6)
    assert not (tmp_path / "none").exists()
