"""The campaign's own logic without a cluster: the seeded schedule, the ledger of complete
checkpoints (what counts as lost), the verdict of a trial and its table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from campaign import Outcome, schedule, table
from faults import FAULTS
from run_view import CheckpointLedger

from slurmddp.experiment.schema import Checkpoint
from slurmddp.job.checkpoint import CheckpointStore


def test_a_seed_gives_one_schedule_and_each_round_has_every_fault() -> None:
    kinds = schedule(7, 2 * len(FAULTS))
    assert kinds == schedule(7, 2 * len(FAULTS)) != schedule(8, 2 * len(FAULTS))
    assert sorted(kinds[: len(FAULTS)]) == sorted(kinds[len(FAULTS) :]) == sorted(FAULTS)
    assert schedule(7, 3) == kinds[:3]
    assert schedule(7, 3, "flip-byte") == ["flip-byte"] * 3


def checkpoints(root: Path, steps: list[int], keep_last: int) -> CheckpointStore:
    store = CheckpointStore(root, 0, 1, Checkpoint(keep_last=keep_last), attempt="a")
    for step in steps:
        store.save(step, {"w": torch.full((64,), float(step))}, {})
        store.prune()
    return store


def test_pruning_loses_nothing_but_damage_and_removal_do(tmp_path: Path) -> None:
    ledger = CheckpointLedger(tmp_path)
    for step in (10, 20, 30, 40):
        checkpoints(tmp_path, [step], keep_last=2)
        ledger.poll()
    assert ledger.complete() == {30, 40}
    assert ledger.lost(2, frozenset()) == []
    shared = tmp_path / "step-00000040" / "shared.pt"
    data = bytearray(shared.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shared.write_bytes(bytes(data))
    assert ledger.complete() == {30}, "a flipped byte makes it incomplete (CRC32)"
    assert ledger.lost(2, frozenset({40})) == []
    assert CheckpointLedger(tmp_path).lost(2, frozenset({40})) == [], "complete until damaged on purpose"
    assert ledger.lost(2, frozenset()) == [40]


def outcome(fault: str, **changed: object) -> Outcome:
    base = Outcome(
        seed=1,
        index=0,
        fault=fault,
        note="SIGKILL rank 1 at step 40",
        state="COMPLETED",
        attempts=2,
        ends=["failure", "completed"],
        bit_identical=True,
        reason="completed",
        lost=[],
        recover_s=20.0,
        new_attempt=True,
        seconds=60.0,
        run="r",
    )
    return replace(base, **changed)  # type: ignore[arg-type]


def test_a_run_passes_bit_identical_or_with_the_fault_named_and_nothing_lost() -> None:
    assert outcome("rank-kill").passed
    assert not outcome("rank-kill", lost=[40]).passed
    assert not outcome("rank-kill", note="missed: the run ended before step 40").passed
    failed = {"state": "FAILED", "bit_identical": False}
    assert not outcome("rank-kill", **failed, reason="failure: no space left").passed
    assert outcome("disk-full", **failed, reason="failure: no space left on /ckpt: 1 KB free").passed
    assert not outcome("disk-full", **failed, reason="failure: RuntimeError('unexpected pos')").passed


def test_the_table_counts_per_fault() -> None:
    rows = table(
        [
            outcome("rank-kill", recover_s=20.0),
            outcome("rank-kill", recover_s=30.0),
            outcome(
                "flip-byte", state="FAILED", bit_identical=False, reason="failure: corrupt", recover_s=None
            ),
        ]
    ).splitlines()
    assert rows[2] == "| flip-byte | 1 | 0 | 1 x FAILED: failure: corrupt | - | 1 x failure/completed | 0 |"
    assert rows[3] == "| rank-kill | 2 | 2 | - | 25.0 s (20.0-30.0) | 2 x failure/completed | 0 |"
