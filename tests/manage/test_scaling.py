"""The scaling study's analysis over hand-built elements with known numbers: the ratios, each cause
named only where its evidence is, the bucket advice, and the CSV and PNG it writes."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from slurmddp.errors import SlurmddpError
from slurmddp.manage.scaling import Analysis, Point, analyse
from slurmddp.manage.scaling_report import plot, study_csv, study_table
from slurmddp.rundir.outputs import PreflightReport

# A telemetry in which nothing is wrong: communication hidden, no data wait, buckets that take far
# longer than a barrier (each 10 ms against 0.1 ms).
QUIET = {
    "steps": 50,
    "step_s": 0.2,
    "data_wait_frac": 0.01,
    "comm_s": 0.04,
    "exposed_comm_frac": 0.02,
    "buckets": 4,
    "bucket_bytes": [25 * 2**20] * 4,
    "barrier_s": 0.0001,
    "backend": "nccl",
    "transport": "ib",
    "comm_measured": True,
}
EVEN_LINKS = [
    {"src": "node1", "dst": "node2", "gbps": 10.0},
    {"src": "node2", "dst": "node3", "gbps": 10.0},
    {"src": "node3", "dst": "node1", "gbps": 10.0},
]
SLOW_NODE3 = [
    {"src": "node1", "dst": "node2", "gbps": 10.0},
    {"src": "node2", "dst": "node3", "gbps": 0.1},
    {"src": "node3", "dst": "node1", "gbps": 0.1},
]


def point(
    index: int,
    ranks: int,
    samples: float | None,
    *,
    role: str = "size",
    state: str = "COMPLETED",
    bucket: float | None = None,
    preflight_links: list[dict[str, Any]] | None = None,
    **telemetry: Any,
) -> Point:
    """An element on ranks/4 nodes (at least 1) whose telemetry is QUIET with `telemetry` on top."""
    nodes = max(1, ranks // 4)
    label = (
        "baseline" if role == "baseline" else f"{nodes} nodes" + (f", bucket {bucket:g} MB" if bucket else "")
    )
    return Point(
        index=index,
        label=label,
        nodes=nodes,
        ranks=ranks,
        bucket_cap_mb=bucket,
        state=state,
        telemetry={**QUIET, "samples_per_s": samples, "steps_per_s": 5.0 * ranks, **telemetry},
        preflight=None if preflight_links is None else PreflightReport(True, "", links=preflight_links),
        role=role,
    )


def baseline(samples: float = 100.0, **telemetry: Any) -> Point:
    return point(0, 1, samples, role="baseline", **telemetry)


def healthy_study() -> list[Point]:
    return [baseline(), point(1, 4, 380.0), point(2, 8, 760.0), point(3, 12, 1140.0)]


def lines_about(analysis: Analysis, label: str) -> list[str]:
    return [
        line for line in analysis.verdicts if line.startswith(f"{label}:") or line.startswith(f"{label} (")
    ]


def test_speedup_and_efficiency_over_the_baseline() -> None:
    analysis = analyse([baseline(), point(1, 4, 360.0), point(2, 8, 600.0), point(3, 16, 800.0)], "weak")
    assert analysis.unit == "samples/s"
    assert [r.speedup for r in analysis.rows] == pytest.approx([1.0, 3.6, 6.0, 8.0])
    assert [r.efficiency for r in analysis.rows] == pytest.approx([1.0, 0.9, 0.75, 0.5])
    assert [r.per_rank for r in analysis.rows] == pytest.approx([100.0, 90.0, 75.0, 50.0])
    assert analysis.verdicts[-1] == (
        "weak scaling (same batch per rank): efficiency 50.0% at 16 ranks (4 nodes) is below the 90% floor"
    )


def test_a_baseline_of_several_ranks_is_the_ideal_speedups_unit() -> None:
    analysis = analyse([point(0, 4, 400.0, role="baseline"), point(1, 8, 720.0)], "strong")
    assert analysis.rows[1].speedup == pytest.approx(1.8)
    assert analysis.rows[1].efficiency == pytest.approx(0.9)


def test_steps_per_second_for_all_when_one_element_counted_no_samples() -> None:
    analysis = analyse([baseline(), point(1, 4, None), point(2, 8, 760.0)], "weak")
    assert analysis.unit == "steps/s"
    # steps_per_s is 5 per rank in every element: ideal scaling.
    assert [r.throughput for r in analysis.rows] == pytest.approx([5.0, 20.0, 40.0])
    assert [r.efficiency for r in analysis.rows] == pytest.approx([1.0, 1.0, 1.0])
    assert "steps/s per rank" in study_table(analysis.rows, analysis.unit).splitlines()[0]


def test_a_healthy_study_is_within_the_thresholds() -> None:
    analysis = analyse(healthy_study(), "weak")
    assert analysis.verdicts == (
        "weak scaling (same batch per rank) is within the thresholds: efficiency 95.0% at 12 ranks "
        "(3 nodes); every size reaches 90% with at most 10% of the step in exposed communication",
    )
    assert analysis.bucket_advice is None


def test_exposed_communication_flags_a_size_with_good_efficiency() -> None:
    study = [baseline(), point(1, 4, 380.0, exposed_comm_frac=0.25, comm_s=0.05)]
    lines = lines_about(analyse(study, "weak"), "1 nodes")
    assert lines[0] == "1 nodes (4 ranks): efficiency 95.0% (speedup 3.80, ideal 4)"
    assert lines[1].startswith(
        "1 nodes: communication is not hidden behind compute: 25.0% of the step "
        "(all-reduces take 50.00 ms of each step in all)"
    )
    assert len(lines) == 2
    assert "is below the 90% floor" not in analyse(study, "weak").verdicts[-1]


def test_tcp_is_a_cause_only_where_communication_shows() -> None:
    exposed = analyse([baseline(), point(1, 8, 560.0, transport="tcp", exposed_comm_frac=0.3)], "weak")
    assert any(
        line.startswith("2 nodes: gradients go over TCP sockets (NCCL without InfiniBand/RoCE")
        for line in exposed.verdicts
    )
    gloo = analyse(
        [baseline(), point(1, 8, 560.0, transport="tcp", backend="gloo", exposed_comm_frac=0.3)], "weak"
    )
    assert any("TCP sockets (gloo always does" in line for line in gloo.verdicts)
    hidden = analyse([baseline(), point(1, 8, 560.0, transport="tcp", exposed_comm_frac=0.05)], "weak")
    assert not any("TCP" in line for line in hidden.verdicts)
    assert any("no cause visible in the telemetry: 5.0% exposed communication" in v for v in hidden.verdicts)


def test_latency_bound_buckets_are_named_with_their_count_and_size() -> None:
    # 8 buckets in 4 ms: 0.5 ms each, under 4 barriers of 0.2 ms.
    small = {"comm_s": 0.004, "buckets": 8, "bucket_bytes": [2 * 2**20] * 8, "barrier_s": 0.0002}
    flagged = analyse([baseline(), point(1, 8, 560.0, **small)], "weak")
    assert any(
        "8 gradient buckets of 2.00 MB on average take 0.50 ms each to all-reduce, under 4 barrier "
        "latencies (0.20 ms each)"
        in line
        and "raise ddp.bucket_cap_mb" in line
        for line in flagged.verdicts
    )
    for fine in ({**small, "barrier_s": 0.0001}, {**small, "buckets": 1}, {**small, "comm_measured": False}):
        verdicts = analyse([baseline(), point(1, 8, 560.0, **fine)], "weak").verdicts
        assert not any("gradient buckets" in line for line in verdicts), fine


def test_data_wait_is_named_only_over_the_ceiling() -> None:
    waiting = analyse([baseline(), point(1, 8, 560.0, data_wait_frac=0.3)], "weak")
    assert (
        "2 nodes: ranks wait for data 30.0% of the step: more DataLoader workers (num_workers), "
        "faster storage" in waiting.verdicts
    )
    fed = analyse([baseline(), point(1, 8, 560.0, data_wait_frac=0.05)], "weak")
    assert not any("wait for data" in line for line in fed.verdicts)


def test_the_slow_preflight_link_names_the_host_on_both_slow_links() -> None:
    slow = analyse([baseline(), point(1, 12, 600.0, preflight_links=SLOW_NODE3)], "weak")
    [line] = [v for v in slow.verdicts if "preflight measured slow links" in v]
    assert line == (
        "3 nodes: the preflight measured slow links on node3 (node2->node3 0.10 Gb/s, node3->node1 "
        "0.10 Gb/s, the fastest 10.00 Gb/s): exclude it (resources.exclude=node3) or report it to the "
        "cluster admins"
    )
    even = analyse([baseline(), point(1, 12, 600.0, preflight_links=EVEN_LINKS)], "weak")
    assert not any("slow links" in line for line in even.verdicts)
    assert any("no slow preflight link" in line for line in even.verdicts)


def test_a_slow_link_between_two_nodes_names_both_ends() -> None:
    links = [{"src": "node1", "dst": "node2", "gbps": 10.0}, {"src": "node2", "dst": "node1", "gbps": 1.0}]
    verdicts = analyse([baseline(), point(1, 8, 560.0, preflight_links=links)], "weak").verdicts
    assert any("slow links on node1, node2" in v and "exclude one of them" in v for v in verdicts)


def test_a_good_size_gets_no_cause_even_with_a_slow_link() -> None:
    analysis = analyse(
        [baseline(), point(1, 12, 1140.0, preflight_links=SLOW_NODE3, data_wait_frac=0.3)], "weak"
    )
    assert len(analysis.verdicts) == 1
    assert "within the thresholds" in analysis.verdicts[0]


def test_the_hint_without_a_visible_cause_depends_on_the_mode() -> None:
    study = [baseline(), point(1, 8, 560.0)]
    [weak] = [v for v in analyse(study, "weak").verdicts if "no cause visible" in v]
    # Strong scaling: each of 8 ranks computes an eighth of the baseline's step (10 % over).
    study = [baseline(), point(1, 8, 560.0, step_s=0.2 / 8 * 1.1)]
    [strong] = [v for v in analyse(study, "strong").verdicts if "no cause visible" in v]
    assert "torch.profiler" in weak
    assert "share of the global batch shrinks" in strong
    assert "no latency-bound buckets, no preflight links to compare" in weak


def test_failed_and_unmeasured_elements_are_reported_not_computed() -> None:
    missing = Point(4, "4 nodes", 4, 16, None, "COMPLETED", None, None, "size")
    study = [*healthy_study()[:3], point(3, 12, 1140.0, state="FAILED"), missing]
    analysis = analyse(study, "weak")
    failed, unmeasured = analysis.rows[3], analysis.rows[4]
    assert (failed.throughput, failed.speedup, failed.efficiency, failed.step_s) == (None, None, None, None)
    assert (unmeasured.throughput, unmeasured.efficiency) == (None, None)
    assert "3 nodes (12 ranks): FAILED, not measured" in analysis.verdicts
    assert (
        "4 nodes (16 ranks): completed without telemetry in its result.json, not measured"
        in analysis.verdicts
    )
    assert analysis.verdicts[-1] == (
        "weak scaling (same batch per rank): no efficiency at the largest size, 16 ranks (4 nodes): "
        "no throughput measured; the largest measured, 8 ranks (2 nodes): 95.0%"
    )
    table_rows = study_table(analysis.rows, analysis.unit).splitlines()
    assert table_rows[4].split()[-1] == "FAILED"
    assert table_rows[4].count(" - ") >= 8


def test_no_speedup_without_a_measured_baseline() -> None:
    analysis = analyse([baseline(state="FAILED"), point(1, 4, 380.0), point(2, 8, 700.0)], "strong")
    assert all(r.speedup is None and r.efficiency is None for r in analysis.rows)
    assert analysis.rows[1].throughput == 380.0
    assert analysis.verdicts[-1] == (
        "strong scaling (same global batch): the baseline (element 0) ended FAILED: speedup and "
        "efficiency cannot be computed"
    )
    with pytest.raises(SlurmddpError, match="needs a speedup"):
        plot(analysis.rows, Path("unused.png"), "strong")


def test_missing_telemetry_values_read_as_not_measured() -> None:
    bare = Point(
        1, "2 nodes", 2, 8, None, "COMPLETED", {"samples_per_s": 600.0, "step_s": None}, None, "size"
    )
    analysis = analyse([baseline(), bare], "weak")
    row = analysis.rows[1]
    assert (row.step_s, row.exposed_comm_frac, row.data_wait_frac, row.barrier_s) == (None, None, None, None)
    [hint] = [v for v in analysis.verdicts if "no cause visible" in v]
    assert "communication not measured, data wait not measured, no preflight links" in hint


def test_bucket_advice_picks_the_highest_throughput() -> None:
    study = [
        *healthy_study(),
        point(4, 12, 1000.0, role="bucket", bucket=5),
        point(5, 12, 1200.0, role="bucket", bucket=25),
        point(6, 12, 1100.0, role="bucket", bucket=100),
    ]
    assert analyse(study, "weak").bucket_advice == (
        "bucket_cap_mb: 25 gives the highest throughput at 12 ranks (5: 1,000; 25: 1,200; 100: 1,100; "
        "own: 1,140 samples/s); put `ddp: {bucket_cap_mb: 25}` in the experiment"
    )


def test_bucket_advice_keeps_the_experiments_own_size_when_it_wins() -> None:
    study = [*healthy_study(), point(4, 12, 1000.0, role="bucket", bucket=5)]
    advice = analyse(study, "weak").bucket_advice
    assert advice is not None
    assert advice.startswith("bucket_cap_mb: own gives the highest throughput")
    assert advice.endswith("keep the experiment's own ddp.bucket_cap_mb")


def test_bucket_advice_with_a_tie_and_a_failed_element() -> None:
    study = [
        *healthy_study()[:3],
        point(4, 12, 1200.0, role="bucket", bucket=100),
        point(5, 12, 1200.0, role="bucket", bucket=25),
        point(6, 12, None, role="bucket", bucket=5, state="FAILED"),
    ]
    assert analyse(study, "weak").bucket_advice == (
        "bucket_cap_mb: 25 and 100 tie for the highest throughput at 12 ranks (5: FAILED; 25: 1,200; "
        "100: 1,200 samples/s); put `ddp: {bucket_cap_mb: 25}` in the experiment"
    )


def test_bucket_advice_when_no_bucket_size_was_measured() -> None:
    study = [baseline(), point(1, 8, None, role="bucket", bucket=5, state="TIMEOUT")]
    assert (
        analyse(study, "weak").bucket_advice == "no bucket size measured a throughput at 8 ranks (5: TIMEOUT)"
    )


def test_the_csv_reads_back_into_the_same_numbers() -> None:
    analysis = analyse([*healthy_study(), point(4, 16, None, state="FAILED")], "weak")
    header, *body = list(csv.reader(io.StringIO(study_csv(analysis.rows, analysis.unit))))
    assert header[:8] == [
        "index",
        "label",
        "role",
        "nodes",
        "ranks",
        "bucket_cap_mb",
        "state",
        "samples_per_s",
    ]
    assert "samples_per_s_per_rank" in header and "efficiency" in header
    assert len(body) == 5
    for row, cells in zip(analysis.rows, body, strict=True):
        record = dict(zip(header, cells, strict=True))
        assert int(record["ranks"]) == row.ranks
        assert record["state"] == row.state
        for column, value in (
            ("samples_per_s", row.throughput),
            ("speedup", row.speedup),
            ("efficiency", row.efficiency),
            ("step_s", row.step_s),
            ("barrier_s", row.barrier_s),
        ):
            assert (float(record[column]) if record[column] else None) == value, column
    assert body[4][header.index("speedup")] == ""


@pytest.mark.process  # matplotlib's first font scan runs fc-list
def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "scaling.png"
    analysis = analyse([*healthy_study(), point(4, 12, 1000.0, role="bucket", bucket=5)], "weak")
    plot(analysis.rows, path, analysis.mode)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(SlurmddpError, match="'linear': must be one of weak, strong"):
        analyse(healthy_study(), "linear")


def test_ranks_that_compute_slower_together_than_alone_are_named() -> None:
    # Weak scaling: the baseline computes 0.2 * 0.99 s a step; 3 ranks sharing its cores take longer.
    crowded = [baseline(), point(1, 3, 150.0, step_s=0.3)]
    [line] = [v for v in analyse(crowded, "weak").verdicts if "compute slower together" in v]
    assert "each rank computes 297.00 ms a step where the baseline predicts 198.00 ms" in line
    fine = [baseline(), point(1, 3, 150.0, step_s=0.22)]  # within 20 %
    assert not [v for v in analyse(fine, "weak").verdicts if "compute slower together" in v]
    # Strong scaling expects a third of the baseline's compute on each of 3 ranks.
    strong = [baseline(), point(1, 3, 150.0, step_s=0.2)]
    assert [v for v in analyse(strong, "strong").verdicts if "predicts 66.00 ms" in v]
