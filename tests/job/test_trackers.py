"""Trackers across attempts: a requeued attempt (a new Trackers.open on the same run directory,
resumed from a checkpoint at `first_step`) continues the tracker run of the attempts before it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from slurmddp.errors import ConfigError, SlurmddpError
from slurmddp.experiment import schema
from slurmddp.job.train.trackers import MLFLOW_RUN_ID, WANDB_RUN_ID, Trackers, script_env

CONFIG = {"name": "demo", "train": {"lr": 0.1, "layers": [64, 64]}, "resources": {"nodes": 2}}


def attempt(
    run_dir: Path,
    settings: schema.Trackers,
    first_step: int,
    steps: range,
    offset: float = 0.0,
    config: Any = CONFIG,
) -> Trackers:
    trackers = Trackers.open(run_dir, settings, name="demo", first_step=first_step, config=config)
    for step in steps:
        trackers.log(step, {"loss": offset + step})
    return trackers


def scalars(run_dir: Path) -> list[tuple[int, float]]:
    reader = EventAccumulator(str(run_dir / "tensorboard"))
    reader.Reload()
    return [(event.step, event.value) for event in reader.Scalars("loss")]


@pytest.mark.parametrize("first_step", [5, 0], ids=["resumed-at-5", "requeued-before-a-checkpoint"])
def test_tensorboard_reads_the_attempts_as_one_run(tmp_path: Path, first_step: int) -> None:
    settings = schema.Trackers()
    # Never closed: a SIGKILLed attempt gets no close, so what log() wrote must be on disk already.
    killed = attempt(tmp_path, settings, 0, range(10))
    assert scalars(tmp_path) == [(step, float(step)) for step in range(10)]
    attempt(tmp_path, settings, first_step, range(first_step, first_step + 10), offset=100).close()
    killed.close()
    expected = [(s, float(s)) for s in range(first_step)]
    expected += [(s, 100.0 + s) for s in range(first_step, first_step + 10)]
    assert scalars(tmp_path) == expected


def test_tensorboard_attempt_in_the_same_second_reads_after_the_earlier_one(tmp_path: Path) -> None:
    attempt(tmp_path, schema.Trackers(), 0, range(10)).close()
    # The earlier file renamed as if made this second by a host (or pid, or writer counter) whose
    # name sorts after ours: event files are read in name order.
    (earlier,) = (tmp_path / "tensorboard").iterdir()
    earlier.rename(earlier.with_name(f"events.out.tfevents.{int(time.time()):010d}.~.0.0"))
    attempt(tmp_path, schema.Trackers(), 5, range(5, 15), offset=100).close()
    assert scalars(tmp_path) == [(s, float(s)) for s in range(5)] + [(s, 100.0 + s) for s in range(5, 15)]


@pytest.fixture
def mlflow_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No opt-in to MLflow's file store from the caller's environment: Trackers must make its own."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    yield
    # Trackers set it; monkeypatch restores only what it changed (and runs after this).
    os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


@pytest.mark.usefixtures("mlflow_env")
def test_mlflow_requeue_continues_the_same_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    # As a rank gets them: DictConfig nodes.
    settings = schema.Trackers(tensorboard=False, mlflow=True)
    attempt(tmp_path, settings, 0, range(10), config=OmegaConf.create(CONFIG)).close()
    run_id = json.loads((tmp_path / "trackers.json").read_text())[MLFLOW_RUN_ID]
    changed = OmegaConf.create({**CONFIG, "train": {"lr": 0.5}})
    second = attempt(tmp_path, settings, 5, range(5, 15), offset=100, config=changed)
    second.close()
    second.close()

    assert json.loads((tmp_path / "trackers.json").read_text())[MLFLOW_RUN_ID] == run_id
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "demo"
    assert run.info.status == "FINISHED"
    # Logged once, by the first attempt: MLflow refuses to change a param.
    assert run.data.params == {
        "name": "demo",
        "train.lr": "0.1",
        "train.layers": "[64, 64]",
        "resources.nodes": "2",
    }
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert history == sorted([(s, float(s)) for s in range(10)] + [(s, 100.0 + s) for s in range(5, 15)])


def test_mlflow_uri_and_project_are_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    # A file store of the caller's own choosing needs the caller's opt-in; Trackers gives it only
    # for its default store.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "elsewhere").as_uri()
    settings = schema.Trackers(tensorboard=False, mlflow=True, mlflow_uri=uri, project="shared")
    attempt(tmp_path / "run", settings, 0, range(3)).close()
    run_id = json.loads((tmp_path / "run" / "trackers.json").read_text())[MLFLOW_RUN_ID]
    client = MlflowClient(tracking_uri=uri)
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "shared"
    assert not (tmp_path / "run" / "mlruns").exists()


@pytest.mark.usefixtures("mlflow_env")
def test_mlflow_run_missing_from_the_store_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "trackers.json").write_text(json.dumps({MLFLOW_RUN_ID: "0123456789abcdef"}))
    settings = schema.Trackers(tensorboard=False, mlflow=True)
    with pytest.raises(SlurmddpError, match=f"0123456789abcdef.*delete {MLFLOW_RUN_ID}"):
        Trackers.open(tmp_path, settings, name="demo", first_step=0, config=CONFIG)


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No login and no network: no key, no settings of the user's, and a server address that refuses
    connections, so that a W&B call that went online would fail the test instead of passing."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


@pytest.mark.usefixtures("wandb_offline")
@pytest.mark.process  # wandb's service process
def test_wandb_offline_requeue_continues_the_same_run_id(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    settings = schema.Trackers(tensorboard=False, wandb=True)
    attempt(run_dir, settings, 0, range(10), config=OmegaConf.create(CONFIG)).close()
    run_id = json.loads((run_dir / "trackers.json").read_text())[WANDB_RUN_ID]
    attempt(run_dir, settings, 5, range(5, 15), offset=100, config=OmegaConf.create(CONFIG)).close()

    assert json.loads((run_dir / "trackers.json").read_text())[WANDB_RUN_ID] == run_id
    offline_runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2
    # Two attempts that start in the same second: wandb 0.31 adds `-1` to the second folder's name.
    assert all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", p.name) for p in offline_runs)
    assert all((path / f"run-{run_id}.wandb").stat().st_size > 0 for path in offline_runs)


@pytest.mark.usefixtures("wandb_offline")
@pytest.mark.process  # wandb's service process
def test_wandb_id_is_kept_before_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    settings = schema.Trackers(tensorboard=False, wandb=True)
    seen: list[str] = []

    def dies_in_init(**kwargs: Any) -> None:
        seen.append(kwargs["id"])
        raise RuntimeError("killed inside wandb.init")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wandb, "init", dies_in_init)
        with pytest.raises(RuntimeError):
            Trackers.open(tmp_path, settings, name="demo", first_step=0, config=CONFIG)
    assert json.loads((tmp_path / "trackers.json").read_text()) == {WANDB_RUN_ID: seen[0]}
    attempt(tmp_path, settings, 0, range(1)).close()
    assert [path.name.rsplit("-", 1)[1] for path in (tmp_path / "wandb").glob("offline-run-*")] == seen


def uninstall(monkeypatch: pytest.MonkeyPatch, *packages: str) -> None:
    """Make `packages` unimportable, those already imported included (with their submodules)."""
    submodules = tuple(f"{package}." for package in packages)
    for name in {*packages, *(n for n in sys.modules if n.startswith(submodules))}:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    ("key", "packages", "install"),
    [
        ("tensorboard", ("tensorboard", "torch.utils.tensorboard"), "pip install tensorboard"),
        ("mlflow", ("mlflow",), "pip install 'slurmddp[mlflow]'"),
        ("wandb", ("wandb",), "pip install 'slurmddp[wandb]'"),
    ],
)
def test_missing_package_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, packages: tuple[str, ...], install: str
) -> None:
    enabled: dict[str, Any] = {"tensorboard": False, key: True}
    settings = schema.Trackers(**enabled)
    uninstall(monkeypatch, *packages)
    with pytest.raises(
        ConfigError, match=rf"trackers\.{key}: .*{re.escape(install)}.*trackers\.{key}: false"
    ):
        Trackers.open(tmp_path, settings, name="demo", first_step=0, config=CONFIG)
    assert not (tmp_path / "trackers.json").exists()


@pytest.mark.parametrize("key", ["mlflow", "wandb"])
def test_schema_refuses_a_tracker_this_python_cannot_import(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    enabled: dict[str, Any] = {key: True}
    uninstall(monkeypatch, key)
    with pytest.raises(ConfigError, match=rf"trackers\.{key}: .*slurmddp\[{key}\]"):
        schema.Trackers(**enabled)
    disabled: dict[str, Any] = {key: False}
    schema.Trackers(**disabled)


def test_a_scripts_wandb_run_id_is_the_run_directorys_unless_the_user_set_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "exp" / "20261126-101500-ab12"
    env = script_env(run_dir, {})
    assert env["WANDB_RESUME"] == "allow" and re.fullmatch(r"[0-9a-f]{16}", env["WANDB_RUN_ID"])
    assert env["TENSORBOARD_LOGGING_DIR"] == str(run_dir / "tensorboard")  # HF Trainer's callback
    # Every rank and attempt derives the same id: the path, however it is spelled.
    spelled = script_env(tmp_path / "runs" / "exp" / ".." / "exp" / run_dir.name, {})
    assert spelled["WANDB_RUN_ID"] == env["WANDB_RUN_ID"]
    assert script_env(tmp_path / "other", {})["WANDB_RUN_ID"] != env["WANDB_RUN_ID"]
    users = {"WANDB_RUN_ID": "mine", "TENSORBOARD_LOGGING_DIR": "/tb"}
    assert script_env(run_dir, users) == {}
    assert script_env(run_dir, {"WANDB_RESUME": "must"})["WANDB_RESUME"] == "must"


@pytest.mark.usefixtures("wandb_offline")
@pytest.mark.process  # wandb's service process
def test_a_scripts_own_wandb_init_continues_one_run_across_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What HF Trainer's, Lightning's and accelerate's W&B integrations do: wandb.init without an id.
    Each attempt is its own process, as a script rank is: wandb reads its environment only once per
    process, so an in-process second init would not show what a requeued attempt sees."""
    run_dir = tmp_path / "run"
    for name, value in script_env(run_dir, {}).items():
        monkeypatch.setenv(name, value)
    script = (
        "import sys, wandb\n"
        "run = wandb.init(project='p', dir=sys.argv[1], mode='offline')\n"
        "run.log({'loss': 1.0})\n"
        "print('id', run.id)\n"
        "run.finish()\n"
    )
    ids = []
    for _ in range(2):
        command = [sys.executable, "-c", script, str(run_dir)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
        ids += [line.split()[1] for line in done.stdout.splitlines() if line.startswith("id ")]
    assert ids == [os.environ["WANDB_RUN_ID"]] * 2
