"""Telemetry (slurmddp/job/train/telemetry.py): the interval arithmetic, the transport guessed from the
environment, the timed communication hook on three gloo ranks (the same bits as DDP's own path),
and the summary and records a real local run writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from conftest import SYNTHETIC, only_run
from torch import nn

from slurmddp.job.process.mpi import free_port
from slurmddp.job.train.telemetry import CommTimer, attach, busy_time, exposed_time, transport

RANKS = 3
"""Three ranks: a float's place in the sum then decides its bits, so a hook that rounded the
gradients differently from DDP's own path would show."""


# --- the interval arithmetic --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], 0.0),
        ([(1.0, 3.0)], 2.0),
        ([(0.0, 1.0), (2.0, 3.5)], 2.5),  # disjoint: both counted
        ([(2.0, 3.5), (0.0, 1.0)], 2.5),  # in any order
        ([(0.0, 1.0), (1.0, 2.0)], 2.0),  # touching
        ([(0.0, 2.0), (1.0, 3.0)], 3.0),  # overlapping: the overlap once
        ([(0.0, 5.0), (1.0, 2.0)], 5.0),  # nested
        # Three buckets launched together and reduced one after another: in flight 0..3, not 6.
        ([(0.0, 1.0), (0.0, 2.0), (0.0, 3.0)], 3.0),
        ([(0.0, 1.0), (0.5, 2.0), (4.0, 4.5), (4.25, 5.0)], 3.0),
    ],
)
def test_busy_time_is_the_length_of_the_union(intervals: list[tuple[float, float]], expected: float) -> None:
    assert busy_time(intervals) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], 0.0),
        ([(0.0, 1.0)], 1.0),
        ([(0.0, 1.0), (0.5, 2.0)], 1.5),  # from the last launch to the last end
        ([(0.0, 3.0), (1.0, 2.0)], 2.0),  # an earlier bucket still in flight after the last one
        ([(0.0, 1.0), (2.0, 2.25)], 0.25),  # the first bucket was hidden entirely
        ([(2.0, 2.25), (0.0, 1.0)], 0.25),
    ],
)
def test_exposed_time_runs_from_the_last_launch_to_the_last_end(
    intervals: list[tuple[float, float]], expected: float
) -> None:
    assert exposed_time(intervals) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("backend", "env", "expected"),
    [
        ("gloo", {}, "tcp"),
        ("gloo", {"NCCL_IB_HCA": "mlx5_0"}, "tcp"),
        ("nccl", {}, "auto"),
        ("nccl", {"NCCL_NET": "Socket"}, "tcp"),
        ("nccl", {"NCCL_NET": "socket", "NCCL_IB_HCA": "mlx5_0"}, "tcp"),
        ("nccl", {"NCCL_IB_DISABLE": "1", "NCCL_IB_HCA": "mlx5_0"}, "tcp"),
        ("nccl", {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_0"}, "ib"),
        ("nccl", {"NCCL_IB_HCA": "mlx5_0,mlx5_1"}, "ib"),
        ("nccl", {"NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": "3"}, "roce"),
        ("nccl", {"NCCL_IB_GID_INDEX": "3"}, "auto"),  # a GID index without an HCA: NCCL chooses
        ("nccl", {"NCCL_NET": "IB"}, "auto"),
    ],
)
def test_transport_from_the_backend_and_the_nccl_environment(
    backend: str, env: dict[str, str], expected: str
) -> None:
    assert transport(backend, env) == expected


# --- the timed hook on three gloo ranks ---------------------------------------------------------

BUCKET_MB = 0.002
"""~2 KB buckets: every 32x32 layer gets one of its own once DDP has rebuilt its buckets."""
STEPS = 5


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Linear(32, 4),
    )


def train(ddp: nn.Module, rank: int, after_step: Any = None, set_to_none: bool = True) -> None:
    """A few SGD steps on this rank's own data."""
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * rank + step)
        inputs, targets = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        optimizer.zero_grad(set_to_none=set_to_none)
        nn.functional.mse_loss(ddp(inputs), targets).backward()
        optimizer.step()
        if after_step is not None:
            after_step()


def ddp_worker(rank: int, port: int, out: str) -> None:
    """One rank: the same training without a hook, with the timed hook, under a user's own hook
    and under a built-in hook; what each left behind is saved for the test to compare."""
    from torch.nn.parallel import DistributedDataParallel

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    report: dict[str, Any] = {}

    plain = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_MB)
    train(plain, rank)
    report["plain"] = [p.detach().clone() for p in plain.parameters()]

    timed = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_MB)
    timer = CommTimer(torch.device("cpu"))
    report["attached"] = attach([timed], timer)
    per_step: list[tuple[int, list[int], list[tuple[float, float]]]] = []

    def measured() -> None:
        launched = len(timer._starts)
        intervals = timer.take()
        per_step.append((launched, list(timer.bucket_bytes), intervals))

    train(timed, rank, measured)
    report["timed"] = [p.detach().clone() for p in timed.parameters()]
    report["per_step"] = per_step
    report["rebuilt_bucket_sizes"] = timed._get_ddp_logging_data().get("rebuilt_bucket_sizes")
    report["param_bytes"] = sum(p.numel() * p.element_size() for p in timed.parameters())

    # Gradients kept between steps as views into the buckets: DDP's own path then divides them in
    # place (Reducer::mark_variable_ready_dense: bucket_view.div_) instead of multiplying.
    for timed_too in (False, True):
        kept = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=True)
        if timed_too:
            report["kept_views_attached"] = attach([kept], CommTimer(torch.device("cpu")))
        train(kept, rank, set_to_none=False)
        report[f"kept_views_{'timed' if timed_too else 'plain'}"] = [
            p.detach().clone() for p in kept.parameters()
        ]

    calls: list[int] = []

    def users_hook(group: Any, bucket: Any) -> Any:
        calls.append(bucket.index())
        buffer = bucket.buffer().div_(group.size())
        return tdist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])

    own = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_MB)
    # A lambda: DDP refuses a hook whose annotations are strings (`from __future__`).
    registered = lambda group, bucket: users_hook(group, bucket)  # noqa: E731
    own.register_comm_hook(own.process_group, registered)
    own_timer = CommTimer(torch.device("cpu"))
    report["own_attached"] = attach([own], own_timer)
    report["own_hooks"] = [hook is registered for hook, _ in own._comm_hooks]
    train(own, rank)
    report["own_calls"] = len(calls)
    report["own_intervals"] = own_timer.take()

    builtin = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_MB)
    builtin._register_builtin_comm_hook(tdist.BuiltinCommHookType.ALLREDUCE)
    builtin_timer = CommTimer(torch.device("cpu"))
    report["builtin_attached"] = attach([builtin], builtin_timer)
    report["builtin_python_hooks"] = len(builtin._comm_hooks)
    train(builtin, rank)
    report["builtin_intervals"] = builtin_timer.take()
    report["builtin"] = [p.detach().clone() for p in builtin.parameters()]

    # Both modules together: the timer sees the buckets of each.
    first = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_MB)
    second = DistributedDataParallel(nn.Linear(4, 4), bucket_cap_mb=BUCKET_MB)
    both = CommTimer(torch.device("cpu"))
    report["both_attached"] = attach([first, second], both)
    x = torch.randn(2, 16)
    (first(x).sum() + second(torch.randn(2, 4)).sum()).backward()
    report["both_buckets"] = len(both.take())

    # A second ctx.loop over the same module: a second Telemetry attaches its own timer.
    again = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_MB)
    earlier, later = CommTimer(torch.device("cpu")), CommTimer(torch.device("cpu"))
    attach([again], earlier)
    train(again, rank, earlier.take)
    report["again_attached"] = attach([again], later)
    train(again, rank, later.take)
    report["again_left_in_earlier"] = len(earlier._starts)
    report["again_hooks"] = len(again._comm_hooks)

    torch.save(report, Path(out) / f"rank-{rank}.pt")
    tdist.barrier()
    tdist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(ddp_worker, args=(free_port(), str(out)), nprocs=RANKS, join=True)
    return [torch.load(out / f"rank-{rank}.pt", weights_only=False) for rank in range(RANKS)]


def test_the_timed_hook_trains_to_the_same_bits_as_ddps_own_path(ddp_reports: list[dict[str, Any]]) -> None:
    for rank, report in enumerate(ddp_reports):
        assert report["attached"] is True
        plain, timed = report["plain"], report["timed"]
        assert len(plain) == len(timed) == 8
        differing = [i for i, (a, b) in enumerate(zip(plain, timed, strict=True)) if not torch.equal(a, b)]
        assert not differing, f"rank {rank}: parameters {differing} differ with the hook attached"
        # The ranks trained on different data: the test would see a hook that broke the average.
        assert not torch.equal(plain[0], make_model().state_dict()["0.weight"])
    for report in ddp_reports[1:]:
        assert all(torch.equal(a, b) for a, b in zip(report["timed"], ddp_reports[0]["timed"], strict=True))


def test_the_timer_records_one_interval_per_bucket_per_step(ddp_reports: list[dict[str, Any]]) -> None:
    for report in ddp_reports:
        rebuilt = [int(size) for size in report["rebuilt_bucket_sizes"].split(",")]
        assert len(rebuilt) > 1, "the test needs several buckets"
        assert sum(rebuilt) == report["param_bytes"]
        per_step = report["per_step"]
        assert len(per_step) == STEPS
        # torch 2.13 reduces the first step in one bucket and rebuilds the layout after it.
        first_launched, first_bytes, first = per_step[0]
        assert first_launched == len(first) == 1 and first_bytes == [report["param_bytes"]]
        for launched, sizes, intervals in per_step[1:]:
            assert launched == len(intervals) == len(rebuilt)
            assert sizes == rebuilt
            assert all(0 <= end - start < 60 for start, end in intervals)
            assert busy_time(intervals) > 0 and 0 <= exposed_time(intervals) <= busy_time(intervals)
    assert all(report["both_attached"] is True for report in ddp_reports)
    # The first module's single initial bucket and the second module's.
    assert [report["both_buckets"] for report in ddp_reports] == [2] * RANKS


def test_a_users_own_hook_is_left_in_place_and_not_measured(ddp_reports: list[dict[str, Any]]) -> None:
    for report in ddp_reports:
        assert report["own_attached"] is False
        assert report["own_hooks"] == [True], "attach must not register a second hook"
        assert report["own_calls"] == 1 + (STEPS - 1) * len(report["rebuilt_bucket_sizes"].split(","))
        assert report["own_intervals"] == []
        assert report["builtin_attached"] is False
        assert report["builtin_intervals"] == []
        # Training went on under the built-in hook (which divides, so other bits than DDP's own path).
        assert not torch.equal(report["builtin"][0], make_model().state_dict()["0.weight"])
        assert torch.allclose(report["builtin"][0], report["plain"][0], atol=1e-5)


def test_a_refused_registration_leaves_no_python_side_hook(ddp_reports: list[dict[str, Any]]) -> None:
    assert [report["builtin_python_hooks"] for report in ddp_reports] == [0] * RANKS


def test_gradients_kept_as_bucket_views_are_left_to_ddps_own_path(
    ddp_reports: list[dict[str, Any]],
) -> None:
    # DDP divides such views in place where the hook would multiply: they are not timed, and the
    # bits stay DDP's.
    for report in ddp_reports:
        assert report["kept_views_attached"] is False
        plain, timed = report["kept_views_plain"], report["kept_views_timed"]
        assert all(torch.equal(a, b) for a, b in zip(plain, timed, strict=True))


def test_a_second_loop_over_the_same_module_is_measured(ddp_reports: list[dict[str, Any]]) -> None:
    for report in ddp_reports:
        assert report["again_hooks"] == 1
        assert report["again_left_in_earlier"] == 0
        assert report["again_attached"] is True


# --- a real local run: result.json's summary and the perf/ records ------------------------------

WIDTH = 64
PARAM_BYTES = 4 * (2 * (WIDTH * WIDTH + WIDTH) + WIDTH * 10 + 10)
"""The synthetic MLP's float32 parameters at width 64 (10 classes)."""
LOCAL_STEPS = 40
WARMUP = 3
COMMON = (
    str(SYNTHETIC),
    "executor=local",
    "resources.nodes=1",
    f"resources.tasks_per_node={RANKS}",
    f"train.width={WIDTH}",
    "train.global_batch=48",
    "train.log_every=10",
    "ddp.bucket_cap_mb=0.01",
    f"telemetry.warmup_steps={WARMUP}",
)


def start(out: Path, *overrides: str) -> subprocess.Popen[str]:
    out.mkdir()
    return subprocess.Popen(
        [sys.executable, "-m", "slurmddp", "submit", *COMMON, f"output_dir={out / 'runs'}", *overrides],
        cwd=out,
        env={**os.environ, "XDG_STATE_HOME": str(out / "state")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Two runs side by side: telemetry on for 40 steps; telemetry off, asked for 60 steps and cut
    to 40 by telemetry.max_steps (the synthetic batches depend only on the step, so the two must
    end with the same parameters)."""
    tmp = tmp_path_factory.mktemp("local")
    procs = {
        "on": start(tmp / "on", f"train.steps={LOCAL_STEPS}", "telemetry.every_s=0.01"),
        "off": start(
            tmp / "off", "train.steps=60", "telemetry.enabled=false", f"telemetry.max_steps={LOCAL_STEPS}"
        ),
    }
    try:
        for name, proc in procs.items():
            output, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{name}:\n{output}"
            assert "ended COMPLETED" in output, f"{name}:\n{output}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    yield {name: only_run(tmp / name / "runs") for name in procs}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_result_json_carries_the_runs_telemetry(local_runs: dict[str, Path]) -> None:
    result = json.loads((local_runs["on"] / "result.json").read_text())
    summary = result["telemetry"]
    assert summary is not None
    assert summary["steps"] == LOCAL_STEPS - WARMUP
    assert summary["step_s"] > 0 and summary["steps_per_s"] == pytest.approx(1 / summary["step_s"], rel=1e-3)
    assert summary["comm_measured"] is True
    assert summary["buckets"] > 1 and len(summary["bucket_bytes"]) == summary["buckets"]
    assert sum(summary["bucket_bytes"]) == PARAM_BYTES
    assert 0 < summary["comm_s"] < summary["step_s"]
    assert 0 < summary["comm_min_s"] <= summary["comm_s"]  # the least of the ranks', the mean's
    assert 0 <= summary["exposed_comm_s"] <= summary["comm_s"]
    assert 0 <= summary["exposed_comm_frac"] <= 1
    assert 0 <= summary["data_wait_frac"] <= 1
    assert summary["barrier_s"] > 0
    assert (summary["backend"], summary["transport"], summary["world_size"]) == ("gloo", "tcp", RANKS)
    assert summary["samples_per_step"] is None and summary["samples_per_s"] is None  # no ctx.loader


def test_perf_records_are_logged_during_the_run_and_at_its_end(local_runs: dict[str, Path]) -> None:
    records = read_jsonl(local_runs["on"] / "metrics.jsonl")
    perf = [r for r in records if any(key.startswith("perf/") for key in r)]
    assert perf, "no perf/ record in metrics.jsonl"
    assert all(r["perf/step_s"] > 0 and 0 <= r["perf/exposed_comm_frac"] <= 1 for r in perf)
    assert all(0 < r["perf/comm_min_s"] <= r["perf/comm_s"] for r in perf)
    steps = [r["step"] for r in perf]
    assert steps == sorted(steps) and steps[-1] == LOCAL_STEPS
    assert any(WARMUP < s < LOCAL_STEPS for s in steps), f"no record before the end (every_s=0.01): {steps}"
    # The user's own records are still there.
    assert [r["step"] for r in records if "loss" in r] == [0, 10, 20, 30, LOCAL_STEPS]


def test_telemetry_off_records_nothing_and_max_steps_cuts_the_loop(local_runs: dict[str, Path]) -> None:
    run = local_runs["off"]
    result = json.loads((run / "result.json").read_text())
    assert result["telemetry"] is None
    assert not any(key.startswith("perf/") for r in read_jsonl(run / "metrics.jsonl") for key in r)
    progress = json.loads((run / "progress.json").read_text())
    assert (progress["step"], progress["total_steps"]) == (LOCAL_STEPS, LOCAL_STEPS)


def test_telemetry_on_and_off_end_with_the_same_parameters(local_runs: dict[str, Path]) -> None:
    digests = {
        name: {rank["param_sha256"] for rank in json.loads((run / "result.json").read_text())["ranks"]}
        for name, run in local_runs.items()
    }
    assert (
        len(digests["on"]) == 1
        and len(json.loads((local_runs["on"] / "result.json").read_text())["ranks"]) == 3
    )
    assert digests["on"] == digests["off"], "telemetry changed the parameters (or max_steps missed step 40)"
