"""A local run fits the machine it runs on: one rank per GPU with nccl where the machine has a GPU
for each rank (found without torch: the NVIDIA driver's /proc entries and CUDA_VISIBLE_DEVICES),
CPU ranks with gloo exactly as before where it has none, and a warning on stderr before the run
starts when its ranks outnumber the cores. Fake /proc trees and core counts play the machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT

from slurmddp.cli.dryrun import rank_env
from slurmddp.defaults import RunExecutor
from slurmddp.experiment.load import load_experiment
from slurmddp.job.process import distenv
from slurmddp.submit import prepare
from slurmddp.submit.plan import LocalMachine, SubmissionPlan, build

ONE_RANK = ["resources.nodes=1", "resources.tasks_per_node=1"]
TWO_RANKS = ["resources.nodes=1", "resources.tasks_per_node=2"]


def plan(
    overrides: list[str], machine: LocalMachine, tmp_path: Path, executor: RunExecutor = "local"
) -> SubmissionPlan:
    loaded = load_experiment(QUICKSTART, overrides)
    return build(
        loaded, executor=executor, workdir=ROOT, run_dir=tmp_path, interpreter="python3", machine=machine
    )


@pytest.mark.parametrize(
    ("present", "visible", "gpus"),
    [
        (2, None, (0, 1)),
        (0, None, ()),
        (2, "", ()),  # hidden on purpose: CPU ranks
        (4, "2,3", (2, 3)),
        (4, " 1 , 0 ", (1, 0)),
        (2, "0,5,1", (0,)),  # as CUDA: the devices before the first one that does not exist
        (2, "GPU-8a1c2f3e-0000", ()),  # a UUID names no index the local executor can hand on
        (0, "0", ()),
    ],
)
def test_the_gpus_a_local_run_may_use(present: int, visible: str | None, gpus: tuple[int, ...]) -> None:
    assert prepare.visible_gpus(present, visible) == gpus


def test_the_gpus_are_counted_from_the_nvidia_driver(tmp_path: Path) -> None:
    driver = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    assert prepare.machine_gpus(driver, {}) == ()
    for bus in ("0000:19:00.0", "0000:3b:00.0"):
        (driver / bus).mkdir(parents=True)
    assert prepare.machine_gpus(driver, {}) == (0, 1)
    assert prepare.machine_gpus(driver, {"CUDA_VISIBLE_DEVICES": "1"}) == (1,)


def test_a_gpu_for_each_rank_runs_one_rank_per_gpu_with_nccl(tmp_path: Path) -> None:
    two = plan(TWO_RANKS, LocalMachine(gpus=(2, 3, 5)), tmp_path)
    assert two.parameters == {
        "tasks_per_node": 2,
        "timeout_min": 10,
        "gpus_per_node": 2,
        "visible_gpus": (2, 3),
        "signal_delay_s": 120,
    }
    assert two.notes[0] == "running 2 ranks on this machine, one per GPU (GPUs 2,3) with nccl (no Slurm)"
    env = rank_env(two, 1)
    assert env["SLURMDDP_DEVICE"] == "cuda:1" and env["WORLD_SIZE"] == "2"


def test_fewer_gpus_than_ranks_keep_the_cpu_and_say_how_to_use_them(tmp_path: Path) -> None:
    cpu = plan([], LocalMachine(gpus=(0,)), tmp_path)
    assert cpu.parameters["gpus_per_node"] == 0 and "visible_gpus" not in cpu.parameters
    assert cpu.notes[:2] == (
        "running 4 ranks on this machine with gloo (no Slurm)",
        "this machine has 1 GPU for 4 ranks: they run on the CPU; resources.nodes=1 "
        "resources.tasks_per_node=1 runs one rank per GPU",
    )
    assert "SLURMDDP_DEVICE" not in rank_env(cpu, 3)
    gpu_job = plan(
        ["resources.gpus_per_node=2", "resources.tasks_per_node=null"], LocalMachine(gpus=(0,)), tmp_path
    )
    assert "resources.nodes=1 resources.gpus_per_node=1 runs one rank per GPU" in gpu_job.notes[1]


def test_a_machine_without_gpus_plans_as_before(tmp_path: Path) -> None:
    cpu = plan(["resources.gpus_per_node=2", "resources.tasks_per_node=null"], LocalMachine(), tmp_path)
    assert cpu.parameters == {
        "tasks_per_node": 4,
        "timeout_min": 10,
        "gpus_per_node": 0,
        "signal_delay_s": 120,
    }
    assert cpu.notes == (
        "running 4 ranks on this machine with gloo (no Slurm)",
        "resources.gpus_per_node is ignored by the local executor: ranks run on the CPU",
    )
    assert cpu.warnings == ()


@pytest.mark.parametrize(
    ("visible", "local_rank", "device"),
    [("", 0, None), ("0,1", 1, 1), ("0", 0, 0)],
)
def test_a_local_rank_drives_the_gpu_at_its_local_rank(
    visible: str, local_rank: int, device: int | None
) -> None:
    # What submitit's local controller sets: CUDA_VISIBLE_DEVICES="" for a run without GPUs.
    env = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_GLOBALID": str(local_rank),
        "SUBMITIT_LOCAL_LOCALID": str(local_rank),
        "SUBMITIT_LOCAL_JOB_ID": "4242",
        "CUDA_VISIBLE_DEVICES": visible,
    }
    dist = distenv.from_environment(env)
    assert dist.device_index == device
    assert dist.backend == ("gloo" if device is None else "nccl")


def test_more_local_ranks_than_cores_are_noted_and_twice_as_many_warned_about(tmp_path: Path) -> None:
    # The quickstart's 4 ranks on 2 cores (the README's first command on a small laptop): a note.
    shared = plan([], LocalMachine(cores=2), tmp_path)
    assert shared.warnings == ()
    assert (
        "the 4 ranks share this machine's 2 cores: each step takes longer than with a core a rank, "
        "and the results are the same"
    ) in shared.notes
    crowded = plan([], LocalMachine(cores=1), tmp_path)
    assert crowded.warnings == (
        "4 local ranks on 1 core: each rank, and each of its DataLoader workers, wants a core of its "
        "own, so they slow each other down; run at most 1 rank (resources.nodes=1 "
        "resources.tasks_per_node=1) or give each rank fewer loader workers",
    )
    assert not any("share" in note for note in crowded.notes)
    for roomy in (plan([], LocalMachine(cores=4), tmp_path), plan([], LocalMachine(cores=None), tmp_path)):
        assert roomy.warnings == () and not any("share" in note for note in roomy.notes)
    assert plan([], LocalMachine(cores=1), tmp_path, "slurm").warnings == ()


def test_the_warning_is_one_line_on_stderr_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm: auto is local
    monkeypatch.setattr(prepare, "this_machine", lambda: LocalMachine(cores=1))
    loaded = load_experiment(QUICKSTART, [])
    prepare.plan_for(loaded, run_dir=tmp_path / "run")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("slurmddp: warning: 4 local ranks on 1 core:")
    # A sweep's elements are planned again one by one, with the executor named: said once only.
    prepare.plan_for(loaded, executor="local", run_dir=tmp_path / "element")
    assert capsys.readouterr().err == ""
