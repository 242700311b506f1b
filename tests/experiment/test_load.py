"""The experiment loader: layering, shorthands, and an error that names file, key and fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmddp.errors import ConfigError
from slurmddp.experiment.load import load_experiment

BASE = """\
entrypoint: pkg.train:main
resources:
  nodes: 2
  tasks_per_node: 2
train:
  lr: 0.1
  layers: [1, 2]
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_experiment(path, overrides or [])
    return str(info.value)


def test_defaults_overrides_and_name_from_file(tmp_path: Path) -> None:
    loaded = load_experiment(write(tmp_path, BASE), ["lr=0.5", "resources.nodes=3", "train.new=x"])
    exp = loaded.experiment
    assert exp.name == "exp"
    assert exp.resources.nodes == 3 and exp.resources.world_size == 6
    assert exp.train == {"lr": 0.5, "layers": [1, 2], "new": "x"}
    assert loaded.resolved["train"]["lr"] == 0.5


def test_slurm_time_stays_text_not_base60(tmp_path: Path) -> None:
    # YAML 1.1 would read 1:30:00 as the integer 5400 (= 5400 minutes for sbatch).
    loaded = load_experiment(write(tmp_path, BASE + "executor: local\n"), ["resources.time=1:30:00"])
    assert loaded.experiment.resources.time == "1:30:00"
    text = BASE.replace("  nodes: 2\n", "  nodes: 2\n  time: 1:30:00\n")
    assert load_experiment(write(tmp_path, text)).experiment.resources.time == "1:30:00"


def test_float_exponent_is_a_number(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, BASE), ["lr=1e-3"]).experiment.train["lr"] == 0.001


TYPED = """\
entrypoint: pkg.train:main
train:
  lr: 0.1
  epochs: 8
  amp: false
  dtype: float32
  opt: {momentum: 0.9}
"""


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("lr=abc", "override 'train.lr=abc': train.lr is 0.1 in the experiment; give a number"),
        ("epochs=3.5", "override 'train.epochs=3.5': train.epochs is 8 in the experiment; give an integer"),
        ("amp=1", "override 'train.amp=1': train.amp is false in the experiment; give true or false"),
        ("train.opt.momentum=[1]", "train.opt.momentum is 0.9 in the experiment; give a number"),
    ],
)
def test_a_train_override_of_another_type_than_the_files_is_refused(
    tmp_path: Path, override: str, said: str
) -> None:
    """Taken as given, `lr=abc` ran and failed in the job at its first `<` (a wasted allocation)."""
    assert error(write(tmp_path, TYPED), [override]).endswith(said)


def test_a_train_override_takes_the_files_type_where_it_fits(tmp_path: Path) -> None:
    overrides = ["lr=1", "epochs=3", "amp=true", "dtype=7", "train.opt.momentum=null", "train.new=1.5"]
    train = load_experiment(write(tmp_path, TYPED), overrides).experiment.train
    assert train == {"lr": 1.0, "epochs": 3, "amp": True, "dtype": 7, "opt": {"momentum": None}, "new": 1.5}
    assert isinstance(train["lr"], float)


@pytest.mark.parametrize(
    ("override", "grid"), [("lr=0.01,0.1", "lr: [0.01, 0.1]"), ("epochs=2,4", "epochs: [2, 4]")]
)
def test_hydras_comma_multirun_is_answered_with_the_sweep_to_write(
    tmp_path: Path, override: str, grid: str
) -> None:
    said = error(write(tmp_path, TYPED), [override])
    assert "a comma list is Hydra's multirun" in said and f"`sweep: {{grid: {{{grid}}}}}`" in said, said


def test_profile_layers_under_the_experiment(tmp_path: Path) -> None:
    write(tmp_path, "resources:\n  partition: gpu\n  account: lab\n  nodes: 8\n", "configs/mycluster.yaml")
    exp = load_experiment(write(tmp_path, BASE + "profile: mycluster\n")).experiment
    assert (exp.resources.partition, exp.resources.account, exp.resources.nodes) == ("gpu", "lab", 2)


def test_profile_from_override_and_unknown_profile(tmp_path: Path) -> None:
    write(tmp_path, "resources:\n  qos: high\n", "configs/other.yaml")
    path = write(tmp_path, BASE)
    assert load_experiment(path, ["profile=other"]).experiment.resources.qos == "high"
    message = error(path, ["profile=othr"])
    assert "no profile named 'othr'" in message and "did you mean 'other'" in message


def test_env_interpolation_resolved_at_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_ACCOUNT", "proj42")
    path = write(tmp_path, BASE.replace("  lr: 0.1\n", "  lr: 0.1\n  acct: ${oc.env:MY_ACCOUNT}\n"))
    assert load_experiment(path).resolved["train"]["acct"] == "proj42"
    monkeypatch.delenv("MY_ACCOUNT")
    assert "MY_ACCOUNT" in error(path)


def test_entrypoint_shorthands(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    script = load_experiment(path, ["entrypoint=train.py --lr 3 'a b'"]).experiment.entrypoint
    assert (script.function, script.script, script.args) == (None, "train.py", ["--lr", "3", "a b"])
    function = load_experiment(path, ["entrypoint=train.py:main"]).experiment.entrypoint
    assert (function.function, function.script) == ("train.py:main", None)


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    message = error(write(tmp_path, "resources:\n  nodes: [1,\n  x: 2\n"))
    assert "exp.yaml:" in message and "malformed YAML" in message
    assert message.split("exp.yaml:")[1].split(":")[0].isdigit()


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    assert "duplicate key 'nodes'" in error(
        write(tmp_path, BASE.replace("  nodes: 2\n", "  nodes: 2\n  nodes: 3\n"))
    )


def test_unknown_key_suggests_closest(tmp_path: Path) -> None:
    message = error(write(tmp_path, BASE.replace("nodes: 2", "nodez: 2")))
    assert "exp.yaml" in message and "resources.nodez" in message and "nodes" in message
    message = error(write(tmp_path, BASE), ["lrr=1"])
    assert "'lrr=1'" in message and "did you mean 'lr'" in message


def test_every_mistake_of_the_file_and_the_overrides_is_said_at_once(tmp_path: Path) -> None:
    # OmegaConf stops at the first key it refuses: two typos in a file once took two tries.
    text = BASE.replace("nodes: 2", "node: 2").replace("tasks_per_node", "task_per_node")
    message = error(write(tmp_path, text + "chekpoint: {every_steps: 5}\n"), ["dist.port=x", "lr=0.2"])
    lines = message.splitlines()
    assert lines[0] == "4 mistakes:", message
    assert [line.split(": ")[1] for line in lines[1:]] == [
        "resources.node",
        "resources.task_per_node",
        "chekpoint",
        "dist.port",
    ], message
    assert "Did you mean: 'nodes'?" in lines[1] and lines[4].startswith("  override 'dist.port=x'"), message
    # One mistake is one line, as before.
    assert "\n" not in error(write(tmp_path, BASE.replace("nodes: 2", "node: 2")))


def test_wrong_type_names_key(tmp_path: Path) -> None:
    message = error(write(tmp_path, BASE), ["resources.nodes=many"])
    assert "resources.nodes" in message and "many" in message


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("resources.nodes=0", "override 'resources.nodes=0': must be >= 1"),
        ("resources.cpus_per_task=0", "resources.cpus_per_task"),
        ("resources.gpus_per_node=-1", "resources.gpus_per_node"),
        ("resources.time=1:2:3:4", "resources.time"),
        ("resources.time=00:00:00", "resources.time"),
        ("resources.time=UNLIMITED", "resources.time"),
        ("resources.gpu_binding=socket", "resources.gpu_binding"),
        ("dist.backend=mpi", "dist.backend"),
        ("dist.backend=nccl", "nccl needs GPUs"),
        ("dist.port=80", "dist.port"),
        ("executor=pbs", "executor"),
        ("fabric.profile=infiniband2", "did you mean 'infiniband'"),
        ("name=a b", "name"),
        ("name=../up", "name"),
        ("resources.mem_gb=0", "resources.mem_gb"),
        ("entrypoint.function=nocolon", "entrypoint.function"),
        ("ddp.accumulate=0", "override 'ddp.accumulate=0': must be >= 1"),
        ("ddp.bucket_cap_mb=0", "override 'ddp.bucket_cap_mb=0': must be > 0"),
        ("precision.autocast=fp16", "precision.autocast: 'fp16' is not one of none, bfloat16, float16"),
        ("trackers.wandb_mode=cloud", "trackers.wandb_mode"),
        ("integrations=yes", "integrations: True is not one of manual, auto"),
        ("integrations=auto", "a function entrypoint's ctx.loop stops and resumes by itself"),
    ],
)
def test_impossible_values(tmp_path: Path, override: str, needle: str) -> None:
    assert needle in error(write(tmp_path, BASE), [override])


def test_one_rank_per_gpu(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.replace("  tasks_per_node: 2\n", "  tasks_per_node: 2\n  gpus_per_node: 4\n"))
    assert "one rank per GPU" in error(path)
    exp = load_experiment(path, ["resources.tasks_per_node=null"]).experiment
    assert exp.resources.ranks_per_node == 4 and exp.resources.world_size == 8


def test_newline_in_a_slurm_value_is_refused(tmp_path: Path) -> None:
    text = BASE + "  \n"
    path = write(tmp_path, text.replace("  nodes: 2\n", '  nodes: 2\n  comment: "a\\nrm -rf ~"\n'))
    assert "resources.comment" in error(path) and "newline" in error(path)


def test_bad_sbatch_option_name(tmp_path: Path) -> None:
    assert "sbatch long option" in error(write(tmp_path, BASE), ["resources.sbatch={'--x; rm': 1}"])


@pytest.mark.parametrize(
    ("option", "instead"),
    [
        ("array=0-3", "a `sweep:` section"),
        ("nodes=4", "resources.nodes"),
        ("ntasks-per-node=8", "resources.tasks_per_node"),
        ("time=10", "resources.time"),
        ("mem=4G", "resources.mem_gb"),
        ("signal=USR1@60", "requeue.signal"),
        ("requeue=false", "requeue.max_preemptions"),
        ("no-requeue=true", "requeue.max_preemptions"),
        ("output=job.out", "RUN_DIR/logs"),
        ("job-name=x", "name"),
    ],
)
def test_an_sbatch_option_slurmddp_sets_is_refused_naming_the_key_to_write(
    tmp_path: Path, option: str, instead: str
) -> None:
    """Passed through, it would replace slurmddp's own: --signal (no stop before the time limit),
    --array (clashing copies of one run in one run directory), --no-requeue (no resume)."""
    key = option.split("=")[0]
    said = error(write(tmp_path, BASE), [f"resources.sbatch.{option}"])
    refused = f"override 'resources.sbatch.{option}': slurmddp sets --{key} itself; write "
    assert said.startswith(refused), said
    assert instead in said.split("; write ", 1)[1], said


def test_both_or_no_entrypoint(tmp_path: Path) -> None:
    assert "exactly one" in error(write(tmp_path, "resources:\n  nodes: 1\n"))
    both = BASE.replace("entrypoint: pkg.train:main\n", "entrypoint:\n  function: a:b\n  script: x.py\n")
    assert "exactly one" in error(write(tmp_path, both))


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("resources.nodes=-1", "override 'resources.nodes=-1': must be >= 1, got -1"),
        ("resources.time=forever", "override 'resources.time=forever': 'forever' is not a Slurm time limit"),
        ("name=-x", "override 'name=-x': '-x' must start with a letter or digit"),
        ("dist.port=80", "override 'dist.port=80': 80 is not a usable port"),
        ("checkpoint.keep_last=0", "override 'checkpoint.keep_last=0': must be >= 1, got 0"),
        ("resources.tasks_per_node=0", "override 'resources.tasks_per_node=0': must be >= 1, got 0"),
        ("resources={nodes: 0}", "override 'resources={nodes: 0}': resources.nodes: must be >= 1, got 0"),
    ],
)
def test_a_bad_value_given_as_an_override_is_blamed_on_the_override(
    tmp_path: Path, override: str, said: str
) -> None:
    message = error(write(tmp_path, BASE), ["lr=0.2", override, "train.other=1"])
    assert message.startswith(said), message


def test_a_bad_value_is_blamed_on_the_file_or_profile_that_gave_it(tmp_path: Path) -> None:
    write(tmp_path, "resources:\n  mem_gb: 0\n", "configs/small.yaml")
    path = write(tmp_path, BASE.replace("  nodes: 2\n", "  nodes: 0\n"))
    assert error(path, ["resources.time=10"]) == f"{path}: resources.nodes: must be >= 1, got 0"
    profile = tmp_path / "configs" / "small.yaml"
    assert (
        error(write(tmp_path, BASE + "profile: small\n", "small.yaml"))
        == f"{profile}: resources.mem_gb: must be > 0, got 0.0"
    )
    assert load_experiment(path, ["resources.nodes=3"]).experiment.resources.nodes == 3


def test_a_directory_given_as_the_experiment_is_said_to_be_one(tmp_path: Path) -> None:
    write(tmp_path, BASE)
    assert (
        error(tmp_path)
        == f"{tmp_path}: is a directory; name the experiment's YAML file in it (it holds exp.yaml)"
    )


def test_an_unreadable_experiment_is_said_to_be_unreadable(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    path.chmod(0)
    if os.access(path, os.R_OK):
        pytest.skip("this user reads any file (root); test_bad_inputs drops that power to check it")
    assert error(path) == f"{path}: cannot read it (Permission denied); check its permissions"


def test_an_unknown_profile_lists_the_folders_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = tmp_path / "profiles"
    monkeypatch.setenv("SLURMDDP_PROFILE_PATH", str(extra))
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, BASE + "profile: mycluster\n", "project/exp.yaml")
    message = error(path)
    searched = f"{extra}, {tmp_path}/project/configs, {tmp_path}/configs"
    assert f"no profile named 'mycluster' (looked for mycluster.yaml in {searched})" in message
    assert "$SLURMDDP_PROFILE_PATH" in message


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    assert "no such experiment file" in error(tmp_path / "nope.yaml")
    assert "must be a mapping" in error(write(tmp_path, "- a\n- b\n"))


def test_override_without_equals(tmp_path: Path) -> None:
    assert "expected key=value" in error(write(tmp_path, BASE), ["resources.nodes"])


def test_static_graph_cannot_accumulate(tmp_path: Path) -> None:
    message = error(write(tmp_path, BASE), ["ddp.static_graph=true", "ddp.accumulate=2"])
    assert "ddp.static_graph" in message and "ddp.accumulate=1" in message
    assert load_experiment(write(tmp_path, BASE), ["ddp.static_graph=true"]).experiment.ddp.static_graph
