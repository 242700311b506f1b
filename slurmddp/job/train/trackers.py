"""Experiment trackers that `ctx.log` feeds besides RUN_DIR/metrics.jsonl (rank 0 only): TensorBoard,
MLflow and Weights & Biases, as the experiment's `trackers:` section says.

Every attempt of a run (a requeue, a resubmission: a new process, the same RUN_DIR) continues the
same tracker run. TensorBoard needs nothing for that but the same directory and a purge step; the
MLflow run id and the W&B run id are kept in RUN_DIR/trackers.json for the next attempt.

How each tracker treats the steps an attempt logs again after resuming from a checkpoint (the
earlier attempt logged past it):
- TensorBoard hides the earlier attempt's steps from the resumed step on (the purge step);
- MLflow keeps both attempts' values in the metric history (it never deletes a logged value);
- W&B: each attempt writes its own offline run directory under RUN_DIR/wandb, under the same id.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from slurmddp.errors import ConfigError, SlurmddpError
from slurmddp.experiment import schema
from slurmddp.rundir.layout import TENSORBOARD, TRACKERS
from slurmddp.rundir.trackers import TrackerIds

MLFLOW_RUN_ID = "mlflow_run_id"
WANDB_RUN_ID = "wandb_run_id"
_EVENT_FILES = "events.out.tfevents.*"


class _Sink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


class Trackers:
    """The trackers of one attempt; `open` one per process, `close` it when the attempt ends."""

    def __init__(self, sinks: list[_Sink]) -> None:
        self._sinks = sinks

    @classmethod
    def open(
        cls,
        run_dir: Path,
        settings: schema.Trackers,
        *,
        name: str,
        first_step: int,
        config: Mapping[str, Any],
    ) -> Trackers:
        """Open (or continue, on a later attempt) the run of each tracker `settings` (the
        experiment's `trackers:` section) enables.

        `first_step` is the step this attempt starts at (the resumed checkpoint's, 0 on a fresh
        start): what earlier attempts logged from there on is stale. `config` is the resolved
        experiment, recorded once as the run's parameters.
        """
        ids = TrackerIds.read(run_dir).ids
        sinks: list[_Sink] = []
        try:
            if settings.tensorboard:
                sinks.append(_tensorboard(run_dir / TENSORBOARD, first_step))
            if settings.mlflow:
                sinks.append(_mlflow(run_dir, settings, name, config, ids))
            if settings.wandb:
                sinks.append(_wandb(run_dir, settings, name, config, ids))
        except BaseException:
            cls(sinks).close()
            raise
        return cls(sinks)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        values = {key: float(value) for key, value in metrics.items()}
        for sink in self._sinks:
            sink.log(step, values)

    def close(self) -> None:
        sinks, self._sinks = self._sinks, []
        with contextlib.ExitStack() as closing:
            for sink in sinks:
                closing.callback(sink.close)


def _missing(key: str, install: str, exc: ImportError) -> ConfigError:
    return ConfigError(
        f"trackers.{key}: true, but this Python cannot import it ({exc}); "
        f"install it (pip install {install}) or set trackers.{key}: false"
    )


def _plain(value: Any) -> Any:
    """Nested dicts and lists, as trackers serialise them (a DictConfig node is neither)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(item) for item in value]
    return value


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """MLflow params are flat strings: {"train.lr": "0.1"}."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def script_env(run_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What a script's own trackers read to continue one run across attempts, where the user set
    nothing of the kind:
    - W&B: HF Trainer's `report_to="wandb"`, Lightning's WandbLogger and accelerate's trackers
      call `wandb.init` without an id, which then reads WANDB_RUN_ID and WANDB_RESUME. The id is
      the run directory's: every rank and every attempt derives the same, with nothing to share.
    - TensorBoard under HF Trainer: its callback writes to TENSORBOARD_LOGGING_DIR, else to
      `output_dir/runs/<time>_<host>`, a new directory on every attempt (transformers 5.24); here
      RUN_DIR/tensorboard."""
    env: dict[str, str] = {}
    if not environ.get("WANDB_RUN_ID"):
        env["WANDB_RUN_ID"] = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
        env["WANDB_RESUME"] = environ.get("WANDB_RESUME") or "allow"
    if not environ.get("TENSORBOARD_LOGGING_DIR"):
        env["TENSORBOARD_LOGGING_DIR"] = str(run_dir / TENSORBOARD)
    return env


def _remember(run_dir: Path, ids: dict[str, str], key: str, value: str) -> None:
    ids[key] = value
    TrackerIds(ids).write(run_dir)


def _tensorboard(log_dir: Path, first_step: int) -> _Sink:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise _missing("tensorboard", "tensorboard", exc) from None
    _start_after_earlier_event_files(log_dir)
    # The purge step hides what earlier attempts logged from first_step on, 0 included: an attempt
    # requeued before its first checkpoint restarts at 0, and without it every step shows twice.
    # On the first attempt there is nothing before it to purge.
    writer = SummaryWriter(log_dir=str(log_dir), purge_step=first_step)

    class TensorBoard:
        def log(self, step: int, metrics: Mapping[str, float]) -> None:
            for key, value in metrics.items():
                writer.add_scalar(key, value, step)
            # A preempted rank may be SIGKILLed before the writer's own 2-minute flush.
            writer.flush()

        def close(self) -> None:
            writer.close()

    return TensorBoard()


def _start_after_earlier_event_files(log_dir: Path) -> None:
    """TensorBoard reads a directory's event files in the order of their names, which start with
    the second the file was made, then host, pid and a per-process counter compared as text
    (".10" sorts before ".9"). A file made in the same second as an earlier attempt's could be read
    first, and its purge step would then hide the newer attempt instead of the older one."""
    stamps = [int(part) for path in log_dir.glob(_EVENT_FILES) if (part := path.name.split(".")[3]).isdigit()]
    wait = max(stamps, default=0) + 1 - time.time()
    # More than a second ahead is another node's clock, not this second: waiting would not help.
    if 0 < wait <= 1:
        time.sleep(wait)


def _mlflow(
    run_dir: Path,
    settings: schema.Trackers,
    name: str,
    config: Mapping[str, Any],
    ids: dict[str, str],
) -> _Sink:
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise _missing("mlflow", "'slurmddp[mlflow]'", exc) from None
    uri = settings.mlflow_uri
    if uri is None:
        uri = (run_dir / "mlruns").resolve().as_uri()
        # MLflow 3 refuses a file store without this opt-in. Its alternative, SQLite, needs
        # SQLAlchemy (which mlflow-skinny lacks) and is unsafe on the shared filesystems
        # (NFS, Lustre) that run directories live on.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    if MLFLOW_RUN_ID not in ids:
        experiment_name = settings.project or name
        experiment = client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(experiment_name)
        _remember(run_dir, ids, MLFLOW_RUN_ID, client.create_run(experiment_id, run_name=name).info.run_id)
        # Once only: MLflow refuses to change a logged param, and a resubmission may change one.
        client.log_batch(ids[MLFLOW_RUN_ID], params=[Param(k, v) for k, v in _flat(config).items()])
    else:
        try:
            client.update_run(ids[MLFLOW_RUN_ID], status="RUNNING")
        except MlflowException as exc:
            path = run_dir / TRACKERS
            raise SlurmddpError(
                f"{path}: MLflow run {ids[MLFLOW_RUN_ID]} of an earlier attempt is not in {uri} "
                f"({exc}); restore it there, or delete {MLFLOW_RUN_ID} from {path} to start a new "
                "MLflow run"
            ) from None
    run_id = ids[MLFLOW_RUN_ID]

    class MLflow:
        def log(self, step: int, metrics: Mapping[str, float]) -> None:
            now_ms = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, now_ms, step) for k, v in metrics.items()])

        def close(self) -> None:
            client.set_terminated(run_id)

    return MLflow()


def _wandb(
    run_dir: Path,
    settings: schema.Trackers,
    name: str,
    config: Mapping[str, Any],
    ids: dict[str, str],
) -> _Sink:
    try:
        import wandb
    except ImportError as exc:
        raise _missing("wandb", "'slurmddp[wandb]'", exc) from None
    run_id = ids.get(WANDB_RUN_ID)
    if run_id is None:
        # Kept before init, so an attempt that dies inside it leaves no second run behind. Our own
        # id: wandb 0.31 no longer has wandb.util.generate_id, and lowercase hex is a valid W&B id.
        run_id = secrets.token_hex(8)
        _remember(run_dir, ids, WANDB_RUN_ID, run_id)
    run = wandb.init(
        project=settings.project or name,
        id=run_id,
        resume="allow",
        mode=settings.wandb_mode,
        dir=str(run_dir),
        config=_plain(config),
    )

    class Wandb:
        def log(self, step: int, metrics: Mapping[str, float]) -> None:
            run.log(dict(metrics), step=step)

        def close(self) -> None:
            run.finish()

    return Wandb()
