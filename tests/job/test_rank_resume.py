"""A rank run by the runtime as Slurm would start it (one task, a fake Slurm environment), stopped
by USR2 mid-run and started again as the requeued attempt: it must end on exactly the weights of
an uninterrupted run. On the CPU with gloo always; on a GPU with NCCL, cuda:0, CUDA's RNG in the
checkpoint and bf16 autocast where one is present (skipped otherwise). Two training functions: a
small one drawing every batch from the RNG streams, and the quickstart (loader workers, pinned
memory on a GPU, dropout, `ctx.autocast`, accumulation), stopped mid-epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import QUICKSTART, worker_job_id
from resume_train import STOP_AT_ENV

from slurmddp.defaults import LOCAL_REQUEUE_STATUS

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
import json, sys
from pathlib import Path
from slurmddp.experiment.load import load_experiment
from slurmddp.experiment.schema import Dist, Preflight
from slurmddp.job.runtime import run_rank
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
"""


def attempt(
    run_dir: Path,
    job_id: int,
    restart: int,
    cuda: bool,
    stop_at: int = -1,
    function: str = TRAIN,
    overrides: tuple[str, ...] = (),
) -> dict[str, object] | None:
    """One attempt of the rank; its result, or None when it stopped to be run again."""
    env = {
        **os.environ,
        "SLURM_JOB_ID": str(job_id),
        "SLURM_RESTART_COUNT": str(restart),
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": "1",
        STOP_AT_ENV: str(stop_at),
        # Deterministic cuBLAS, so that two runs of the same steps agree bit for bit.
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cuda:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(run_dir), function, str(QUICKSTART), json.dumps(overrides)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode == LOCAL_REQUEUE_STATUS:
        return None
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    result: dict[str, object] = json.loads(line.removeprefix("RESULT "))
    return result


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


@ON_CPU_AND_GPU
def test_the_quickstart_stopped_mid_epoch_resumes_onto_the_uninterrupted_weights(
    tmp_path: Path, cuda: bool
) -> None:
    settings = (*QUICKSTART_SETTINGS, f"train.global_batch={64 if cuda else 32}")
    whole = attempt(tmp_path / "whole", WHOLE, 0, cuda, function=QUICKSTART_TRAIN, overrides=settings)
    assert whole is not None
    # Steps per epoch: 1437 // 32 = 44 (// 64 = 22); step 30 is mid-epoch either way.
    stopped = attempt(tmp_path / "stopped", STOPPED, 0, cuda, 30, QUICKSTART_TRAIN, settings)
    assert stopped is None
    stop = json.loads((tmp_path / "stopped" / "stop.json").read_text())
    resumed = attempt(tmp_path / "stopped", STOPPED, 1, cuda, function=QUICKSTART_TRAIN, overrides=settings)
    assert resumed is not None and 30 < stop["step"] < 44
    assert resumed["param_sha256"] == whole["param_sha256"]
    assert resumed["val_acc"] == whole["val_acc"] and resumed["val_loss"] == whole["val_loss"]
