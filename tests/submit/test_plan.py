"""Plans and the batch scripts rendered from them: exact, parseable, and inert to hostile values."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT
from train_sources import write_main

from slurmddp.cli.dryrun import rank_env
from slurmddp.defaults import TASK_IDS_FROM_HOST_ENV, RunExecutor
from slurmddp.errors import ConfigError
from slurmddp.experiment.load import load_experiment
from slurmddp.experiment.schema import Telemetry, Trackers
from slurmddp.manage.actions import last_save_seconds
from slurmddp.manage.signal_lead import short_lead_warning
from slurmddp.rundir.layout import new_run_dir
from slurmddp.submit.plan import SubmissionPlan, build, resident

HOSTILE = "$(touch {pwn}) `touch {pwn}` 'q' \"dq\" ;touch {pwn}; a b"


def make_plan(
    exp: Path, overrides: list[str], run_dir: Path, executor: RunExecutor = "slurm"
) -> SubmissionPlan:
    loaded = load_experiment(exp, overrides)
    return build(loaded, executor=executor, workdir=ROOT, run_dir=run_dir, interpreter="python3")


def test_quickstart_slurm_plan(tmp_path: Path) -> None:
    plan = make_plan(QUICKSTART, [], tmp_path / "run")
    assert plan.world_size == 4
    params = plan.parameters
    assert (params["nodes"], params["ntasks_per_node"], params["time"]) == (2, 2, 10)
    assert "gpus_per_node" not in params and params["srun_args"] == ["--kill-on-bad-exit=1", "--overlap"]
    assert plan.rank.function == f"{ROOT / 'examples' / 'quickstart_train.py'}:train"
    assert plan.rank.env == {"OMP_NUM_THREADS": "1"}
    script = plan.batch_script()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script
    assert f"-m submitit.core._submit {tmp_path / 'run' / 'logs'}" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        (["resources.gpus_per_node=2", "resources.tasks_per_node=null"], "#SBATCH --gpus-per-node=2"),
        (
            ["resources.gpus_per_node=2", "resources.tasks_per_node=null", "resources.gpu_binding=task"],
            "#SBATCH --gpus-per-task=1",
        ),
    ],
)
def test_gpu_bindings(tmp_path: Path, overrides: list[str], flag: str) -> None:
    plan = make_plan(QUICKSTART, overrides, tmp_path)
    script = plan.batch_script()
    assert flag in script and "#SBATCH --ntasks-per-node=2" in script
    last = rank_env(plan, plan.world_size - 1)
    expected = "cuda:0" if "task" in flag else "cuda:1"
    assert last["SLURMDDP_DEVICE"] == expected and last["LOCAL_RANK"] == "1"


def test_resources_reach_the_script(tmp_path: Path) -> None:
    overrides = [
        "resources.partition=debug",
        "resources.account=proj",
        "resources.mem_gb=1.5",
        "resources.time=1-00:00:30",
        "resources.sbatch={mail-type: END, exclusive: true}",
        "resources.setup=['module load cuda', 'echo ready']",
        "fabric.env={NCCL_DEBUG: INFO}",
    ]
    plan = make_plan(QUICKSTART, overrides, tmp_path)
    script = plan.batch_script()
    for line in (
        "--partition=debug",
        "--account=proj",
        "--mem=1536MB",
        "--time=1441",
        "--mail-type=END",
        "--exclusive\n",
        "\nmodule load cuda\necho ready\n",
    ):
        assert line in script, line
    assert plan.rank.env["NCCL_DEBUG"] == "INFO"


def test_hostile_values_stay_inert_when_the_script_runs(tmp_path: Path) -> None:
    """Run the rendered script under bash with a recording `srun`: the injections must not fire."""
    pwn = tmp_path / "pwned"
    hostile = HOSTILE.format(pwn=pwn)
    out_dir = tmp_path / f"out {hostile}"
    overrides = [
        f"output_dir={json.dumps(str(out_dir))}",
        f"resources.comment={json.dumps(hostile)}",
        f"resources.sbatch={{mail-user: {json.dumps(hostile)}}}",
        f"train.note={json.dumps(hostile)}",
    ]
    loaded = load_experiment(QUICKSTART, overrides)
    run_dir = new_run_dir(loaded.experiment.output_dir, loaded.experiment.name)
    plan = build(loaded, executor="slurm", workdir=ROOT, run_dir=run_dir, interpreter="python3")
    script = plan.batch_script()
    run_dir.mkdir(parents=True)  # as submit() does; the script's attempt records go there
    (run_dir / "config.yaml").write_text("requeue: {}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "srun-argv.json"
    fake_srun = bin_dir / "srun"
    fake_srun.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
    )
    fake_srun.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", script], env=env, check=True, cwd=tmp_path)
    assert not pwn.exists()
    argv = json.loads(record.read_text())
    assert argv[-1] == str(run_dir / "logs")  # the hostile path arrives as one intact argument
    assert argv[argv.index("--output") + 1] == str(run_dir / "logs" / "%j_%t_log.out")
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [(r["event"], r.get("reason")) for r in records] == [("begin", None), ("end", "completed")]


def test_local_plan_notes(tmp_path: Path) -> None:
    plan = make_plan(
        QUICKSTART, ["resources.gpus_per_node=2", "resources.tasks_per_node=null"], tmp_path, "local"
    )
    assert plan.parameters == {
        "tasks_per_node": 4,
        "timeout_min": 10,
        "gpus_per_node": 0,
        "signal_delay_s": 120,
    }
    assert any("ignored by the local executor" in note for note in plan.notes)
    env = rank_env(plan, 3)
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["WORLD_SIZE"] == "4" and "SLURMDDP_DEVICE" not in env


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\nfrom slurmddp.cli.main import main\ncode = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules, 'the submit path imported torch'\nraise SystemExit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd)


def test_the_rank_gets_typed_sections_in_a_pickle_that_loads_without_torch(tmp_path: Path) -> None:
    overrides = [
        "checkpoint.keep_last=3",
        "ddp.accumulate=2",
        "telemetry.every_s=5",
        "trackers.tensorboard=false",
    ]
    spec = make_plan(QUICKSTART, overrides, tmp_path / "run").rank
    settings = spec.settings
    assert (settings.name, settings.checkpoint.keep_last, settings.ddp.accumulate) == ("quickstart", 3, 2)
    assert settings.telemetry == Telemetry(every_s=5) and settings.trackers == Trackers(tensorboard=False)
    assert spec.config["checkpoint"]["keep_last"] == 3, "ctx.config is still the resolved experiment"
    loads = (
        "import pickle, sys\n"
        "spec = pickle.loads(sys.stdin.buffer.read())\n"
        "assert 'torch' not in sys.modules, 'unpickling a RankSpec imported torch'\n"
        "print(type(spec.settings.checkpoint).__name__, spec.settings.checkpoint.keep_last)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", loads], input=pickle.dumps(spec), capture_output=True, check=True, timeout=60
    )
    assert proc.stdout.decode().split() == ["Checkpoint", "3"]


def test_dryrun_prints_script_and_envs_without_torch(tmp_path: Path) -> None:
    proc = run_cli("dryrun", str(QUICKSTART), "executor=slurm", f"output_dir={tmp_path}", cwd=tmp_path)
    if "no sbatch on PATH" in proc.stderr:
        pytest.skip("dryrun of a Slurm plan needs sbatch on PATH")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout
    assert "environment of rank 0" in proc.stdout and "environment of rank 3" in proc.stdout
    assert "RANK=3\n" in proc.stdout and "MASTER_ADDR=node1\n" in proc.stdout
    assert not any(tmp_path.iterdir()), "dryrun created files"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("resources: [\n", "malformed YAML"),
        ("entrypoint: nowhere_module:main\n", "cannot find module 'nowhere_module'"),
        ("entrypoint: missing_file.py:main\n", "no file 'missing_file.py'"),
        ("entrypoint: train.py:mian\n", "did you mean 'main'"),
        ("entrypoint: broken.py:main\n", "syntax error"),
    ],
)
def test_bad_input_is_a_message_not_a_traceback(tmp_path: Path, text: str, needle: str) -> None:
    write_main(tmp_path)
    (tmp_path / "broken.py").write_text("def main(ctx)\n    return {}\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text(text + "executor: local\n")
    proc = run_cli("submit", str(exp), f"output_dir={tmp_path / 'runs'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists(), "a refused submission left a run directory"


def test_entrypoint_is_checked_without_running_it(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('package executed')\n")
    (tmp_path / "pkg" / "train.py").write_text(
        "import torch\nraise SystemExit('module executed')\ndef main(c): ...\n"
    )
    exp = tmp_path / "exp.yaml"
    exp.write_text("entrypoint: pkg.train:main\nexecutor: local\n")
    proc = run_cli("dryrun", str(exp), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "executed" not in proc.stdout + proc.stderr


def test_short_signal_lead_is_warned_at_submit(tmp_path: Path) -> None:
    earlier = tmp_path / "quickstart" / "20260101-000000-abcd"
    earlier.mkdir(parents=True)
    (earlier / "progress.json").write_text(json.dumps({"step": 9, "last_save_s": 70.0}))
    assert last_save_seconds(tmp_path, "quickstart") == 70.0
    for lead, warned in ((120, True), (200, False)):
        loaded = load_experiment(QUICKSTART, [f"output_dir={tmp_path}", f"requeue.signal_lead_s={lead}"])
        plan = build(loaded, executor="slurm", workdir=ROOT, run_dir=tmp_path / "new", interpreter="python3")
        assert ("took 70.0 s to save" in (short_lead_warning(plan, loaded.experiment) or "")) is warned


@pytest.mark.parametrize("profile", sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")))
def test_shipped_profiles_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str) -> None:
    monkeypatch.setenv("SLURM_ACCOUNT", "proj")
    overrides = [f"profile={ROOT / 'configs' / profile}.yaml", "resources.tasks_per_node=null"]
    exp = load_experiment(QUICKSTART, overrides).experiment
    assert exp.resources.partition is not None


def test_starter_template_plans(tmp_path: Path) -> None:
    plan = make_plan(ROOT / "templates" / "experiment.yaml", [], tmp_path, "local")
    assert plan.rank.function == f"{ROOT / 'templates' / 'train.py'}:main" and plan.world_size == 2


def test_a_container_is_refused_for_the_local_executor(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"container\.image: nvcr\.io#x:1 is for Slurm's nodes"):
        make_plan(QUICKSTART, ["container.image=nvcr.io#x:1"], tmp_path / "run", executor="local")
    plan = make_plan(QUICKSTART, ["container.image=nvcr.io#x:1"], tmp_path / "run")
    assert plan.containers == ("pyxis",) and "--container-image=nvcr.io#x:1" in plan.parameters["srun_args"]
    assert plan.python.startswith("python3 -u -m slurmddp.job.launch.boot")


def test_an_oci_bundle_on_slurm_22_05_takes_one_rank_per_node(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    run_dir = tmp_path / "run"
    mounts = [{"destination": str(p), "source": str(p), "type": "bind"} for p in (run_dir, ROOT)]
    (bundle / "config.json").write_text(json.dumps({"mounts": mounts}))

    def plan(version: tuple[int, int, int], *overrides: str) -> SubmissionPlan:
        loaded = load_experiment(QUICKSTART, [f"container.image={bundle}", *overrides])
        return build(
            loaded,
            executor="slurm",
            workdir=ROOT,
            run_dir=run_dir,
            interpreter="python3",
            slurm_version=version,
        )

    with pytest.raises(ConfigError, match=r"Slurm 22\.05\.8 runs one task per node in an OCI bundle"):
        plan((22, 5, 8))
    one = plan((22, 5, 8), "resources.tasks_per_node=1")
    assert one.containers == ("oci",) and f"--container={bundle}" in one.parameters["srun_args"]
    assert (
        f"--export=ALL,SLURMDDP_SUBMITTED_WITH=0.1.0,{TASK_IDS_FROM_HOST_ENV}=1"
        in one.parameters["srun_args"]
    )
    newer = plan((24, 11, 5))
    assert newer.containers == ("oci",) and not any(
        TASK_IDS_FROM_HOST_ENV in a for a in newer.parameters["srun_args"]
    )


def test_the_batch_script_sets_snapshots_up_only_for_a_training_function_that_takes_them() -> None:
    from slurmddp.submit.plan import snapshot_dir

    def of(*overrides: str) -> str | None:
        return snapshot_dir(load_experiment(QUICKSTART, list(overrides)).experiment)

    assert of() == "/dev/shm"  # on by default
    assert of("checkpoint.snapshot_every_steps=0") is None
    assert of("checkpoint.snapshot_every_steps=5", "checkpoint.snapshot_dir=/tmp/mem") == "/tmp/mem"
    # A script's framework saves its own way: no folder, no task to remove it.
    script = ("entrypoint.function=null", "entrypoint.script=quickstart_train.py")
    assert of(*script, "checkpoint.snapshot_every_steps=5") is None


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), True),
        (("dist.launcher=mpi",), False),
        (("requeue.resident_launcher=false",), False),
        (("requeue.resident_launcher=true",), True),
    ],
)
def test_the_resident_launcher_is_on_unless_mpi_starts_the_ranks_or_it_is_turned_off(
    overrides: tuple[str, ...], expected: bool
) -> None:
    assert resident(load_experiment(QUICKSTART, overrides).experiment) is expected


def test_a_resident_task_imports_what_its_rank_would_import_first(tmp_path: Path) -> None:
    """A function's rank steps an optimizer (torch._dynamo); a script's rank only hosts the store
    (torch) while the script imports its own in a process of its own."""

    def imported(*overrides: str) -> list[str]:
        loaded = load_experiment(QUICKSTART, [f"output_dir={tmp_path}", *overrides])
        run_dir = new_run_dir(loaded.experiment.output_dir, loaded.experiment.name)
        script = build(loaded, executor="slurm", workdir=ROOT, run_dir=run_dir, interpreter="python3")
        return [line for line in script.batch_script().splitlines() if "SLURMDDP_RESIDENT_IMPORT" in line]

    assert imported() == ["export SLURMDDP_RESIDENT_IMPORT=torch._dynamo"]
    assert imported("entrypoint.function=null", "entrypoint.script=torchrun_script.py") == [
        "export SLURMDDP_RESIDENT_IMPORT=torch"
    ]
    assert imported("requeue.resident_launcher=false") == []


@pytest.mark.parametrize("resident_launcher", ["null", "false"])
def test_the_ranks_variables_torch_reads_at_import_are_exported_before_a_resident_task_imports_it(
    tmp_path: Path, resident_launcher: str
) -> None:
    """A resident task imports torch before it forks a rank: TORCHDYNAMO_* and OMP_NUM_THREADS
    must be in its environment already. Without the launcher, the rank sets them itself."""
    overrides = [
        f"output_dir={tmp_path}",
        "fabric.env={TORCHDYNAMO_VERBOSE: '1'}",
        "resources.cpus_per_task=3",
        f"requeue.resident_launcher={resident_launcher}",
    ]
    loaded = load_experiment(QUICKSTART, overrides)
    run_dir = new_run_dir(loaded.experiment.output_dir, loaded.experiment.name)
    script = build(
        loaded, executor="slurm", workdir=ROOT, run_dir=run_dir, interpreter="python3"
    ).batch_script()
    exported = {"export TORCHDYNAMO_VERBOSE=1", "export OMP_NUM_THREADS=3"} <= set(script.splitlines())
    assert exported is (resident_launcher == "null"), script
