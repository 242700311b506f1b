"""slurmddp.cluster.slurm's accounting: `sacct --duplicates` text -> one Allocation per time a job
ran, and the runner that asks sacct once for every job of a run (the command replaced by a fake)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest
from slurm_samples import SACCT_DUPLICATES, SACCT_GPU

from slurmddp.cluster import slurm
from slurmddp.cluster.slurm import (
    ACCOUNTING_FIELDS,
    gpu_count,
    parse_allocations,
    parse_sacct_time,
    parse_tres,
)


def test_a_requeued_job_has_one_allocation_per_run_in_submit_order() -> None:
    allocations = parse_allocations(SACCT_DUPLICATES)
    job = [a for a in allocations if a.job_id == "1"]
    assert [(a.state, a.elapsed_s, a.cpu_seconds, a.cpus, a.gpus, a.nodes) for a in job] == [
        ("REQUEUED", 3, 6, 2, 0, "node1"),
        ("COMPLETED", 6, 12, 2, 0, "node1"),
    ]
    first, second = job
    assert first.raw_id == second.raw_id == "1"
    assert first.start is not None and first.end is not None and first.submit is not None
    assert second.start is not None and second.submit is not None
    assert first.end - first.start == 3
    # The requeue submitted the job again when the first allocation ended; it waited 12 s.
    assert second.submit == first.end and second.start - first.end == 12
    # Interleaved with array 2's lines: sacct -D orders by submit time, not by job.
    assert [a.job_id for a in allocations[:5]] == ["1", "2_0", "2_1", "1", "2_1"]


def test_array_tasks_keep_their_task_id_and_their_own_raw_id() -> None:
    allocations = parse_allocations(SACCT_DUPLICATES)
    tasks = {(a.job_id, a.raw_id, a.state) for a in allocations if a.job_id.startswith("2_")}
    assert tasks == {("2_0", "3", "COMPLETED"), ("2_1", "2", "REQUEUED"), ("2_1", "2", "COMPLETED")}
    pending = [a for a in allocations if a.job_id == "9_[2-3]"]
    assert [(a.state, a.start, a.end, a.cpus, a.cpu_seconds, a.nodes) for a in pending] == [
        ("PENDING", None, None, 0, 0, "None assigned")
    ]
    (requeued,) = [a for a in allocations if a.job_id == "9_0"]
    assert requeued.state == "REQUEUED" and requeued.raw_id == "10"


def test_a_gpu_allocation_counts_its_gpus_once_and_a_running_one_has_no_end() -> None:
    preempted, running = parse_allocations(SACCT_GPU)
    assert (preempted.state, preempted.cpus, preempted.gpus, preempted.elapsed_s) == ("PREEMPTED", 64, 8, 600)
    assert preempted.gpu_seconds == 4800 and preempted.cpu_seconds == 38400
    assert preempted.nodes == "gpu[01-02]"
    assert running.state == "RUNNING" and running.end is None and running.start is not None
    assert running.gpu_seconds == 300 * 8


def test_parse_tres_and_gpu_count() -> None:
    tres = parse_tres("billing=64,cpu=64,gres/gpu:a100=8,gres/gpu=8,mem=500G,node=2")
    assert tres == {
        "billing": "64",
        "cpu": "64",
        "gres/gpu:a100": "8",
        "gres/gpu": "8",
        "mem": "500G",
        "node": "2",
    }
    assert gpu_count(tres) == 8
    # Only typed counts (one node with two kinds): their sum.
    assert gpu_count(parse_tres("cpu=8,gres/gpu:a100=2,gres/gpu:v100=1")) == 3
    assert gpu_count(parse_tres("billing=2,cpu=2,node=1")) == 0
    assert parse_tres("") == {} and gpu_count({}) == 0


def test_parse_sacct_time() -> None:
    assert parse_sacct_time("Unknown") is None and parse_sacct_time("None") is None
    assert parse_sacct_time("") is None and parse_sacct_time("now+5") is None
    later, earlier = parse_sacct_time("2026-11-22T22:36:46"), parse_sacct_time("2026-11-22T22:36:34")
    assert later is not None and earlier is not None and later - earlier == 12


def test_lines_of_another_shape_are_skipped() -> None:
    header = "|".join(ACCOUNTING_FIELDS)
    text = f"{header}\nsacct: error: something\n1|1|COMPLETED\n\n" + SACCT_GPU
    assert len(parse_allocations(text)) == 2
    assert parse_allocations("") == []


def fake_sacct(
    monkeypatch: pytest.MonkeyPatch, stdout: str, returncode: int = 0, stderr: str = ""
) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_run(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        return subprocess.CompletedProcess(list(args), returncode, stdout, stderr)

    monkeypatch.setattr(slurm, "run", fake_run)
    return calls


def test_allocations_asks_sacct_once_with_duplicates_and_keeps_the_ids_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = fake_sacct(monkeypatch, SACCT_DUPLICATES)
    found = slurm.allocations(["2_1", "1", "9_2"])
    assert calls == [["sacct", "-D", "-X", "-n", "-P", "-j", "1,2,9", "-o", ",".join(ACCOUNTING_FIELDS)]]
    assert found is not None
    # 9_2 has not run: sacct lists it only inside the pending summary line 9_[2-3].
    assert [(a.job_id, a.state) for a in found] == [
        ("1", "REQUEUED"),
        ("2_1", "REQUEUED"),
        ("1", "COMPLETED"),
        ("2_1", "COMPLETED"),
    ]


def test_allocations_without_ids_asks_nothing_and_without_accounting_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = fake_sacct(
        monkeypatch,
        "",
        returncode=1,
        stderr="sacct: error: Slurm accounting storage is disabled",
    )
    assert slurm.allocations([]) == [] and calls == []
    assert slurm.allocations(["5"]) is None
