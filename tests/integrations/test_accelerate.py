"""slurmddp.integrations.accelerate: the newest complete state is the one resumed from, what is
refused and why. The script preempted twice at random steps under gradient accumulation, ending on
the plain script's parameters bit for bit, is test_frameworks_cluster.py's accelerate case."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slurmddp import files
from slurmddp.errors import CheckpointError
from slurmddp.integrations import accelerate as helper

# --- unit: which state directory is complete --------------------------------------------------


def fake_state(folder: Path, step: int, *, ranks: int = 2, marker: bool = True, epoch: int = 0) -> Path:
    path = helper.state_dir(folder, step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"w" * 10)
    for rank in range(ranks):
        (path / helper.RANK_FILE.format(rank=rank)).write_bytes(b"r" * 3)
    if marker:
        listing = {p.name: p.stat().st_size for p in path.iterdir()}
        files.write_json(
            path / helper.MARKER,
            {
                "step": step,
                "epoch": epoch,
                "batch": step % 7,
                "num_processes": ranks,
                "data_seed": 0,
                "files": listing,
            },
        )
    return path


def test_the_newest_complete_state_is_chosen_and_incomplete_or_damaged_ones_are_skipped(
    tmp_path: Path,
) -> None:
    fake_state(tmp_path, 10)
    fake_state(tmp_path, 30, epoch=1)
    fake_state(tmp_path, 50, marker=False)  # a save the stop cut short
    truncated = fake_state(tmp_path, 40)
    (truncated / "model.safetensors").write_bytes(b"w" * 4)
    missing = fake_state(tmp_path, 45)
    (missing / helper.RANK_FILE.format(rank=1)).unlink()
    (tmp_path / "step-00000060.tmp").mkdir()  # not a state directory's name
    (tmp_path / helper.DAMAGED / "step-00000099").mkdir(parents=True)

    candidates, skipped = helper.complete_states(tmp_path)

    assert [c.position for c in candidates] == [helper.Position(30, 1, 2), helper.Position(10, 0, 3)]
    assert helper.newest_complete(tmp_path) == candidates[0]
    assert skipped == [
        f"skipping {tmp_path / 'step-00000050'}: no completion marker (the save did not finish)",
        f"skipping {tmp_path / 'step-00000045'}: slurmddp-rank-00001.pt is missing",
        f"skipping {tmp_path / 'step-00000040'}: model.safetensors has 4 bytes, its marker says 10",
    ]


def test_a_torn_marker_or_one_missing_a_rank_does_not_count(tmp_path: Path) -> None:
    torn = fake_state(tmp_path, 1)
    (torn / helper.MARKER).write_text('{"step": 1, "epo')
    unlisted = fake_state(tmp_path, 2)
    marker = json.loads((unlisted / helper.MARKER).read_text())
    marker["num_processes"] = 3
    (unlisted / helper.MARKER).write_text(json.dumps(marker))
    assert helper.complete_states(tmp_path)[0] == []
    assert helper.newest_complete(tmp_path / "absent") is None


class FakeAccelerator:
    """What Resumable uses of an Accelerator, in one process: save_state writes a file like the
    weights, load_state reads it back."""

    def __init__(self, folder: Path) -> None:
        self.is_main_process = True
        self.process_index = 0
        self.num_processes = 1
        self.sync_gradients = True
        self.step = 0
        self.project_configuration = SimpleNamespace(automatic_checkpoint_naming=True)
        self.weights = 0
        self.loaded: list[str] = []
        self.naming_during_save: list[bool] = []

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, output_dir: str) -> None:
        self.naming_during_save.append(self.project_configuration.automatic_checkpoint_naming)
        Path(output_dir, "model.bin").write_text(str(self.weights))

    def load_state(self, input_dir: str) -> None:
        self.weights = int(Path(input_dir, "model.bin").read_text())
        self.loaded.append(Path(input_dir).name)

    def skip_first_batches(self, loader: list[int], n: int) -> list[int]:
        return loader[n:]


class FakeLoader(list[int]):
    def __init__(self, n: int) -> None:
        super().__init__(range(n))
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_a_run_saved_every_few_steps_resumes_at_the_newest_and_continues_the_data(tmp_path: Path) -> None:
    accelerator = FakeAccelerator(tmp_path)
    loader = FakeLoader(4)
    run = helper.Resumable(accelerator, loader, folder=tmp_path, every_steps=3, keep_last=1)
    (tmp_path / "step-00000001").mkdir()  # an unfinished save, of an earlier attempt
    seen = []
    for epoch in run.epochs(2):
        for batch in run.batches():
            seen.append((epoch, batch))
            accelerator.weights += 1
            run.after_step()
    assert seen == [(e, b) for e in range(2) for b in range(4)]
    assert not (tmp_path / "step-00000001").exists()  # an unfinished save before, removed
    assert loader.epochs == [0, 1]
    # Saves at steps 3 and 6; keep_last=1 keeps the newest. Accelerate's own naming is off only
    # during a save.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006"]
    assert accelerator.naming_during_save == [False, False]
    assert accelerator.project_configuration.automatic_checkpoint_naming is True

    again = FakeAccelerator(tmp_path)
    loader = FakeLoader(4)
    resumed = helper.Resumable(again, loader, folder=tmp_path)
    assert again.loaded == ["step-00000006"] and again.weights == 6
    assert resumed.position == helper.Position(6, 1, 2)
    rest = [(epoch, batch) for epoch in resumed.epochs(2) for batch in resumed.batches()]
    assert rest == [(1, 2), (1, 3)]
    assert loader.epochs == [1]


def test_a_state_saved_at_the_end_of_an_epoch_resumes_at_the_next_epochs_start(tmp_path: Path) -> None:
    accelerator = FakeAccelerator(tmp_path)
    run = helper.Resumable(accelerator, FakeLoader(4), folder=tmp_path, every_steps=4)
    for _ in run.epochs(1):
        for _ in run.batches():
            run.after_step()
    resumed = helper.Resumable(FakeAccelerator(tmp_path), FakeLoader(4), folder=tmp_path)
    assert resumed.position == helper.Position(4, 1, 0)
    assert list(resumed.epochs(1)) == []


def test_only_real_optimizer_steps_count_under_accumulation(tmp_path: Path) -> None:
    accelerator = FakeAccelerator(tmp_path)
    run = helper.Resumable(accelerator, FakeLoader(6), folder=tmp_path)
    for _ in run.epochs(1):
        for batch in run.batches():
            accelerator.sync_gradients = batch % 2 == 1
            run.after_step()
    assert run.global_step == 3


def test_a_state_that_cannot_be_loaded_is_moved_aside_and_the_one_before_is_loaded(tmp_path: Path) -> None:
    accelerator = FakeAccelerator(tmp_path)
    run = helper.Resumable(accelerator, FakeLoader(10), folder=tmp_path, every_steps=2)
    for _ in run.epochs(1):
        for _ in run.batches():
            accelerator.weights += 1
            run.after_step()
            if run.global_step == 4:
                break
    newest = tmp_path / "step-00000004"
    (newest / "model.bin").write_text("x")  # the same size, but not what was saved
    again = FakeAccelerator(tmp_path)
    resumed = helper.Resumable(again, FakeLoader(10), folder=tmp_path)
    assert resumed.position == helper.Position(2, 0, 2) and again.weights == 2
    assert not newest.exists()
    reason = (tmp_path / helper.DAMAGED / newest.name / "reason.txt").read_text()
    assert reason.startswith("rank 0: ValueError: invalid literal for int()"), reason
    assert helper.complete_states(tmp_path)[0][0].path.name == "step-00000002"


def test_a_state_saved_by_another_number_of_processes_is_refused(tmp_path: Path) -> None:
    fake_state(tmp_path, 5, ranks=2)
    fake_accelerator = FakeAccelerator(tmp_path)
    with pytest.raises(CheckpointError, match="saved by 2 processes, this run has 1"):
        helper.Resumable(fake_accelerator, FakeLoader(4), folder=tmp_path)


def test_an_accelerator_that_does_not_see_the_other_ranks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(CheckpointError, match=r"WORLD_SIZE is 3 but the Accelerator has 1 .*cpu=True"):
        helper.Resumable(FakeAccelerator(tmp_path), FakeLoader(4), folder=tmp_path)


def test_a_loader_that_shuffles_without_a_seed_a_resume_can_repeat_is_refused(tmp_path: Path) -> None:
    loader = torch.utils.data.DataLoader(list(range(8)), shuffle=True)
    with pytest.raises(CheckpointError, match="use_seedable_sampler=True"):
        helper.Resumable(FakeAccelerator(tmp_path), loader, folder=tmp_path)
