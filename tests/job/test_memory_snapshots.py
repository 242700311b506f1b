"""A node's in-memory snapshots (job/checkpoint/memory.py) and when the loop takes them
(job/train/snapshots.py), without a process group."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slurmddp.errors import ConfigError
from slurmddp.experiment.schema import Checkpoint
from slurmddp.job.checkpoint.memory import NodeSnapshots, load
from slurmddp.job.train.cadence import Cadence
from slurmddp.job.train.snapshots import Snapshots, node_folder


def node(tmp_path: Path) -> NodeSnapshots:
    """SNAPSHOT_DIR/slurmddp-UID/JOB.RESTART/NODE, SNAPSHOT_DIR being `tmp_path`."""
    return NodeSnapshots(tmp_path / f"slurmddp-{os.getuid()}" / "7.0" / "node1")


def test_only_the_newest_snapshot_stays_and_holds_what_was_copied_before_the_originals_changed(
    tmp_path: Path,
) -> None:
    snapshots = node(tmp_path)
    weights = torch.arange(4.0)
    for step in (4, 8):
        snapshots.write(
            step, 2, snapshots.copy({"model": {"w": weights}}), [{"rng": step}, {"rng": step + 1}]
        )
        # The caller trains on as soon as copy() returns: the snapshot keeps the values it copied.
        weights += 100
        snapshots.wait()
    assert sorted(p.name for p in snapshots.folder.iterdir()) == ["step-00000008.pt"]
    assert snapshots.newest() == 8
    loaded = load(snapshots.read(8))
    assert loaded.step == 8 and loaded.world_size == 2 and loaded.locals == [{"rng": 8}, {"rng": 9}]
    assert torch.equal(loaded.shared["model"]["w"], torch.arange(4.0) + 100)
    # Every level made is this user's alone.
    for level in [snapshots.folder, *snapshots.folder.parents][:3]:
        assert level.stat().st_mode & 0o077 == 0, level


def test_a_write_cut_off_midway_is_not_a_snapshot(tmp_path: Path) -> None:
    snapshots = node(tmp_path)
    snapshots.write(4, 1, snapshots.copy({"model": {"w": torch.ones(2)}}), [{}])
    snapshots.wait()
    (snapshots.folder / ".writing-123-step-00000008.pt").write_bytes(b"half")
    assert snapshots.newest() == 4
    snapshots.write(12, 1, snapshots.copy({"model": {"w": torch.ones(2)}}), [{}])
    snapshots.wait()
    assert sorted(p.name for p in snapshots.folder.iterdir()) == ["step-00000012.pt"]


def test_a_folder_another_user_could_have_made_is_neither_read_nor_written(tmp_path: Path) -> None:
    snapshots = node(tmp_path)
    snapshots.write(4, 1, snapshots.copy({"model": {"w": torch.ones(2)}}), [{}])
    snapshots.wait()
    job = snapshots.folder.parent
    job.chmod(0o777)
    assert "is not a folder of this user's alone" in str(snapshots.untrusted())
    snapshots.write(8, 1, snapshots.copy({"model": {"w": torch.ones(2)}}), [{}])
    with pytest.raises(Exception, match=r"7\.0 is not a folder of this user's alone .*remove it"):
        snapshots.wait()
    assert snapshots.newest() == 4


def test_clear_frees_the_nodes_memory(tmp_path: Path) -> None:
    snapshots = node(tmp_path)
    snapshots.write(4, 1, snapshots.copy({"model": {"w": torch.ones(2)}}), [{}])
    other = NodeSnapshots(snapshots.folder.parent / "node2")
    other.write(4, 1, other.copy({"model": {"w": torch.ones(2)}}), [{}])
    other.wait()
    snapshots.clear()
    assert not snapshots.folder.exists() and snapshots.newest() is None
    assert other.newest() == 4
    other.clear()
    assert not snapshots.folder.parent.exists()


def test_a_state_torch_cannot_read_back_safely_is_refused_at_the_copy(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"shared\['model'\]\['w'\]: a set holding"):
        node(tmp_path).copy({"model": {"w": {object()}}})


def dist(rank: int = 0, local_rank: int = 0, world_size: int = 4) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, local_rank=local_rank, world_size=world_size, in_job_restart=0)


def test_snapshots_are_taken_only_where_the_batch_script_set_their_folder_up(tmp_path: Path) -> None:
    env = {"SLURMDDP_SNAPSHOTS": str(tmp_path), "SLURMD_NODENAME": "node3"}
    assert node_folder(env) == tmp_path / "node3"
    assert Snapshots.open({}, Checkpoint(), dist(), "cpu") is None  # type: ignore[arg-type]
    assert Snapshots.open(env, Checkpoint(snapshot_every_steps=0), dist(), "cpu") is None  # type: ignore[arg-type]
    # One rank has nobody to lose its state to: its checkpoints are what a restart has.
    assert Snapshots.open(env, Checkpoint(), dist(world_size=1), "cpu") is None  # type: ignore[arg-type]
    # On by default, at the interval chosen (null).
    writer = Snapshots.open(env, Checkpoint(), dist(), "cpu")  # type: ignore[arg-type]
    reader = Snapshots.open(env, Checkpoint(), dist(rank=1, local_rank=1), "cpu")  # type: ignore[arg-type]
    assert writer is not None and writer.node is not None
    assert reader is not None and reader.node is None


def test_the_chosen_interval_keeps_the_measured_cost_under_one_percent_of_a_step() -> None:
    """Steps of 10 ms, 12 ms while a write is in flight (two steps a write), a snapshot's own part
    1 ms: 1 + 2 x 2 = 5 ms a snapshot, every 100 steps (0.5%: half the 1% budget)."""
    cadence = Cadence()
    now, due = 0.0, []
    busy_until = -1
    for step in range(800):
        busy = step < busy_until
        if cadence.due_after(step, now, busy, first_step=0):
            due.append(step + 1)
        now += 0.012 if busy else 0.010
        if due and due[-1] == step + 1:
            cadence.write_s = 0.008
            cadence.took(step + 1, 0.001)
            busy_until = step + 3
            now += 0.001
    # The first as soon as a step was timed; its write's two slower steps are measured before the
    # next is due, so the measured cost decides from the second on (the write's own 8 ms would
    # have made it every 180 steps).
    assert due[0] == 3, due
    assert cadence.write_steps == pytest.approx(2.0)
    assert cadence.cost_s() == pytest.approx(0.005, rel=0.01)
    gaps = [b - a for a, b in itertools.pairwise(due)]
    assert set(gaps) <= {100, 101} and len(due) == 8, due
    assert Cadence(every=10).interval() == 10


def test_the_interval_follows_the_mean_cost_not_the_last_snapshots() -> None:
    """Steps of 10 ms, a write that slows none, snapshots whose part on the training path is 1 ms
    and 5 ms in turn (as on busy cores), the first 30 ms (its buffers allocated): the interval
    soon stays near what the mean (3 ms) gives, 60 steps at half the 1% budget, where one chosen
    from the last alone went 20, 100, 20, ..."""
    cadence = Cadence()
    now, chosen, busy_until, taken = 0.0, [], -1, 0
    for step in range(3000):
        if cadence.due_after(step, now, step < busy_until, first_step=0):
            cadence.took(step + 1, 0.030 if taken == 0 else 0.001 if taken % 2 else 0.005)
            cadence.settled(0.0)
            taken += 1
            busy_until = step + 3
            chosen.append(cadence.interval())
        now += 0.010
    assert taken > 40
    assert all(45 <= interval <= 80 for interval in chosen[10:]), chosen


def test_an_epochs_validation_is_not_timed_as_a_step() -> None:
    """The steps of the test above, with a 0.5 s validation every 22 steps: flagged as a pause, the
    interval stays what the steps alone give. Timed as a step it skews the step times: here (no
    write in flight) mostly every 3 steps."""

    def intervals(flagged: bool) -> list[int]:
        cadence = Cadence()
        now, due, busy_until, chosen = 0.0, [], -1, []
        for step in range(1000):
            busy = step < busy_until
            paused = step % 22 in (0, 1) and step > 0
            if cadence.due_after(step, now, busy, first_step=0, paused=flagged and paused):
                due.append(step + 1)
            chosen.append(cadence.interval())
            now += 0.012 if busy else 0.010
            if step % 22 == 21:
                now += 0.5
            if due and due[-1] == step + 1:
                cadence.write_s = 0.008
                cadence.took(step + 1, 0.001)
                busy_until = step + 3
                now += 0.001
        return chosen[200:]

    assert set(intervals(flagged=True)) <= {100, 101}
    assert not set(intervals(flagged=False)) <= {100, 101}


def test_the_interval_is_said_again_where_it_moved_by_half_or_twice() -> None:
    cadence = Cadence(every=10)
    assert cadence.worth_saying(None)
    assert not cadence.worth_saying(10) and not cadence.worth_saying(6) and not cadence.worth_saying(19)
    assert cadence.worth_saying(5) and cadence.worth_saying(20) and cadence.worth_saying(100)


def test_snapshot_dir_must_be_an_absolute_path() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint.snapshot_dir: 'shm' is not an absolute path"):
        Checkpoint(snapshot_dir="shm")
    with pytest.raises(ConfigError, match=r"checkpoint.snapshot_every_steps: must be >= 0"):
        Checkpoint(snapshot_every_steps=-1)
