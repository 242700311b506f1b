"""CheckpointStore: round trips, completeness rules, keep-last-K, async snapshots, and real SIGKILLs."""

from __future__ import annotations

import collections
import errno
import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from checkpoint_damage import FullDisk, flip_a_byte
from rich.filesize import decimal

from slurmddp.defaults import IN_JOB_RESTART_ENV
from slurmddp.errors import CheckpointError
from slurmddp.experiment.schema import Checkpoint
from slurmddp.job.checkpoint import (
    DAMAGED_DIR,
    META_FILE,
    REASON_FILE,
    SHARED_FILE,
    CheckpointInfo,
    CheckpointStore,
    NoSpaceForCheckpoint,
    capture_rng_state,
    default_attempt_id,
    marker_name,
    prefetch,
    rank_file_name,
    restore_rng_state,
    step_dir_name,
)
from slurmddp.job.checkpoint import io as checkpoint_io
from slurmddp.job.checkpoint import store as checkpoint_store
from slurmddp.job.checkpoint.space import bytes_on_disk


def assert_same(actual: Any, expected: Any, where: str = "state") -> None:
    """Equal values, tensors compared exactly, containers of the same kind."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), where
    elif isinstance(expected, Mapping):
        assert isinstance(actual, Mapping) and actual.keys() == expected.keys(), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


def trained_state() -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, Any]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    shared = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "sampler": {"epoch": 2, "consumed": 48},
        "extra": {"best": 0.25, "tags": ["a", "b"], "shape": torch.Size([2, 3])},
    }
    return model, optimizer, shared


def save_all(root: Path, step: int, world_size: int, attempt: str = "a", value: float = 0.0) -> None:
    """Every rank saves `step`: shared = {"v": value}, local = {"rank": r, "v": value}."""
    for rank in reversed(range(world_size)):
        store = CheckpointStore(root, rank, world_size, attempt=attempt)
        shared = {"v": torch.tensor([value])} if rank == 0 else None
        store.save(step, shared, {"rank": rank, "v": torch.tensor([value])})


@pytest.mark.parametrize("async_save", [False, True])
def test_model_and_optimizer_round_trip(tmp_path: Path, async_save: bool) -> None:
    model, optimizer, shared = trained_state()
    stores = [
        CheckpointStore(tmp_path, r, 2, Checkpoint(async_save=async_save), attempt="a") for r in range(2)
    ]
    locals_ = [{"rng": capture_rng_state(), "rank": r} for r in range(2)]
    for store, local in zip(stores, locals_, strict=True):
        store.save(7, shared if store.rank == 0 else None, local)
    for store in stores:
        store.wait()

    for store, local in zip(stores, locals_, strict=True):
        info = store.latest()
        assert info is not None and info.step == 7 and info.world_size == 2
        assert info.path == tmp_path / "step-00000007"
        loaded_shared, loaded_local = store.load(info)
        assert_same(loaded_shared, shared)
        assert_same(loaded_local, local)

    # And it goes back into fresh objects.
    fresh_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=0.5)
    loaded_shared, _ = stores[0].load(stores[0].latest())  # type: ignore[arg-type]
    fresh_model.load_state_dict(loaded_shared["model"])
    fresh_optimizer.load_state_dict(loaded_shared["optimizer"])
    assert_same(fresh_model.state_dict(), model.state_dict())
    assert_same(fresh_optimizer.state_dict(), optimizer.state_dict())


def test_layout_on_disk(tmp_path: Path) -> None:
    save_all(tmp_path, 1234, 3)
    step = tmp_path / "step-00001234"
    assert sorted(p.name for p in step.iterdir()) == [
        "meta.json",
        "rank-00000.done",
        "rank-00000.pt",
        "rank-00001.done",
        "rank-00001.pt",
        "rank-00002.done",
        "rank-00002.pt",
        "shared.pt",
    ]


def test_only_complete_checkpoints_count(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    save_all(tmp_path, 1, 2)
    # Step 2: rank 0 done, rank 1 not (yet).
    CheckpointStore(tmp_path, 0, 2, attempt="a").save(2, {"v": torch.ones(1)}, {"rank": 0})
    store = CheckpointStore(tmp_path, 1, 2, attempt="a")
    with caplog.at_level(logging.WARNING):
        info = store.latest()
    assert info is not None and info.step == 1
    assert "step-00000002" in caplog.text and "no completion marker from rank 1" in caplog.text


def test_a_restart_reads_ahead_the_newest_complete_checkpoints_files_it_will_load(
    tmp_path: Path,
) -> None:
    assert prefetch.prefetch(tmp_path / "none yet", 0, shared=True) is None  # a first attempt
    save_all(tmp_path, 1, 3)
    CheckpointStore(tmp_path, 0, 3, attempt="a").save(2, {"v": torch.ones(1)}, {"rank": 0})  # incomplete
    newest = tmp_path / "step-00000001"
    assert prefetch.newest_files(tmp_path, 2, shared=False) == [newest / "rank-00002.pt"]
    assert prefetch.newest_files(tmp_path, 0, shared=True) == [newest / "rank-00000.pt", newest / "shared.pt"]
    # A rank the checkpoint's run did not have (a job grown since) loads the shared state only.
    assert prefetch.newest_files(tmp_path, 5, shared=True) == [newest / "shared.pt"]
    thread = prefetch.prefetch(tmp_path, 1, shared=True)
    assert thread is not None and thread.daemon
    thread.join(10)
    assert not thread.is_alive()


def test_latest_skips_a_missing_marker_and_a_truncated_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (1, 2, 3, 4):
        save_all(tmp_path, step, 2)
    (tmp_path / step_dir_name(4) / marker_name(1)).unlink()
    shared = tmp_path / step_dir_name(3) / SHARED_FILE
    shared.write_bytes(shared.read_bytes()[:-10])
    store = CheckpointStore(tmp_path, 0, 2)
    with caplog.at_level(logging.WARNING):
        info = store.latest()
    assert info is not None and info.step == 2
    assert f"{tmp_path / step_dir_name(4)}: no completion marker from rank 1" in caplog.text
    assert f"{tmp_path / step_dir_name(3)}: shared.pt has" in caplog.text and "truncated" in caplog.text


def test_a_checkpoint_of_another_size_resumes_with_the_shared_state_and_the_ranks_that_were(
    tmp_path: Path,
) -> None:
    save_all(tmp_path, 1, 3, value=1.0)
    save_all(tmp_path, 2, 3, value=2.0)
    # Rank 2 of the 3-rank job never finished step 3: it is not complete for the 3 that wrote it.
    for rank in (1, 0):
        CheckpointStore(tmp_path, rank, 3, attempt="a").save(
            3, {"v": torch.tensor([3.0])} if rank == 0 else None, {"rank": rank}
        )
    for size in (2, 4):
        stores = [CheckpointStore(tmp_path, r, size) for r in range(size)]
        infos = [store.latest() for store in stores]
        assert {(i.step, i.world_size) for i in infos if i is not None} == {(2, 3)}
        loaded = [store.load(info) for store, info in zip(stores, infos, strict=True) if info is not None]
        assert [float(shared["v"]) for shared, _ in loaded] == [2.0] * size
        # Rank r takes what rank r saved; a rank the 3-rank job did not have starts empty.
        assert [local.get("rank") for _, local in loaded] == [r if r < 3 else None for r in range(size)]

    # The 2-rank job saves step 2 again (a stop before its first step): the 3-rank checkpoint
    # stays whole; its first step of its own replaces nothing.
    CheckpointStore(tmp_path, 0, 2, attempt="b").save(2, {"v": torch.tensor([9.0])}, {"rank": 0})
    assert json.loads((tmp_path / step_dir_name(2) / META_FILE).read_text())["world_size"] == 3
    save_all(tmp_path, 4, 2, attempt="b", value=4.0)
    info = CheckpointStore(tmp_path, 1, 2).latest()
    assert info is not None and (info.step, info.world_size) == (4, 2)


def test_missing_meta_and_mixed_attempts_do_not_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save_all(tmp_path, 1, 2)
    save_all(tmp_path, 2, 2)
    (tmp_path / step_dir_name(2) / META_FILE).unlink()
    # Rank 1's part of step 3 from attempt "old", rank 0's from attempt "new".
    CheckpointStore(tmp_path, 1, 2, attempt="old").save(3, None, {"v": 1})
    CheckpointStore(tmp_path, 0, 2, attempt="new").save(3, {"v": 2}, {"v": 2})
    with caplog.at_level(logging.WARNING):
        info = CheckpointStore(tmp_path, 0, 2).latest()
    assert info is not None and info.step == 1
    assert "meta.json is missing" in caplog.text
    assert "rank-00001.done is from attempt 'old' but meta.json from 'new'" in caplog.text


def test_a_damaged_file_of_the_right_size(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    save_all(tmp_path, 1, 1)
    save_all(tmp_path, 2, 1, value=2.0)
    flip_a_byte(tmp_path / step_dir_name(2) / rank_file_name(0))
    store = CheckpointStore(tmp_path, 0, 1)
    info = store.latest()  # sizes only: cheap, and the same answer on every rank
    assert info is not None and info.step == 2
    with pytest.raises(CheckpointError, match="CRC32"):
        store.load(info)
    with caplog.at_level(logging.WARNING):
        checked = store.latest(verify_checksums=True)
    assert checked is not None and checked.step == 1 and "corrupt" in caplog.text


def test_a_damaged_checkpoint_moved_aside_keeps_its_reason_and_is_never_chosen_or_pruned(
    tmp_path: Path,
) -> None:
    for step in (1, 2, 3):
        save_all(tmp_path, step, 2, value=float(step))
    flip_a_byte(tmp_path / step_dir_name(3) / rank_file_name(1))
    rank0, rank1 = (CheckpointStore(tmp_path, r, 2, Checkpoint(keep_last=1), attempt="b") for r in (0, 1))
    newest = rank1.latest()
    assert newest is not None and newest.step == 3
    # Only the rank whose file it is sees the damage.
    assert rank0.damage(newest) is None
    problem = rank1.damage(newest)
    assert problem is not None and "rank-00001.pt has CRC32" in problem and "(corrupt)" in problem

    assert rank1.move_aside(newest, f"rank 1: {problem}") is None  # only rank 0 moves
    moved = rank0.move_aside(newest, f"rank 1: {problem}")
    assert moved == tmp_path / DAMAGED_DIR / step_dir_name(3) and not newest.path.exists()
    assert (moved / REASON_FILE).read_text() == f"rank 1: {problem}\nmoved aside by attempt b\n"
    assert sorted(p.name for p in moved.iterdir()) == sorted(
        [META_FILE, SHARED_FILE, REASON_FILE, *(f(r) for r in (0, 1) for f in (rank_file_name, marker_name))]
    )

    chosen = [info.step if (info := rank0.latest(before=before)) else None for before in (None, 2, 1)]
    assert chosen == [2, 1, None]
    rank0.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == [DAMAGED_DIR, step_dir_name(2)]
    assert (moved / rank_file_name(1)).exists()

    # The same step damaged again (rewritten by a later attempt): kept beside the first.
    save_all(tmp_path, 3, 2, attempt="c")
    again = rank0.latest()
    assert again is not None and again.step == 3
    assert rank0.move_aside(again, "rank 0: again") == tmp_path / DAMAGED_DIR / f"{step_dir_name(3)}.2"


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_that_meets_a_full_disk_says_so_and_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_save: bool
) -> None:
    settings = Checkpoint(async_save=async_save)
    _, _, shared = trained_state()
    rank0, rank1 = (CheckpointStore(tmp_path, r, 2, settings, attempt="a") for r in (0, 1))
    for store in (rank1, rank0):
        store.save(1, shared if store is rank0 else None, {"rank": store.rank})
        store.wait()
    size = bytes_on_disk(tmp_path / step_dir_name(1))
    assert size >= sum(p.stat().st_size for p in (tmp_path / step_dir_name(1)).iterdir())
    # Rank 1's part fits, rank 0's shared.pt does not: torch.save meets ENOSPC half-way through.
    monkeypatch.setattr(checkpoint_io, "open", FullDisk(room=3000).open, raising=False)
    monkeypatch.setattr(checkpoint_store, "free_bytes", lambda path: 2500)
    rank1.save(2, None, {"rank": 1})
    rank1.wait()
    with pytest.raises(NoSpaceForCheckpoint) as raised:
        rank0.save(2, shared, {"rank": 0})  # sync: raised here
        rank0.wait()  # async: here
    assert str(raised.value) == (
        f"rank 0: no space left on {tmp_path}: 2.5 kB free, a checkpoint needs {decimal(size, precision=1)}"
    )
    # The OSError underneath, not torch's "unexpected pos" RuntimeError.
    assert isinstance(raised.value.__cause__, OSError) and raised.value.__cause__.errno == errno.ENOSPC
    step2 = tmp_path / step_dir_name(2)
    assert not [p.name for p in step2.iterdir() if p.name.endswith(".tmp")]
    info = rank1.latest()
    assert info is not None and info.step == 1
    rank1.discard(2)  # only rank 0 removes
    assert step2.exists()
    rank0.discard(2)
    assert not step2.exists() and sorted(p.name for p in tmp_path.iterdir()) == [step_dir_name(1)]
    rank0.discard(1)  # complete: kept
    assert_same(rank0.load(info)[0], shared)


def test_the_room_for_a_checkpoint_is_checked_against_the_newest_complete_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path / "checkpoints", 0, 1, attempt="a")
    assert store.space_problem() is None  # no size known yet, and no directory either
    store.save(1, {"v": torch.zeros(100_000)}, {"rank": 0})
    needed = bytes_on_disk(tmp_path / "checkpoints" / step_dir_name(1))
    monkeypatch.setattr(checkpoint_store, "free_bytes", lambda path: needed)
    assert store.space_problem() is None
    monkeypatch.setattr(checkpoint_store, "free_bytes", lambda path: needed - 1)
    assert store.space_problem() == (
        f"no space left on {tmp_path / 'checkpoints'}: {decimal(needed - 1, precision=1)} free, a "
        f"checkpoint needs {decimal(needed, precision=1)}"
    )
    # Rank 0 answers for the filesystem they share (the loop tells every rank).
    assert CheckpointStore(tmp_path / "checkpoints", 1, 2, attempt="a").space_problem() is None


def test_keep_last_k_and_what_prune_may_delete(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, 0, 2, Checkpoint(keep_last=2), attempt="a")
    for step in range(1, 6):
        save_all(tmp_path, step, 2)
        store.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == [step_dir_name(4), step_dir_name(5)]

    # An incomplete older one goes; an incomplete newer one may still be written by a slow rank.
    CheckpointStore(tmp_path, 1, 2, attempt="a").save(3, None, {"v": 3})
    store.save(7, {"v": 7}, {"v": 7})
    save_all(tmp_path, 6, 2)
    CheckpointStore(tmp_path, 1, 2).prune()  # not rank 0: nothing happens
    assert (tmp_path / step_dir_name(3)).exists()
    store.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        step_dir_name(5),
        step_dir_name(6),
        step_dir_name(7),
    ]

    # A complete checkpoint of another world size (before a resize) counts as a kept one.
    save_all(tmp_path, 8, 1)
    store.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == [step_dir_name(6), step_dir_name(8)]


def test_a_step_left_half_written_by_a_dead_attempt_is_replaced(tmp_path: Path) -> None:
    save_all(tmp_path, 1, 2, attempt="job.0")
    # Attempt job.0 died saving step 2: rank 1 finished, rank 0 left half a file behind.
    CheckpointStore(tmp_path, 1, 2, attempt="job.0").save(2, None, {"v": torch.tensor([-1.0])})
    step2 = tmp_path / step_dir_name(2)
    (step2 / f".{SHARED_FILE}.tmp").write_bytes(b"half a file")
    # Attempt job.1 resumed from step 1 and saves step 2 again; rank 0 first.
    CheckpointStore(tmp_path, 0, 2, attempt="job.1").save(
        2, {"v": torch.tensor([2.0])}, {"v": torch.tensor([2.0])}
    )
    reader = CheckpointStore(tmp_path, 1, 2)
    assert reader.latest().step == 1  # type: ignore[union-attr]  # rank 1's marker is job.0's
    CheckpointStore(tmp_path, 1, 2, attempt="job.1").save(2, None, {"v": torch.tensor([2.0])})
    info = reader.latest()
    assert info is not None and info.step == 2
    assert_same(reader.load(info), ({"v": torch.tensor([2.0])}, {"v": torch.tensor([2.0])}))
    assert not (step2 / f".{SHARED_FILE}.tmp").exists()


def test_a_complete_step_of_another_attempt_is_kept(tmp_path: Path) -> None:
    save_all(tmp_path, 5, 2, attempt="job.0", value=1.0)
    save_all(tmp_path, 5, 2, attempt="job.1", value=2.0)
    store = CheckpointStore(tmp_path, 1, 2)
    info = store.latest()
    assert info is not None
    assert_same(store.load(info)[1], {"rank": 1, "v": torch.tensor([1.0])})


def test_state_that_would_not_load_back_is_refused_at_save(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, 0, 1)
    point = collections.namedtuple("point", "x y")
    bad: list[tuple[Any, str]] = [
        (
            {"rng": {"numpy": np.random.get_state()}},
            r"shared\['rng'\]\['numpy'\]\[1\]: a numpy.ndarray .*capture_rng_state",
        ),
        ({"p": point(1, 2)}, r"shared\['p'\]: a .*point cannot be read back"),
        ({"d": collections.defaultdict(int)}, r"shared\['d'\]: a collections.defaultdict"),
        ({"f": lambda: 0}, r"shared\['f'\]: a function"),
    ]
    for shared, message in bad:
        with pytest.raises(CheckpointError, match=message):
            store.save(1, shared, {})
    assert not list(tmp_path.iterdir())


def test_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, 0, 1)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    store.save(1, {}, {"rng": capture_rng_state()})
    expected = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    restore_rng_state(store.load(store.latest())[1]["rng"])  # type: ignore[arg-type]
    assert (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()) == expected


def test_async_save_keeps_the_values_of_save_time(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, 0, 1, Checkpoint(async_save=True))
    weights = torch.arange(1_000_000, dtype=torch.float32)
    history = [1, 2]
    for step in (1, 2, 3):  # steps 2 and 3 copy into the CPU buffers of the save before
        store.save(step, {"w": weights, "history": history}, {"step": step})
        weights.add_(1000.0)  # training changes everything right after save() returns
        history.append(step)
    store.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [step_dir_name(s) for s in (1, 2, 3)]
    for step in (1, 2, 3):
        info = CheckpointInfo(step=step, path=tmp_path / step_dir_name(step), world_size=1, written_at=0.0)
        shared, local = store.load(info)
        assert torch.equal(shared["w"], torch.arange(1_000_000, dtype=torch.float32) + 1000.0 * (step - 1))
        assert shared["history"] == [1, 2, *range(1, step)] and local == {"step": step}


def test_async_errors_come_back_from_wait(tmp_path: Path) -> None:
    # A file where the step directory goes (tests run as root here, which ignores chmod).
    (tmp_path / step_dir_name(3)).write_text("a file where the step directory goes")
    store = CheckpointStore(tmp_path, 0, 1, Checkpoint(async_save=True))
    store.wait()  # nothing pending: fine
    store.save(3, {"w": torch.ones(3)}, {})
    with pytest.raises(CheckpointError, match=r"rank 0: cannot write checkpoint .*step-00000003"):
        store.wait()
    store.wait()  # reported once
    # The next save works, and a failure also surfaces from the save() that waits for it.
    store.save(4, {"w": torch.ones(3)}, {})
    store.wait()
    store.save(3, {"w": torch.ones(3)}, {})
    with pytest.raises(CheckpointError):
        store.save(5, {"w": torch.ones(3)}, {})
    sync = CheckpointStore(tmp_path, 0, 1)
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        sync.save(3, {}, {})


def test_a_pending_async_save_is_finished_when_the_main_thread_ends(tmp_path: Path) -> None:
    # wait() is the contract, but a save left running must not be cut (nor fail) at exit.
    code = (
        "import sys, torch; from pathlib import Path; from slurmddp.job.checkpoint import CheckpointStore\n"
        "from slurmddp.experiment.schema import Checkpoint\n"
        "store = CheckpointStore(Path(sys.argv[1]), 0, 1, Checkpoint(async_save=True), attempt='x')\n"
        "store.save(1, {'w': torch.ones(5_000_000)}, {})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    store = CheckpointStore(tmp_path, 0, 1)
    info = store.latest()
    assert info is not None and torch.equal(store.load(info)[0]["w"], torch.ones(5_000_000))


def test_attempt_id_from_the_environment() -> None:
    assert default_attempt_id({"SLURM_JOB_ID": "42"}) == "slurm-42.0"
    assert default_attempt_id({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "3"}) == "slurm-42.3"
    in_job = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "3", IN_JOB_RESTART_ENV: "2"}
    assert default_attempt_id(in_job) == "slurm-42.3.2"
    assert default_attempt_id({"SUBMITIT_LOCAL_JOB_ID": "999"}) == "local-999"
    assert default_attempt_id({"TORCHELASTIC_RUN_ID": "none"}) is None
    assert default_attempt_id({}) is None


# -- SIGKILL at random moments of saving -----------------------------------------------------------------

KILL_N = 2_000_000  # floats: 8 MB of weights + 8 MB of momentum in shared.pt, 4 MB per rank file


def kill_shared(step: int) -> dict[str, Any]:
    return {
        "model": {"w": torch.arange(KILL_N, dtype=torch.float32) + step},
        "optimizer": {"state": {0: {"momentum_buffer": torch.full((KILL_N,), float(step))}}},
        "step": step,
    }


def kill_local(step: int, rank: int) -> dict[str, Any]:
    return {"rng": torch.full((KILL_N // 2,), step * 10.0 + rank), "step": step, "rank": rank}


def save_until_killed(root: str, attempt: str, start: int, started: Event) -> None:
    """Two ranks (threads) of one attempt: rank 0 saves async and prunes, rank 1 saves sync; a
    barrier per step stands in for the training loop's collectives."""
    stores = [
        CheckpointStore(Path(root), r, 2, Checkpoint(keep_last=2, async_save=r == 0), attempt=attempt)
        for r in range(2)
    ]
    barrier = threading.Barrier(2)

    def rank_loop(rank: int) -> None:
        step = start
        while True:
            stores[rank].save(step, kill_shared(step) if rank == 0 else None, kill_local(step, rank))
            if rank == 0:
                stores[rank].prune()
            barrier.wait()
            started.set()
            step += 1

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_sigkill_at_random_moments_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    # forkserver with torch preloaded: each victim starts in ~0.1 s instead of a 3 s torch import,
    # and is a fresh fork of a process that never ran an OpenMP region (fork-safe).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "slurmddp.job.checkpoint"])
    chooser = random.Random(20240611)
    newest = -1
    rewrites = 0
    # At least 7 kills, and on until one has landed past step 3 and one has left a half-written
    # step behind. Under load (four labs beside it) a step's save takes longer than on an idle
    # machine: each attempt's kill window is scaled to how long its first step took (but the
    # first attempt's, which includes the forkserver's start), and more attempts may be needed.
    attempts = 0
    while attempts < 7 or newest < 3 or rewrites < 1:
        assert attempts < 30, f"30 kills and still at step {newest} with {rewrites} rewrites"
        start = newest + 1
        rewrites += (tmp_path / step_dir_name(start)).exists()
        started = context.Event()
        victim = context.Process(
            target=save_until_killed, args=(str(tmp_path), f"job.{attempts}", start, started)
        )
        began = time.monotonic()
        victim.start()
        assert started.wait(60), "the saving process did not get going"
        first_step = time.monotonic() - began
        threading.Event().wait(chooser.uniform(0.0, max(0.6, 2 * first_step if attempts else 0)))
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        assert victim.exitcode == -signal.SIGKILL
        attempts += 1

        for rank in range(2):
            info = CheckpointStore(tmp_path, rank, 2).latest()
            if info is None:  # killed before the first save of the run was complete
                assert newest == -1
                continue
            # Never behind the checkpoint that was complete before this attempt.
            assert info.step >= newest
            shared, local = CheckpointStore(tmp_path, rank, 2).load(info)
            assert_same(shared, kill_shared(info.step), f"shared of step {info.step}")
            assert_same(local, kill_local(info.step, rank), f"rank {rank}'s file of step {info.step}")
        complete = [p for p in tmp_path.iterdir() if p.name.startswith("step-") and (p / META_FILE).exists()]
        assert len(complete) <= 4  # keep_last 2 + one finished since the last prune + one in progress
        newest = info.step if info is not None else newest
