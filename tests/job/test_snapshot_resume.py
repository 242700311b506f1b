"""In-memory snapshots, with ranks run by the runtime as Slurm would start them: three ranks on
two fake nodes (ranks 0 and 1 on node-a, rank 2 on node-b) take a snapshot every 4 steps into
each node's folder, and all of them are SIGKILLed mid-run. The next attempt resumes from the
newest snapshot, not from step 0, and ends on the uninterrupted run's weights: on the same nodes,
and with node-b replaced by a node that holds none (it gets the snapshot from node-a). Each rank
draws its batches from a stream of its own, so each must get its own streams back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUICKSTART, worker_job_id
from resume_train import CRASH_AT_ENV
from test_rank_resume import DRIVER, TRAIN, attempt, rank_env

from slurmddp.defaults import IN_JOB_RESTART_ENV, SNAPSHOTS_ENV
from slurmddp.job.checkpoint.memory import load

pytestmark = pytest.mark.process

WHOLE, CRASHED, REPLACED = worker_job_id(606), worker_job_id(707), worker_job_id(808)
EVERY_4 = ("checkpoint.snapshot_every_steps=4",)
CRASH_AT = 11


def run_attempt(
    run_dir: Path, job_id: int, nodes: tuple[str, str, str], in_job: int, crash_at: int = -1
) -> list[tuple[int, str, str]]:
    """Three ranks, `nodes[r]` rank r's node; each rank's exit status, stdout and stderr."""
    run_dir.mkdir(parents=True, exist_ok=True)
    local = {0: 0, 1: 1, 2: 0}
    procs = []
    for rank in range(3):
        env = rank_env(job_id, 0, False, -1, rank, 3)
        env.update(
            {
                "SLURM_LOCALID": str(local[rank]),
                "SLURMD_NODENAME": nodes[rank],
                SNAPSHOTS_ENV: str(memory_of(run_dir)),
                IN_JOB_RESTART_ENV: str(in_job),
                CRASH_AT_ENV: str(crash_at),
            }
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", DRIVER, str(run_dir), TRAIN, str(QUICKSTART), json.dumps(EVERY_4)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [proc.communicate(timeout=300) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]


def memory_of(run_dir: Path) -> Path:
    """The folder the batch script would export: SNAPSHOT_DIR/slurmddp-UID/JOB.RESTART."""
    (run_dir / "shm").mkdir(exist_ok=True)
    return run_dir / "shm" / f"slurmddp-{os.getuid()}" / "1.0"


def result_of(ended: list[tuple[int, str, str]]) -> dict[str, object]:
    shown = "\n".join(f"rank {r}: status {code}\n{out}{err}" for r, (code, out, err) in enumerate(ended))
    assert all(code == 0 for code, _, _ in ended), shown
    line = next(line for line in ended[0][1].splitlines() if line.startswith("RESULT "))
    result: dict[str, object] = json.loads(line.removeprefix("RESULT "))
    result["log"] = shown
    return result


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uninterrupted run of three ranks (no snapshots: no batch script set their folder up)."""
    found = attempt(tmp_path_factory.mktemp("whole"), WHOLE, 0, False, ranks=3)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("job", "second"),
    [(CRASHED, ("node-a", "node-a", "node-b")), (REPLACED, ("node-a", "node-a", "node-c"))],
    ids=["same-nodes", "node-b-replaced"],
)
def test_a_crashed_attempt_resumes_from_the_newest_snapshot_onto_the_uninterrupted_weights(
    tmp_path: Path, whole: dict[str, object], job: int, second: tuple[str, str, str]
) -> None:
    first = ("node-a", "node-a", "node-b")
    crashed = run_attempt(tmp_path, job, first, 0, crash_at=CRASH_AT)
    assert [code for code, _, _ in crashed] == [-9, -9, -9], crashed
    memory = memory_of(tmp_path)
    # One file a node, written by its local rank 0, the newest only, holding every rank's own state.
    held = {node.name: [load(p.read_bytes()) for p in node.iterdir()] for node in memory.iterdir()}
    assert set(held) == {"node-a", "node-b"} and all(len(found) == 1 for found in held.values()), held
    steps = {node: found[0].step for node, found in held.items()}
    for (snapshot,) in held.values():
        assert snapshot.world_size == 3 and len(snapshot.locals) == 3
        assert snapshot.step % 4 == 0 and 0 < snapshot.step <= CRASH_AT, steps
    # Only the second attempt's nodes look: a node left out keeps its folder until the job's end.
    newest = max(step for node, step in steps.items() if node in second)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())

    resumed = result_of(run_attempt(tmp_path, job, second, 1))
    log = str(resumed["log"])
    source = min(node for node, step in steps.items() if step == newest and node in second)
    assert (
        f"resumed from the in-memory snapshot {memory / source / f'step-{newest:08d}.pt'} at step {newest}"
        in (log)
    ), (steps, log)
    assert CRASH_AT - newest <= 4 + 3, steps
    assert resumed["digest"] == whole["digest"] and resumed["loss"] == whole["loss"]
    # The loop's end frees the memory of each node it ran on (and the job's folder once no node's
    # is left in it).
    left = sorted(p.name for p in memory.iterdir()) if memory.exists() else []
    assert left == sorted(set(first) - set(second)), left
