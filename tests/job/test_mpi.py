"""The MPI launcher: which launcher a rank follows (pure), the bad-input errors, and a real 4-rank
DDP job under mpiexec (MPICH from the `mpich` package of the dev extra)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, mpi_library_error

from slurmddp.errors import ConfigError, DistEnvError
from slurmddp.experiment.load import load_experiment
from slurmddp.job.process import mpi
from slurmddp.submit.plan import slurm_parameters

SLURM_2X2 = {
    "SLURM_JOB_ID": "42",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}


def mpiexec() -> str | None:
    # pip puts the mpich package's mpiexec beside the interpreter, which need not be on PATH.
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.is_file() else shutil.which("mpiexec")


@pytest.mark.parametrize(
    ("launcher", "env", "expected"),
    [
        ("auto", {}, "env"),
        ("auto", SLURM_2X2, "env"),
        # srun --mpi=pmi2: Slurm and MPI describe the same world; Slurm's variables suffice.
        ("auto", {**SLURM_2X2, "PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "9"}, "env"),
        # mpiexec outside Slurm (MPICH's hydra; Open MPI).
        ("auto", {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}, "mpi"),
        ("auto", {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "mpi"),
        # mpiexec inside an allocation: the ranks inherit the variables of the one srun task that
        # started hydra's proxy, which do not describe MPI's world.
        ("auto", {**SLURM_2X2, "SLURM_NTASKS": "1", "PMI_RANK": "5", "PMI_SIZE": "8"}, "mpi"),
        ("auto", {"SUBMITIT_EXECUTOR": "local", "PMI_RANK": "0", "PMI_SIZE": "2"}, "env"),
        ("slurm", {"PMI_RANK": "0", "PMI_SIZE": "4"}, "env"),
        ("mpi", SLURM_2X2, "mpi"),
    ],
)
def test_which_launcher_a_rank_follows(launcher: str, env: dict[str, str], expected: str) -> None:
    assert mpi.choose(launcher, env) == expected


def test_rendezvous_address_follows_the_socket_interface() -> None:
    assert mpi.rendezvous_address({"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1"
    assert mpi.rendezvous_address({"NCCL_SOCKET_IFNAME": "lo,eth0"}) == "127.0.0.1"
    # NCCL's exclusion and exact-match syntax name no single interface: fall back to the host name.
    import socket

    by_name = socket.gethostbyname(socket.gethostname())
    assert mpi.rendezvous_address({"NCCL_SOCKET_IFNAME": "^docker"}) == by_name
    assert mpi.rendezvous_address({"GLOO_SOCKET_IFNAME": "nosuch0"}) == by_name


def test_free_port_is_bindable() -> None:
    import socket

    port = mpi.free_port()
    with socket.socket() as probe:
        probe.bind(("", port))


def test_launcher_mpi_without_mpi4py_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a)
    )
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: train.py:main\n")
    with pytest.raises(
        ConfigError, match=r"override 'dist.launcher=mpi': mpi needs mpi4py.*pip install 'slurmddp\[mpi\]'"
    ):
        load_experiment(exp, ["dist.launcher=mpi"])
    assert load_experiment(exp, ["dist.launcher=slurm"]).experiment.dist.launcher == "slurm"
    with pytest.raises(DistEnvError, match="cannot import mpi4py"):
        mpi.mpi()
    with pytest.raises(ConfigError, match=r"dist\.launcher: 'mpich' is not one of auto, slurm, mpi"):
        load_experiment(exp, ["dist.launcher=mpich"])


def test_launcher_mpi_adds_the_srun_mpi_plugin(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: train.py:main\n")
    launched = load_experiment(exp, ["dist.launcher=mpi"]).experiment
    assert slurm_parameters(launched, tmp_path, "python")["srun_args"] == [
        "--kill-on-bad-exit=1",
        "--overlap",
        "--mpi=pmi2",
    ]
    plain = load_experiment(exp).experiment
    assert slurm_parameters(plain, tmp_path, "python")["srun_args"] == ["--kill-on-bad-exit=1", "--overlap"]


def test_mpiexec_runs_a_four_rank_ddp_job(tmp_path: Path) -> None:
    launcher = mpiexec()
    if launcher is None:
        pytest.skip("no mpiexec: install the dev extra (it brings the mpich package)")
    problem = mpi_library_error()
    if problem is not None:
        pytest.skip(f"mpi4py cannot load an MPI library: {problem}")
    out = tmp_path / "runs"
    proc = subprocess.run(
        [
            launcher,
            "-n",
            "4",
            sys.executable,
            "-m",
            "slurmddp",
            "mpilaunch",
            str(ROOT / "examples" / "synthetic.yaml"),
            "train.steps=10",
            f"output_dir={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "slurmddp: ranks from MPI (MPICH" in proc.stdout and ": 4 on 1 node(s)" in proc.stdout
    assert "slurmddp: preflight ok" in proc.stdout
    (found,) = out.glob("synthetic/*/result.json")
    result = json.loads(found.read_text())
    assert result["world_size"] == 4 and len(result["ranks"]) == 4
    assert len({r["param_sha256"] for r in result["ranks"]}) == 1, "ranks ended with different parameters"


def test_mpich_with_ofi_handshakes_over_it_unless_told_otherwise() -> None:
    # MPI_Get_library_version of the pip MPICH 5.0.2 wheel (first lines).
    pip_mpich = (
        "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\n"
        "MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n"
    )
    assert mpi.library_env(pip_mpich, {}) == {"MPIR_CVAR_CH4_NETMOD": "ofi"}
    assert mpi.library_env(pip_mpich, {"MPIR_CVAR_CH4_NETMOD": "ucx"}) == {}
    assert mpi.library_env("MPICH Version: 4.1\nMPICH Device: ch4:ucx\n", {}) == {}
    assert mpi.library_env("Open MPI v5.0.5, package: Open MPI ...", {}) == {}
