"""The loop's bookkeeping around a resume, without a process group: what a checkpoint was saved
with must match, and metrics logged past the checkpoint are dropped."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from checkpoint_damage import FullDisk, flip_a_byte
from rich.filesize import decimal

from slurmddp import ResumableDistributedSampler
from slurmddp.errors import CheckpointError, SlurmddpError
from slurmddp.experiment.schema import Checkpoint, Ddp, Precision, Requeue, Resources
from slurmddp.job.allocation import outcome, requeue
from slurmddp.job.checkpoint import CheckpointStore, capture_rng_state
from slurmddp.job.checkpoint import io as checkpoint_io
from slurmddp.job.checkpoint import store as checkpoint_store
from slurmddp.job.checkpoint.io import file_crc32
from slurmddp.job.checkpoint.space import bytes_on_disk
from slurmddp.job.train.loop import LoopRuntime, LoopState, TrainLoop
from slurmddp.rundir.records import AttemptId, Failure

# What the loop reads of a DistributedDataParallel module over two ranks.
TWO_RANK_DDP = SimpleNamespace(
    static_graph=False, find_unused_parameters=False, process_group=SimpleNamespace(size=lambda: 2)
)
# What the loop reads of a DistEnv.
ONE_RANK = SimpleNamespace(rank=0, job_id="1", restart_count=0, in_job_restart=0)


def make_loop(
    run_dir: Path,
    model: torch.nn.Module,
    ddp: Ddp | None = None,
    precision: Precision | None = None,
    checkpoint: Checkpoint | None = None,
    **objects: Any,
) -> TrainLoop:
    checkpoint = checkpoint or Checkpoint()
    store = CheckpointStore(run_dir / "checkpoints", rank=0, world_size=1, settings=checkpoint, attempt="1-0")
    return TrainLoop(
        10,
        checkpoint=checkpoint,
        ddp=ddp or Ddp(),
        precision=precision or Precision(),
        state=LoopState({"model": model, **objects}),
        runtime=LoopRuntime(
            dist=ONE_RANK,
            device=torch.device("cpu"),
            run_dir=run_dir,
            store=store,
            ddp_modules=[TWO_RANK_DDP],
        ),
    )


def save_at(run_dir: Path, step: int, settings: dict[str, Any], model: torch.nn.Module) -> None:
    store = CheckpointStore(run_dir / "checkpoints", rank=0, world_size=1, attempt="1-0")
    shared = {"model": model.state_dict(), "extra": {}, "loop": settings}
    store.save(step, shared, {"rng": capture_rng_state()})


def test_a_resume_with_other_training_settings_is_refused_with_both_values(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    save_at(tmp_path, 4, {"accumulate": 1, "autocast": "none"}, model)
    with pytest.raises(CheckpointError, match=r"accumulate: 1 then, 2 now"):
        make_loop(tmp_path, model, Ddp(accumulate=2))
    with pytest.raises(CheckpointError, match=r"autocast: none then, bfloat16 now"):
        make_loop(tmp_path, model, precision=Precision(autocast="bfloat16"))
    loop = make_loop(tmp_path, model)
    assert loop.first_step == loop.step == 4


def test_a_sampler_iterated_by_the_step_is_refused_up_front(tmp_path: Path) -> None:
    sampler = ResumableDistributedSampler(100, 2, 0)
    with pytest.raises(SlurmddpError, match=r"ctx\.loop\(sampler=\.\.\.\).*data=ctx\.loader"):
        make_loop(tmp_path, torch.nn.Linear(2, 2), sampler=sampler)


def test_an_object_the_checkpoint_lacks_is_refused_unless_it_has_no_state(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    save_at(tmp_path, 3, {"accumulate": 1, "autocast": "none"}, model)
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    assert make_loop(tmp_path, model, scaler=disabled).first_step == 3
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match=r"no state for 'optimizer' \(it holds \['model'\]\)"):
        make_loop(tmp_path, model, optimizer=optimizer)


def test_a_damaged_checkpoint_is_moved_aside_and_the_next_older_one_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"accumulate": 1, "autocast": "none"}
    model = torch.nn.Linear(2, 2)
    save_at(tmp_path, 2, settings, model)
    save_at(tmp_path, 4, settings, model)
    save_at(tmp_path, 6, settings, model)
    checkpoints = tmp_path / "checkpoints"
    flip_a_byte(checkpoints / "step-00000006" / "rank-00000.pt")
    # A file whose marker agrees with it but that torch cannot read: an unpickling error.
    unreadable = checkpoints / "step-00000004" / "shared.pt"
    unreadable.write_bytes(b"not a checkpoint")
    marker = checkpoints / "step-00000004" / "rank-00000.done"
    written = json.loads(marker.read_text())
    written["files"]["shared.pt"] = {"size": 16, "crc32": file_crc32(unreadable)}
    marker.write_text(json.dumps(written))

    loop = make_loop(tmp_path, model)
    assert loop.first_step == loop.step == 2
    said = capsys.readouterr().out
    assert (
        f"skipping damaged checkpoint {checkpoints / 'step-00000006'}: rank 0: rank-00000.pt has CRC32 "
    ) in said
    assert f"moved to {checkpoints / 'damaged' / 'step-00000006'}" in said
    assert (
        f"skipping damaged checkpoint {checkpoints / 'step-00000004'}: rank 0: cannot load {unreadable}"
        in said
    )
    assert f"loaded {checkpoints / 'step-00000002'}, the newest intact checkpoint" in said
    assert sorted(p.name for p in (checkpoints / "damaged").iterdir()) == ["step-00000004", "step-00000006"]
    reason = (checkpoints / "damaged" / "step-00000006" / "reason.txt").read_text()
    assert reason.startswith("rank 0: rank-00000.pt has CRC32 ") and "(corrupt)" in reason
    assert not (tmp_path / "failure.json").exists()


def test_no_intact_checkpoint_left_ends_the_run_for_good_with_why(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    save_at(tmp_path, 3, {"accumulate": 1, "autocast": "none"}, model)
    flip_a_byte(tmp_path / "checkpoints" / "step-00000003" / "shared.pt")
    with pytest.raises(CheckpointError, match="no intact checkpoint is left in") as raised:
        make_loop(tmp_path, model)
    assert "step-00000003 (rank 0: shared.pt has CRC32" in str(raised.value)
    failure = Failure.read_for(tmp_path, AttemptId("1", 0))
    assert failure is not None and failure.retry is False and failure.error == str(raised.value)
    # The job ends at once, with why: no failure budget is spent on finding the same again.
    decision = requeue.decide(
        tmp_path,
        1,
        {"SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0"},
        outcome.Settings(Requeue(), Resources()),
        preempt_time=lambda job: None,
        failed_nodes=lambda nodes, since: {},
    )
    assert (decision.requeue, decision.message) == (False, f"{raised.value}: not retrying")
    # Nothing to resume from now: a resubmit trains from step 0.
    assert make_loop(tmp_path, model).first_step == 0


def test_a_periodic_checkpoint_that_would_not_fit_is_skipped_and_the_next_one_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = make_loop(tmp_path, torch.nn.Linear(2, 2))
    checkpoints = tmp_path / "checkpoints"
    loop.step = 2
    loop.save()
    needed = bytes_on_disk(checkpoints / "step-00000002")
    monkeypatch.setattr(checkpoint_store, "free_bytes", lambda path: needed - 1)
    loop.step = 4
    loop.save()
    assert capsys.readouterr().out == (
        f"slurmddp: warning: rank 0: the checkpoint at step 4 was not saved: no space left on {checkpoints}: "
        f"{decimal(needed - 1, precision=1)} free, a checkpoint needs {decimal(needed, precision=1)}; "
        "training goes on, the next checkpoint tries again\n"
    )
    monkeypatch.undo()
    loop.step = 6
    loop.save()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002", "step-00000006"]


@pytest.mark.parametrize("async_save", [False, True])
def test_a_checkpoint_that_meets_a_full_disk_is_removed_and_the_previous_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], async_save: bool
) -> None:
    model = torch.nn.Linear(2, 2)
    loop = make_loop(tmp_path, model, checkpoint=Checkpoint(async_save=async_save))
    checkpoints = tmp_path / "checkpoints"
    loop.step = 2
    loop.save()
    loop.store.wait()
    # Room enough by the check before the save, but not for the files: ENOSPC while writing.
    disk = FullDisk(room=500)
    monkeypatch.setattr(checkpoint_io, "open", disk.open, raising=False)
    loop.step = 4
    loop.save()
    said = capsys.readouterr().out
    if async_save:
        # Written in the background: how it went is agreed on at the next save (or the stop, or
        # the end of the loop).
        assert said == ""
        assert disk.used.wait(timeout=60)
        monkeypatch.undo()
        loop.step = 6
        loop.save()
        loop.store.wait()
        said = capsys.readouterr().out
    assert said.startswith(
        "slurmddp: warning: rank 0: the checkpoint at step 4 was not saved: rank 0: no space left on "
        f"{checkpoints}: "
    )
    needed = decimal(bytes_on_disk(checkpoints / "step-00000002"), precision=1)
    assert said.endswith(
        f", a checkpoint needs {needed}; training goes on, the next checkpoint tries again\n"
    )
    kept = ["step-00000002", "step-00000006"] if async_save else ["step-00000002"]
    assert sorted(p.name for p in checkpoints.iterdir()) == kept
