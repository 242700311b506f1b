"""`init`: a starter that runs as written, a cluster profile guessed from what Slurm says, no file
overwritten, and the starter inside a built wheel."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, slurmddp
from slurm_samples import LAB

from slurmddp.cli.main import main
from slurmddp.cluster.slurm import Partition, gres_gpus, parse_partitions
from slurmddp.experiment import starter
from slurmddp.experiment.load import load_experiment

# `sinfo -h -o "%P|%G|%c"` of a cluster with a default GPU partition and a CPU one.
SINFO = "gpu*|gpu:a100:4(S:0-1)|64\ndebug|(null)|8\n"


def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools: dict[str, str]) -> None:
    """Only `tools` (name -> shell lines) on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in tools.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_sinfo_partitions_and_their_gpus_are_read() -> None:
    assert parse_partitions(SINFO) == [Partition("gpu", True, 4, 64), Partition("debug", False, 0, 8)]
    assert [gres_gpus(g) for g in ("gpu:8", "gpu:h100:8(S:0-1),shard:8", "shard:8", "(null)")] == [8, 8, 0, 0]


def test_without_slurm_init_writes_the_starter_and_refuses_to_overwrite_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: nothing to guess from
    target = tmp_path / "proj"
    assert main(["init", str(target)]) == 0
    assert sorted(p.name for p in target.iterdir()) == ["experiment.yaml", "train.py"]
    assert (target / "train.py").read_text() == (ROOT / "templates" / "train.py").read_text()
    assert "no Slurm here: the experiment runs its ranks on this machine" in capsys.readouterr().out
    (target / "train.py").write_text("mine")
    assert main(["init", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"slurmddp: error: init: {target / 'experiment.yaml'}, {target / 'train.py'} already exist; "
        "move them away or choose another directory\n"
    )
    assert (target / "train.py").read_text() == "mine"


def test_a_guessed_gpu_profile_is_what_the_starter_experiment_loads(tmp_path: Path) -> None:
    cluster = starter.guess(
        {"ClusterName": "big lab"}, parse_partitions(SINFO), "InfiniBand: mlx5_0 (active, 200 Gb/s)"
    )
    assert cluster == starter.ClusterGuess("big-lab", "gpu", 4, 16, "InfiniBand: mlx5_0 (active, 200 Gb/s)")
    files = starter.starter_files(cluster)
    assert sorted(files) == ["configs/big-lab.yaml", "experiment.yaml", "train.py"]
    assert "tasks_per_node" not in files["experiment.yaml"]
    starter.write(tmp_path, files)
    exp = load_experiment(tmp_path / "experiment.yaml", []).experiment
    assert exp.profile == "big-lab"
    res = exp.resources
    assert (res.partition, res.gpus_per_node, res.cpus_per_task, res.world_size) == ("gpu", 4, 16, 4)
    assert "this login node has: InfiniBand: mlx5_0" in files["configs/big-lab.yaml"]


def test_a_cpu_cluster_keeps_the_starters_cpu_ranks(tmp_path: Path) -> None:
    cluster = starter.guess({}, parse_partitions("debug|(null)|8\n"), "Ethernet up: eth0")
    assert cluster == starter.ClusterGuess("cluster", "debug", 0, 1, "Ethernet up: eth0")
    starter.write(tmp_path, starter.starter_files(cluster))
    res = load_experiment(tmp_path / "experiment.yaml", []).experiment.resources
    assert (res.partition, res.gpus_per_node, res.world_size) == ("debug", 0, 2)


@pytest.mark.process  # the fake scontrol and sinfo
def test_init_guesses_the_profile_from_scontrol_and_sinfo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cat = shutil.which("cat")
    (tmp_path / "config.txt").write_text(LAB)
    (tmp_path / "sinfo.txt").write_text(SINFO)
    fake_tools(
        tmp_path,
        monkeypatch,
        {
            "scontrol": f'case "$1" in ping) echo "Slurmctld(primary) at ctl is UP";; '
            f"show) {cat} {tmp_path}/config.txt;; esac",
            "sinfo": f"{cat} {tmp_path}/sinfo.txt",
        },
    )
    assert main(["init", str(tmp_path / "proj")]) == 0
    said = capsys.readouterr().out
    assert "guessed the profile slurmddp: partition gpu, 4 GPUs per node; check it before submitting" in said
    res = load_experiment(tmp_path / "proj" / "experiment.yaml", []).experiment.resources
    assert (res.partition, res.gpus_per_node) == ("gpu", 4)


def test_the_starter_runs_locally_as_written(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # no Slurm: the local starter
    init = slurmddp(env, tmp_path, "init", "proj")
    assert init.returncode == 0, init.stderr
    run = slurmddp(
        env,
        tmp_path,
        "submit",
        "proj/experiment.yaml",
        "executor=local",
        "train.epochs=1",
        f"output_dir={tmp_path / 'runs'}",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ended COMPLETED" in run.stdout
    logs = list((tmp_path / "runs").glob("experiment/*/logs/*_log.*"))
    assert len(logs) == 4  # out and err of each rank
    # submitit's runner logs at WARNING in a rank: its INFO lines said nothing a user needs.
    assert not [log for log in logs if "submitit INFO" in log.read_text()]


def test_a_built_wheel_holds_the_starter(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "templates", source / "templates")
    shutil.copytree(ROOT / "slurmddp", source / "slurmddp", symlinks=True)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", "dist", "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (source / "dist").glob("slurmddp-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for name, stored in (("experiment.yaml", "experiment.yaml"), ("train.py", "train.py.txt")):
            held = archive.read(f"slurmddp/starter/{stored}").decode()
            assert held == (ROOT / "templates" / name).read_text()
