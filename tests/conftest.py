"""Shared fixtures and helpers. The real Slurm cluster (tests/slurm_lab) is started lazily, once per
session, by the first test that asks for `slurm_env`, and stopped at the end of the session.

Tests that use it are marked `@pytest.mark.slurm`; a test that requests `slurm_env` gets the marker
automatically, so `pytest -m "not slurm"` runs everything that needs no cluster.

This file applies to every folder under tests/, and the helpers below are imported by name
(`from conftest import wait_for_job`): pyproject's `pythonpath = ["tests"]` puts this folder on
sys.path.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
"""The repository: examples/, configs/ and templates/ are read from there."""
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
SYNTHETIC = ROOT / "examples" / "synthetic.yaml"
"""The seeded-MLP example: steps and width set freely, for long runs and big checkpoints."""
LAB_DIR = Path(__file__).resolve().parent / "slurm_lab"
LAB_UP = LAB_DIR / "up"
LAB_DOWN = LAB_DIR / "down"
EXIT_CANNOT_RUN = 77  # `up`: this machine cannot run the lab (not root, no namespaces, ...)
EXPORT_PREFIX = "export SLURM_CONF="
# `up` may have to apt-get install Slurm and MariaDB first on a fresh machine.
UP_TIMEOUT_S = 900
DOWN_TIMEOUT_S = 120

# Slurm states after which a job never runs again (sacct spelling; "CANCELLED by 0" -> "CANCELLED").
# Script code (needs os, signal, sys and types imported): die_in_shutdown() makes the process die
# of SIGABRT while Python shuts down, after every exit handler, as a torch C++ thread taking the GIL
# then makes it die (job.scriptrun's module doc).
DIE_IN_SHUTDOWN = """
class DiesInShutdown:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGABRT)


def die_in_shutdown():
    holder = types.ModuleType("holder")
    holder.obj = DiesInShutdown()
    sys.modules["holder"] = holder
"""

TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "slurm_env" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None:
            item.add_marker(pytest.mark.slurm)


def _lab_command_env() -> dict[str, str]:
    # Several sessions may share the lab; `down` stops it only when no live holder is left.
    return {**os.environ, "SLURMDDP_LAB_HOLDER": str(os.getpid())}


def _run_down() -> None:
    proc = subprocess.run(
        [str(LAB_DOWN)],
        env=_lab_command_env(),
        capture_output=True,
        text=True,
        timeout=DOWN_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        # A finalizer that raises would hide the test results; say it loudly instead.
        print(f"\n{LAB_DOWN} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")


@pytest.fixture(scope="session")
def slurm_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """os.environ plus SLURM_CONF pointing at the running lab cluster.

    Skips when the machine cannot run the lab (`up` exits 77), except under CI=true, where that
    fails. SLURMDDP_LAB_KEEP=1 leaves the cluster running after the session.
    """
    if os.environ.get("SLURMDDP_LAB_KEEP") != "1":
        request.addfinalizer(_run_down)  # also after a failed or half-finished `up`
    try:
        proc = subprocess.run(
            [str(LAB_UP)],
            env=_lab_command_env(),
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{LAB_UP} did not finish in {UP_TIMEOUT_S}s:\n{exc.stderr!r}", pytrace=False)
    if proc.returncode == EXIT_CANNOT_RUN:
        lines = proc.stderr.strip().splitlines()
        reason = lines[-1] if lines else f"{LAB_UP} exited {EXIT_CANNOT_RUN}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the Slurm lab, but: {reason}", pytrace=False)
        pytest.skip(reason)
    stdout_lines = proc.stdout.strip().splitlines()
    last = stdout_lines[-1] if stdout_lines else ""
    if proc.returncode != 0 or not last.startswith(EXPORT_PREFIX):
        pytest.fail(
            f"{LAB_UP} exited {proc.returncode}\n--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}",
            pytrace=False,
        )
    # Job variables of a surrounding allocation (pytest run inside a Slurm job) must not leak into
    # the sbatch/srun calls of the tests.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(lab_exports(last, env))
    return env


def lab_exports(line: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `up`'s last line: `export SLURM_CONF=...`, and for the 24.11 lab
    ` PATH=WRAPPERS:$PATH` (its client commands come first), `$PATH` meaning `env`'s."""
    names = dict(word.split("=", 1) for word in shlex.split(line.removeprefix("export ")))
    if "PATH" in names:
        names["PATH"] = names["PATH"].replace("$PATH", env.get("PATH", ""))
    return names


def wait_for_job(job_id: str, env: Mapping[str, str], timeout: float = 120.0, poll: float = 0.5) -> str:
    """Wait until Slurm job `job_id` has ended and return its final state from sacct.

    Polls `squeue -h -j ID` (not `sbatch -W`, which polls after 2, 8, then 32 s). A requeued job
    counts as running until its last run ends. The state is sacct's first word ("CANCELLED by 0"
    -> "CANCELLED"); for a whole array, the distinct task states joined by "," (pass "ID_N" for one
    task). Raises TimeoutError when the job is still queued or running after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"],
            env=dict(env),
            capture_output=True,
            text=True,
            check=False,
        )
        # Once the job is gone from slurmctld (MinJobAge), squeue says "Invalid job id" and fails.
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
            raise RuntimeError(f"squeue -j {job_id} failed: {proc.stderr.strip()}")
        states = proc.stdout.split() if proc.returncode == 0 else []
        if all(state in TERMINAL_STATES for state in states):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {sorted(set(states))} after {timeout:.0f}s")
        time.sleep(poll)

    # slurmctld sends the end record to slurmdbd asynchronously: sacct can lag a few seconds.
    final: list[str] = []
    sacct_deadline = time.monotonic() + 15.0
    while True:
        proc = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"],
            env=dict(env),
            capture_output=True,
            text=True,
            check=False,
        )
        final = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode == 0 and final and all(state in TERMINAL_STATES for state in final):
            return ",".join(sorted(set(final)))
        if time.monotonic() > sacct_deadline:
            raise TimeoutError(
                f"job {job_id} left the queue but sacct still says {final or proc.stderr.strip()!r}"
            )
        time.sleep(0.5)


@pytest.fixture
def slurm_wait(slurm_env: dict[str, str]) -> Callable[..., str]:
    """`slurm_wait(job_id, timeout=120.0) -> final state`, bound to the lab's environment."""

    def wait(job_id: str, timeout: float = 120.0) -> str:
        return wait_for_job(job_id, slurm_env, timeout=timeout)

    return wait


def wait_until(what: str, check: Callable[[], bool], timeout: float = 180) -> None:
    """Poll `check` until it is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def slurmddp(
    env: dict[str, str], cwd: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m slurmddp ARGS...` in `cwd` with `env`, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "slurmddp", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_dirs(out: Path) -> list[Path]:
    """The run directories under output_dir `out` (OUT/NAME/STAMP/manifest.json)."""
    return sorted(p.parent for p in out.glob("*/*/manifest.json"))


def only_run(out: Path) -> Path:
    dirs = run_dirs(out)
    assert len(dirs) == 1, dirs
    return dirs[0]


def mpi_library_error() -> str | None:
    """Why mpi4py cannot start MPI here, or None when it can."""
    proc = subprocess.run(
        [sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["no output"])[-1]


@pytest.fixture
def slurm_commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The Slurm commands slurmddp runs (e.g. the requeue decision's scontrol requeue), recorded
    instead of run; each answers with success and no output."""
    from slurmddp.cluster import slurm

    calls: list[list[str]] = []

    def fake_run(args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        return subprocess.CompletedProcess(list(args), 0, "", "")

    monkeypatch.setattr(slurm, "run", fake_run)
    return calls


def write_sweep(tmp_path: Path, sweep: str, extra: str = "") -> Path:
    """An experiment with a `train.py:main` beside it, `extra` YAML lines and the sweep `sweep`."""
    (tmp_path / "train.py").write_text("def main(ctx):\n    return {}\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"entrypoint: train.py:main\n{extra}train: {{lr: 0.1, width: 8, label: x}}\nsweep: {sweep}\n"
    )
    return exp


def local_rank_pids(run: Path) -> list[int]:
    """PIDs of the rank processes of `run` (started by this test's submission)."""
    logs = str(run / "logs").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in cmdline and logs in cmdline:
            pids.append(int(entry.name))
    return pids
