"""The task's first code: the stop signals are caught from the start and ignored once the work is
done, so a late time-limit signal cannot kill a rank that has finished."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmddp.defaults import STOP_SIGNALS_ENV, SUBMITTED_WITH_ENV, TASK_IDS_FROM_HOST_ENV
from slurmddp.job.launch import boot
from slurmddp.rundir.layout import CONFIG
from slurmddp.rundir.records import Failure


def test_stop_signals_are_caught_during_the_run_and_ignored_at_exit(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text(
        "import atexit, os, signal\n"
        # During the run: a stop signal is recorded, not fatal.
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "from slurmddp.job.process import signals\n"
        "print('recorded', signals.name(signals.received()))\n"
        # atexit runs after boot has handed back: what a signal would meet while Python shuts down.
        "atexit.register(lambda: print('ignored at exit', [signal.getsignal(s) == signal.SIG_IGN "
        "for s in (signal.SIGUSR2, signal.SIGTERM)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-u", "-m", "slurmddp.job.launch.boot", "-m", "work"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), STOP_SIGNALS_ENV: "USR2,TERM"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["recorded SIGUSR2", "ignored at exit [True, True]"]


SPY = """
import signal, sys
from types import SimpleNamespace
from slurmddp.job.rank import Rank

seen = []

class Spy:
    def find_spec(self, name, path, target=None):
        if name == "slurmddp.job.launch.runtime":
            seen.append(signal.getsignal(signal.SIGUSR2))
        return None

sys.meta_path.insert(0, Spy())
signal.signal(signal.SIGUSR2, signal.SIG_DFL)  # what stands for submitit's handler
try:
    Rank(SimpleNamespace(stop_signals=("USR2", "TERM")))()
except Exception:
    pass  # a fake spec: only the moment of the import matters
print("ours" if seen and callable(seen[0]) else f"not ours: {seen}")
"""


def test_the_rank_takes_the_stop_signals_back_before_it_imports_the_runtime() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SPY], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout.strip().endswith("ours"), proc.stdout + proc.stderr


def test_importing_the_runtime_leaves_torch_unloaded() -> None:
    # run_rank sets OMP_NUM_THREADS (and NCCL's variables) before it imports torch: a torch loaded
    # earlier keeps its default thread count (2 threads a rank were measured when it was).
    code = "import sys, slurmddp.job.launch.runtime; print('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr


def test_a_container_without_torch_or_with_another_slurmddp_is_refused_and_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / CONFIG).write_text("name: x\n")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_PROCID", "3")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    monkeypatch.delenv(SUBMITTED_WITH_ENV, raising=False)
    boot._check_image([str(run_dir / "logs")])  # outside a container: nothing is checked
    monkeypatch.setenv(SUBMITTED_WITH_ENV, "9.9.9")
    with pytest.raises(SystemExit) as refused:
        boot._check_image([str(run_dir / "logs")])
    said = str(refused.value)
    assert "it has no torch and slurmddp " in said and "submitted with slurmddp 9.9.9" in said, said
    assert "pip install 'slurmddp==9.9.9' torch" in said
    [failure] = Failure.read_all(run_dir)
    assert failure.rank == 3 and failure.retry is False
    assert failure.error == said.removeprefix("slurmddp: ")


def test_a_task_in_a_slurm_22_05_oci_container_finds_its_rank_from_its_host() -> None:
    # srun's environment, as 22.05 hands it to the container: the batch script's SLURM_PROCID=0.
    step = {
        "SLURM_CONTAINER": "/bundles/torch",
        "SLURM_STEP_NODELIST": "node[1-3]",
        "SLURM_PROCID": "0",
        TASK_IDS_FROM_HOST_ENV: "1",
    }
    ids = boot.container_task_ids(step, "node2.cluster.example")
    assert ids == {"SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}
    # Not asked for (24.11 hands each task its own), or a host outside the step: nothing is guessed.
    assert (
        boot.container_task_ids({k: v for k, v in step.items() if k != TASK_IDS_FROM_HOST_ENV}, "node2") == {}
    )
    assert boot.container_task_ids(step, "login1") == {}
