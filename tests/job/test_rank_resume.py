"""A rank run by the runtime as Slurm would start it (one task, a fake Slurm environment), stopped
by USR2 mid-run and started again as the requeued attempt: it must end on exactly the weights of
an uninterrupted run. On the CPU with gloo always; on a GPU with NCCL, cuda:0, CUDA's RNG in the
checkpoint and bf16 autocast where one is present (skipped otherwise). Two training functions: a
small one drawing every batch from the RNG streams, and the quickstart (loader workers, pinned
memory on a GPU, dropout, `ctx.autocast`, accumulation), stopped mid-epoch."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from checkpoint_damage import flip_a_byte
from conftest import QUICKSTART, worker_job_id
from resume_train import STOP_AT_ENV

from slurmddp.defaults import LOCAL_REQUEUE_STATUS
from slurmddp.experiment.schema import Requeue, Resources
from slurmddp.job.allocation import outcome, requeue
from slurmddp.job.checkpoint.space import bytes_on_disk

HERE = Path(__file__).resolve().parent
TRAIN = f"{HERE / 'resume_train.py'}:train"
QUICKSTART_TRAIN = f"{HERE / 'resume_quickstart.py'}:train"
# The uninterrupted and the stopped run's job ids (their ranks' MASTER_PORT comes from them).
WHOLE, STOPPED = worker_job_id(101), worker_job_id(202)
QUICKSTART_SETTINGS = [
    "train.epochs=3",
    "train.log_every=1",
    "precision.autocast=bfloat16",
    "ddp.accumulate=2",
]
DRIVER = """
import json, os, sys
from pathlib import Path
from slurmddp.experiment.load import load_experiment
from slurmddp.experiment.schema import Dist, Preflight
from slurmddp.job.launch.runtime import run_rank
from slurmddp.job.spec import RankSpec, RunSettings

run_dir = Path(sys.argv[1])
loaded = load_experiment(Path(sys.argv[3]), json.loads(sys.argv[4]))
spec = RankSpec(
    function=sys.argv[2], script=None, args=(), workdir=str(run_dir), run_dir=str(run_dir),
    checkpoint_dir=str(run_dir / "checkpoints"),
    config=loaded.resolved,
    dist=Dist(timeout_s=120), preflight=Preflight(), settings=RunSettings.of(loaded.experiment),
    env={}, fabric_profile="auto",
    stop_signals=("USR2", "TERM"), executor="local",
)
print("RESULT " + json.dumps(run_rank(spec)), flush=True)
# The result is out: the interpreter's teardown, where gloo's threads can abort a finished process
# ("terminate called without an active exception", pytorch/pytorch#179291), is not under test.
sys.stderr.flush()
os._exit(0)
"""


def attempt(
    run_dir: Path,
    job_id: int,
    restart: int,
    cuda: bool,
    stop_at: int = -1,
    function: str = TRAIN,
    overrides: tuple[str, ...] = (),
    ranks: int = 1,
) -> dict[str, object] | None:
    """One attempt of `ranks` ranks on this machine; rank 0's result (and every rank's output, as
    "log"), or None when they stopped to be run again."""
    ended = run_ranks(run_dir, job_id, restart, cuda, stop_at, function, overrides, ranks)
    shown = "\n".join(
        f"rank {rank}: status {code}\n{out}{err}" for rank, (code, out, err) in enumerate(ended)
    )
    if all(code == LOCAL_REQUEUE_STATUS for code, _, _ in ended):
        return None
    assert all(code == 0 for code, _, _ in ended), shown
    line = next(line for line in ended[0][1].splitlines() if line.startswith("RESULT "))
    result: dict[str, object] = json.loads(line.removeprefix("RESULT "))
    result["log"] = shown
    return result


def run_ranks(
    run_dir: Path,
    job_id: int,
    restart: int,
    cuda: bool,
    stop_at: int = -1,
    function: str = TRAIN,
    overrides: tuple[str, ...] = (),
    ranks: int = 1,
) -> list[tuple[int, str, str]]:
    """Each rank's exit status, stdout and stderr."""
    run_dir.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(run_dir), function, str(QUICKSTART), json.dumps(overrides)],
            env=rank_env(job_id, restart, cuda, stop_at, rank, ranks),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]


def rank_env(job_id: int, restart: int, cuda: bool, stop_at: int, rank: int, ranks: int) -> dict[str, str]:
    """Rank `rank` of `ranks` on one node, as Slurm would start it."""
    env = {
        **os.environ,
        "SLURM_JOB_ID": str(job_id),
        "SLURM_RESTART_COUNT": str(restart),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": str(ranks),
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": str(ranks),
        STOP_AT_ENV: str(stop_at),
        # Deterministic cuBLAS, so that two runs of the same steps agree bit for bit.
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cuda:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


ON_CPU_AND_GPU = pytest.mark.parametrize(
    "cuda",
    [
        False,
        pytest.param(
            True, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
        ),
    ],
    ids=["cpu-gloo", "cuda-nccl"],
)
ON_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@ON_CPU_AND_GPU
def test_a_stopped_rank_resumes_onto_the_uninterrupted_weights(tmp_path: Path, cuda: bool) -> None:
    whole = attempt(tmp_path / "whole", WHOLE, 0, cuda)
    assert whole is not None and whole["device"] == ("cuda:0" if cuda else "cpu")
    # The signal lands during step 11; every rank agrees at the next boundary, saves there and
    # exits asking to be run again (executor "local": no scontrol requeue from a test).
    assert attempt(tmp_path / "stopped", STOPPED, 0, cuda, stop_at=11) is None
    stop = json.loads((tmp_path / "stopped" / "stop.json").read_text())
    assert stop["signal"] == "SIGUSR2" and stop["step"] == 13
    resumed = attempt(tmp_path / "stopped", STOPPED, 1, cuda)
    assert resumed is not None
    assert resumed["digest"] == whole["digest"] and resumed["loss"] == whole["loss"]
    assert resumed["device"] == whole["device"]


# On a GPU only: on CPU, test_quickstart_local.py stops the same quickstart twice mid-epoch (4
# ranks) and compares weights and every validation.
@ON_GPU
def test_the_quickstart_stopped_mid_epoch_on_a_gpu_resumes_onto_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    settings = (*QUICKSTART_SETTINGS, "train.global_batch=64")
    whole = attempt(tmp_path / "whole", WHOLE, 0, True, function=QUICKSTART_TRAIN, overrides=settings)
    assert whole is not None
    # Steps per epoch: 1437 // 64 = 22; step 30 is mid-epoch.
    stopped = attempt(tmp_path / "stopped", STOPPED, 0, True, 30, QUICKSTART_TRAIN, settings)
    assert stopped is None
    stop = json.loads((tmp_path / "stopped" / "stop.json").read_text())
    resumed = attempt(tmp_path / "stopped", STOPPED, 1, True, function=QUICKSTART_TRAIN, overrides=settings)
    assert resumed is not None and 30 < stop["step"] < 44
    assert resumed["param_sha256"] == whole["param_sha256"]
    assert resumed["val_acc"] == whole["val_acc"] and resumed["val_loss"] == whole["val_loss"]


# The uninterrupted, the damaged and the cramped run's job ids, for three ranks.
WHOLE_3, DAMAGED_3, CRAMPED_3 = worker_job_id(303), worker_job_id(404), worker_job_id(505)
EVERY_5 = ("checkpoint.every_steps=5", "checkpoint.keep_last=3")


@pytest.fixture(scope="module")
def whole_3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uninterrupted run of three ranks, checkpointing every 5 steps; "checkpoints": where."""
    run = tmp_path_factory.mktemp("whole")
    whole = attempt(run, WHOLE_3, 0, False, overrides=EVERY_5, ranks=3)
    assert whole is not None
    whole["checkpoints"] = str(run / "checkpoints")
    return whole


def test_a_byte_flipped_in_one_ranks_file_of_the_newest_checkpoint_costs_only_the_steps_since_the_one_before(
    tmp_path: Path, whole_3: dict[str, object]
) -> None:
    """Three ranks, of which only rank 1 reads the damaged file: all of them agree to skip it, and
    the run ends on the uninterrupted run's weights. Before: rank 1 raised a CRC mismatch, the
    others died in a collective, and every attempt chose the same checkpoint again."""
    run = tmp_path / "damaged"
    assert attempt(run, DAMAGED_3, 0, False, stop_at=11, overrides=EVERY_5, ranks=3) is None
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step-{s:08d}" for s in (5, 10, 13)]
    flip_a_byte(checkpoints / "step-00000013" / "rank-00001.pt")
    resumed = attempt(run, DAMAGED_3, 1, False, overrides=EVERY_5, ranks=3)
    assert resumed is not None
    assert resumed["digest"] == whole_3["digest"] and resumed["loss"] == whole_3["loss"]
    log = str(resumed["log"])
    assert (
        f"skipping damaged checkpoint {checkpoints / 'step-00000013'}: rank 1: rank-00001.pt has CRC32 "
    ) in log
    assert f"resumed from {checkpoints / 'step-00000010'} at step 10" in log
    reason = (checkpoints / "damaged" / "step-00000013" / "reason.txt").read_text()
    assert reason.startswith("rank 1: rank-00001.pt has CRC32") and "(corrupt)" in reason


@contextlib.contextmanager
def small_filesystem(where: Path, size: int) -> Iterator[None]:
    """A tmpfs of `size` bytes mounted on `where` (skipped without the right to mount one)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("checkpoints_room", [1.6, 0.6], ids=["room-for-one", "room-for-none"])
def test_a_full_checkpoint_disk_costs_checkpoints_but_not_the_run(
    tmp_path: Path, whole_3: dict[str, object], checkpoints_room: float
) -> None:
    """Three ranks, checkpoints on a tmpfs with room for one checkpoint (the check before a save
    refuses the second) or for less than one (every save meets ENOSPC while writing): the saves
    that do not fit are skipped with a warning; the one for the stop ends the attempt with why,
    and the next attempt resumes from what there is and ends on the uninterrupted run's weights.
    Before: torch's `unexpected pos` RuntimeError ended the first attempt whose save did not fit,
    and a partial step directory was left behind."""
    run = tmp_path / "cramped"
    checkpoints = run / "checkpoints"
    one = bytes_on_disk(next(Path(str(whole_3["checkpoints"])).glob("step-*")))
    with small_filesystem(checkpoints, int(one * checkpoints_room) // 4096 * 4096):
        first = run_ranks(run, CRAMPED_3, 0, False, stop_at=11, overrides=EVERY_5, ranks=3)
        shown = "\n".join(out + err for _, out, err in first)
        assert [code for code, _, _ in first] == [1, 1, 1], shown
        failure = json.loads((run / "failure.json").read_text())
        # Said by the check before the save, or by a rank that met ENOSPC while writing.
        said = rf"(rank \d: )?no space left on {re.escape(str(checkpoints))}: [\d.]+ (bytes|kB) free, "
        stop = r" \(the checkpoint for the stop at step 13 was not saved\)"
        assert re.fullmatch(said + r".*" + stop, failure["error"]), failure
        # Retried (on Slurm: requeued) within the failure budget, named by the lack of space. The
        # ranks ran as the local executor's (no scontrol from a test), whose rank 0 records its
        # attempt's end itself; Slurm's decision sees the run as its batch script would, without.
        (run / "attempts.jsonl").unlink()
        decision = requeue.decide(
            run,
            1,
            {"SLURM_JOB_ID": str(CRAMPED_3), "SLURM_RESTART_COUNT": "0"},
            outcome.Settings(Requeue(), Resources()),
            preempt_time=lambda job: None,
            failed_nodes=lambda nodes, since: {},
        )
        assert decision.requeue and decision.message.startswith("failure at step 13 ("), decision
        assert f"no space left on {checkpoints}: " in decision.message, decision
        skipped = [
            f"slurmddp: warning: rank {rank}: the checkpoint at step 10 was not saved: " for rank in range(3)
        ]
        assert all(line in shown for line in skipped), shown
        kept = sorted(p.name for p in checkpoints.iterdir())
        assert kept == (["step-00000005"] if checkpoints_room > 1 else []), kept
        resumed = attempt(run, CRAMPED_3, 1, False, overrides=EVERY_5, ranks=3)
    assert resumed is not None
    assert resumed["digest"] == whole_3["digest"] and resumed["loss"] == whole_3["loss"]
    if checkpoints_room > 1:
        assert f"resumed from {checkpoints / 'step-00000005'} at step 5" in str(resumed["log"])
