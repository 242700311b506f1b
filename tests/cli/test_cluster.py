"""The foundation on a real 3-node Slurm cluster, driven only through `python -m slurmddp`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICKSTART, ROOT, SYNTHETIC, only_run, run_dirs, slurmddp
from fake_sysfs import build_dgx_h100
from torchrun_module import PACKAGE, write_package

from slurmddp.cluster.generations import parse_version, shown

TORCHRUN = ROOT / "examples" / "torchrun_script.yaml"
STEPS = "train.steps=60"
# In float64 the only difference between 4 ranks and 1 process, the order of the gradient sums,
# stays far below the tolerance; float32 drifts to ~1e-4 in 60 steps.
FLOAT64 = "train.dtype=float64"

pytestmark = pytest.mark.slurm


def job_ranks(run_dir: Path, name: str = "ranks.json") -> list[dict[str, Any]]:
    ranks: list[dict[str, Any]] = json.loads((run_dir / name).read_text())["ranks"]
    return ranks


# One generation: the sums are torch's, not Slurm's; on 24.11 the same match (4 ranks in float64,
# one process) is test_training_cluster.py's test_four_ranks_in_float64_match_one_process.
@pytest.mark.lab_generation("22.05")
def test_synthetic_two_nodes_matches_single_process(slurm_env: dict[str, str], tmp_path: Path) -> None:
    import torch

    out = tmp_path / "multi"
    proc = slurmddp(
        slurm_env, tmp_path, "submit", str(SYNTHETIC), STEPS, FLOAT64, f"output_dir={out}", "--wait"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ended COMPLETED" in proc.stdout and "[rank 0] step 0 loss" in proc.stdout
    run = only_run(out)
    result = json.loads((run / "result.json").read_text())
    assert (result["world_size"], result["num_nodes"]) == (4, 2)
    assert len({r["param_sha256"] for r in result["ranks"]}) == 1, "ranks ended with different parameters"

    single_out = tmp_path / "single"
    proc = slurmddp(
        slurm_env,
        tmp_path,
        "submit",
        str(SYNTHETIC),
        STEPS,
        FLOAT64,
        f"output_dir={single_out}",
        "executor=local",
        "resources.nodes=1",
        "resources.tasks_per_node=1",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    single = torch.load(only_run(single_out) / "final_model.pt")
    multi = torch.load(run / "final_model.pt")
    for key, tensor in single.items():
        torch.testing.assert_close(multi[key], tensor, rtol=1e-9, atol=1e-10)


def test_torchrun_script_gets_the_rank_variables(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = slurmddp(slurm_env, tmp_path, "submit", str(TORCHRUN), f"output_dir={out}", "--wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = job_ranks(only_run(out))
    assert len(ranks) == 4
    hosts = [r["hostname"] for r in ranks]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    for seen in ranks:
        assert seen["RANK"] == seen["SLURM_PROCID"]
        assert seen["LOCAL_RANK"] == seen["SLURM_LOCALID"]
        assert seen["WORLD_SIZE"] == seen["SLURM_NTASKS"] == "4"
        assert seen["GROUP_RANK"] == seen["SLURM_NODEID"] and seen["LOCAL_WORLD_SIZE"] == "2"
        assert seen["MASTER_ADDR"] == hosts[0] and seen["MASTER_PORT"] == ranks[0]["MASTER_PORT"]
        assert seen["OMP_NUM_THREADS"] == "1" and seen["threads"] == 1


def test_module_entrypoint_runs_across_two_nodes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """`entrypoint.module` (torchrun -m): every rank runs `python -m ddpmod ARGS` from the submit
    directory, 2 nodes x 2 ranks, with torchrun's variables."""
    write_package(tmp_path)
    exp = tmp_path / "mod.yaml"
    exp.write_text(
        f"entrypoint: -m {PACKAGE} --tag 'on the lab' --n 2\n"
        "resources:\n  nodes: 2\n  tasks_per_node: 2\n  time: '00:10:00'\n"
    )
    out = tmp_path / "runs"
    proc = slurmddp(slurm_env, tmp_path, "submit", str(exp), f"output_dir={out}", "--wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = only_run(out)
    ranks = [json.loads((run / f"rank_{rank}.json").read_text()) for rank in range(4)]
    hosts = [seen["hostname"] for seen in ranks]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    for rank, seen in enumerate(ranks):
        assert (seen["rank"], seen["world_size"], seen["sum"]) == (rank, 4, 6.0)
        assert (seen["tag"], seen["n"]) == ("on the lab", 2)
        assert (seen["name"], seen["package"]) == ("__main__", PACKAGE)
        assert seen["cwd"] == seen["path0"] == str(tmp_path)
        assert seen["env"]["RANK"] == str(rank) and seen["env"]["MASTER_ADDR"] == hosts[0]


@pytest.mark.parametrize(
    ("binding", "visible", "devices"),
    [("node", ["0,1", "0,1"], ["cuda:0", "cuda:1"]), ("task", ["0", "1"], ["cuda:0", "cuda:0"])],
)
def test_fake_gpus_pick_the_right_device_and_fabric(
    slurm_env: dict[str, str], tmp_path: Path, binding: str, visible: list[str], devices: list[str]
) -> None:
    """Fake GPUs, and a fake DGX H100 sysfs that the ranks detect at job start on the node."""
    build_dgx_h100(tmp_path / "sys")
    env = {**slurm_env, "SLURMDDP_SYSFS": str(tmp_path / "sys")}
    out = tmp_path / "runs"
    proc = slurmddp(
        env,
        tmp_path,
        "submit",
        str(TORCHRUN),
        f"output_dir={out}",
        "resources.nodes=1",
        "resources.gpus_per_node=2",
        "resources.tasks_per_node=null",
        "resources.cpus_per_task=2",
        f"resources.gpu_binding={binding}",
        "--wait",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = job_ranks(only_run(out))
    assert [r["CUDA_VISIBLE_DEVICES"] for r in ranks] == visible
    assert [r["SLURMDDP_DEVICE"] for r in ranks] == devices
    assert {r["OMP_NUM_THREADS"] for r in ranks} == {"2"} and {r["threads"] for r in ranks} == {2}
    # The node's 7 active HCAs (mlx5_3 is down); no socket interface, since none of the tree's
    # interfaces exists in the node's network namespace.
    hcas = "=mlx5_0:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"
    assert {r["NCCL_IB_HCA"] for r in ranks} == {hcas}
    assert {r["NCCL_SOCKET_IFNAME"] for r in ranks} == {None}
    assert {r["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for r in ranks} == {"1"}
    assert "8 InfiniBand HCAs (7 active" in proc.stdout  # logged by the node's first rank


def test_dryrun_shows_the_script_that_is_submitted(
    slurm_env: dict[str, str], tmp_path: Path, slurm_wait: Callable[..., str]
) -> None:
    out = tmp_path / "runs"
    args = [str(SYNTHETIC), "train.steps=5", f"output_dir={out}"]
    dry = slurmddp(slurm_env, tmp_path, "dryrun", *args)
    assert dry.returncode == 0, dry.stderr
    dry_run_dir = dry.stdout.strip().splitlines()[-1].rsplit(" ", 1)[-1]
    assert run_dirs(out) == []
    proc = slurmddp(slurm_env, tmp_path, "submit", *args)
    assert proc.returncode == 0, proc.stderr
    run = only_run(out)
    manifest = json.loads((run / "manifest.json").read_text())
    submitted = (run / "logs" / f"{manifest['job_id']}_submission.sh").read_text()
    previewed = dry.stdout.split("# ---- batch script (sbatch) ----\n")[1].split("\n# ---- environment")[0]
    assert previewed.replace(dry_run_dir, "RUN").strip() == submitted.replace(str(run), "RUN").strip()
    # The release it was written for is the lab's own, and before 23.11 srun needs telling the CPUs.
    said = subprocess.run(["sbatch", "--version"], env=slurm_env, capture_output=True, text=True).stdout
    version = parse_version(said)
    assert (
        version is not None
        and f"# slurmddp: written for Slurm {shown(version)} (sbatch --version)" in dry.stdout
    )
    assert ("export SRUN_CPUS_PER_TASK" in submitted) == (version < (23, 11, 0))
    assert slurm_wait(manifest["job_id"]) == "COMPLETED"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("resources.partition=nosuch", "invalid partition"),
        # 8 nodes: the lab has 3, and 16 ranks split the quickstart's global batch of 64.
        ("resources.nodes=8", "node configuration"),
        ("resources.cpus_per_task=64", "node configuration"),
        ("resources.sbatch={bogus-option: 1}", "unrecognized option"),
    ],
)
def test_sbatch_refusal_is_shown_and_nothing_is_left(
    slurm_env: dict[str, str], tmp_path: Path, override: str, needle: str
) -> None:
    out = tmp_path / "runs"
    proc = slurmddp(slurm_env, tmp_path, "submit", str(QUICKSTART), override, f"output_dir={out}")
    assert proc.returncode == 2
    assert "sbatch refused the job" in proc.stderr and needle in proc.stderr.lower()
    assert "Traceback" not in proc.stderr
    assert run_dirs(out) == [] and not any(out.glob("*/*"))


def test_hostile_strings_are_inert_on_a_real_submission(slurm_env: dict[str, str], tmp_path: Path) -> None:
    pwn = tmp_path / "pwned"
    hostile = f"$(touch {pwn}) `touch {pwn}` 'q' \"dq\" ;touch {pwn}; a b"
    out = tmp_path / f"runs {hostile}"
    # A file name cannot hold '/': the same tricks with a relative target, which the ranks would
    # create in their working directory, tmp_path.
    target = tmp_path / "ranks $(touch pwned) `touch pwned` 'q' \"dq\" ;touch pwned; a b.json"
    proc = slurmddp(
        slurm_env,
        tmp_path,
        "submit",
        str(TORCHRUN),
        "resources.nodes=1",
        f"output_dir={json.dumps(str(out))}",
        f"resources.comment={json.dumps(hostile)}",
        f"train.note={json.dumps(hostile)}",
        f"entrypoint.args={json.dumps(['--out', str(target), '--steps', '2'])}",
        "--wait",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not pwn.exists() and not (tmp_path / "pwned").exists(), "a hostile value was executed"
    assert len(json.loads(target.read_text())["ranks"]) == 2  # the argument arrived intact
