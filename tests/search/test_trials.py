"""A search's study and each element's trial, with Optuna's own JournalStorage in a temporary sweep
directory: made at submit (bad settings refused), asked once per element, reported to without a
repeat, told how it ended; several processes asking at once get distinct trials."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from slurmddp.errors import ConfigError
from slurmddp.experiment import sweep
from slurmddp.rundir.config import read_config, write_config
from slurmddp.rundir.manifest import ElementEntry, SweepManifest
from slurmddp.rundir.metrics import MetricRecord, append_metric
from slurmddp.rundir.trial import TrialRecord
from slurmddp.search import study as studies
from slurmddp.search import trial
from slurmddp.search.study import StudyRef

optuna = pytest.importorskip("optuna")

TRAIN = {"lr": 0.05, "hidden": 256, "opt": {"beta": 0.9}}


def make_sweep(tmp_path: Path, count: int = 4, **search: Any) -> tuple[Path, StudyRef]:
    """A sweep directory with its manifest, its study and one directory (and config) an element."""
    body = {"trials": count, "params": {"lr": "tag(log, interval(1e-4, 1))", "hidden": "choice(32, 64)"}}
    spec = sweep.parse(
        {"search": {**body, **search}, "metric": "val_loss", "mode": "min"}, ("train", "sweep"), TRAIN
    )
    assert spec.search is not None
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    ref = StudyRef.of(spec.search, sweep_dir, "exp", "val_loss", "min")
    studies.create(ref)
    elements = [ElementEntry(i, f"{i:03d}-trial", {}) for i in range(count)]
    SweepManifest(
        name="exp",
        executor="local",
        logs=str(sweep_dir / "logs"),
        world_size=2,
        metric="val_loss",
        mode="min",
        elements=elements,
        search=ref.to_manifest(),
    ).write(sweep_dir)
    for element in elements:
        (sweep_dir / element.dir).mkdir()
        write_config(sweep_dir / element.dir, {"train": TRAIN, "name": "exp"})
    return sweep_dir, ref


def test_an_element_asks_once_and_runs_its_trial_with_its_values(tmp_path: Path) -> None:
    sweep_dir, _ = make_sweep(tmp_path)
    run = sweep_dir / "002-trial"
    first = trial.claim(sweep_dir, run, 2)
    assert first is not None and first.number == 0 and first.state == "running"
    assert set(first.params) == {"train.lr", "train.hidden"}
    # A requeued attempt finds its trial: no second ask.
    assert trial.claim(sweep_dir, run, 2) == first
    assert len(studies.load(StudyRef.of_sweep(sweep_dir)).trials) == 1  # type: ignore[arg-type]
    config = read_config(run)
    assert config["train"]["lr"] == first.params["train.lr"] and config["train"]["opt"] == {"beta": 0.9}
    assert trial.applied({"train": TRAIN, "x": 1}, run) == {"train": config["train"], "x": 1}
    # A run that is no trial is handed its config as it is.
    assert trial.applied({"train": TRAIN}, tmp_path) == {"train": TRAIN}


def test_elements_asking_at_once_draw_different_startup_values(tmp_path: Path) -> None:
    """Each element's sampler has its own seed (a fresh sampler with one shared seed would draw the
    same first values in every element)."""
    sweep_dir, _ = make_sweep(tmp_path)
    drawn = [trial.claim(sweep_dir, sweep_dir / f"{i:03d}-trial", i) for i in range(4)]
    values = {round(record.params["train.lr"], 12) for record in drawn if record is not None}
    assert len(values) == 4


def test_reports_go_to_the_study_once_a_step_and_the_pruner_answers(tmp_path: Path) -> None:
    sweep_dir, ref = make_sweep(tmp_path, pruner={"median": {"n_startup_trials": 1, "n_warmup_steps": 0}})
    good, bad = sweep_dir / "000-trial", sweep_dir / "001-trial"
    for run in (good, bad):
        trial.claim(sweep_dir, run, int(run.name[:3]))
    reporter = trial.Reporter.open(good)
    assert reporter is not None
    assert reporter.report(10, {"val_loss": 1.0, "loss": 2.0}) is False  # nothing to compare with
    assert reporter.report(10, {"val_loss": 9.0}) is False  # a step redone after a crash: not again
    assert reporter.report(11, {"loss": 1.0}) is False
    append_metric(good, MetricRecord(10, 0.0, {"val_loss": 0.5}))
    trial.finish(good, "completed", "completed")
    told = studies.load(ref).trials[0]
    assert told.state == optuna.trial.TrialState.COMPLETE and told.value == 0.5
    assert told.intermediate_values == {10: 1.0}
    # The second trial is worse than the median at the same step: pruned.
    assert trial.Reporter.open(bad).report(10, {"val_loss": 3.0}) is True  # type: ignore[union-attr]
    # A reporter opened again (a resumed attempt) knows what was reported.
    assert trial.Reporter.open(bad).report(10, {"val_loss": 3.0}) is False  # type: ignore[union-attr]


def test_how_a_trial_ended_is_told_once(tmp_path: Path) -> None:
    sweep_dir, ref = make_sweep(tmp_path)
    runs = [sweep_dir / f"{i:03d}-trial" for i in range(4)]
    for i, run in enumerate(runs):
        trial.claim(sweep_dir, run, i)
    TrialRecord.read(runs[0]).ended("pruned", step=7).write(runs[0])  # type: ignore[union-attr]
    trial.finish(runs[0], "pruned", "trial 0 pruned at step 7")
    trial.finish(runs[1], "failure", "crashed at step 3 twice in a row: not retrying")
    append_metric(runs[2], MetricRecord(5, 0.0, {"loss": 0.1, "val_acc": 0.9}))
    trial.finish(runs[2], "completed", "completed")  # never logged val_loss
    states = optuna.trial.TrialState
    told = studies.load(ref).trials
    assert [t.state for t in told] == [states.PRUNED, states.FAIL, states.FAIL, states.RUNNING]
    assert told[1].user_attrs["failed_because"] == "crashed at step 3 twice in a row: not retrying"
    why = TrialRecord.read(runs[2]).message  # type: ignore[union-attr]
    assert "never logged sweep.metric 'val_loss'" in why and "it logs loss, val_acc" in why  # type: ignore[operator]
    trial.finish(runs[1], "completed", "completed")  # told before: nothing changes
    assert studies.load(ref).trials[1].state == states.FAIL
    trial.finish(tmp_path, "completed", "completed")  # no trial: nothing to tell


def _claim(args: tuple[str, int]) -> int:
    sweep_dir, index = Path(args[0]), args[1]
    record = trial.claim(sweep_dir, sweep_dir / f"{index:03d}-trial", index)
    assert record is not None
    return record.number


def test_processes_asking_at_once_get_distinct_trials(tmp_path: Path) -> None:
    """The journal file's lock (what makes it safe on a shared file system) across processes."""
    sweep_dir, ref = make_sweep(tmp_path, count=8)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        numbers = pool.map(_claim, [(str(sweep_dir), i) for i in range(8)])
    assert sorted(numbers) == list(range(8))
    assert len(studies.load(ref).trials) == 8


@pytest.mark.parametrize(
    ("search", "message"),
    [
        (
            {"sampler": {"tpe": {"n_startup": 3}}},
            "TPESampler takes no option 'n_startup' (did you mean 'n_startup_trials'?)",
        ),
        (
            {"pruner": {"asha": {"reduction_factor": 1}}},
            "sweep.search.pruner.asha: SuccessiveHalvingPruner refuses",
        ),
        ({"sampler": {"random": {"seed": 3}}}, "write sweep.search.seed"),
        ({"storage": "nosuchdb://x"}, "sweep.search.storage: cannot make the study"),
    ],
)
def test_settings_optuna_refuses_are_refused_at_submit(
    tmp_path: Path, search: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        make_sweep(tmp_path, **search)
    assert message in str(error.value)


def test_a_grid_search_walks_every_point_once(tmp_path: Path) -> None:
    grid = {"hidden": "choice(32, 64)", "opt.beta": "choice(0.8, 0.9)"}
    sweep_dir, _ = make_sweep(tmp_path, count=4, sampler="grid", params=grid)
    drawn = [trial.claim(sweep_dir, sweep_dir / f"{i:03d}-trial", i) for i in range(4)]
    points = {(r.params["train.hidden"], r.params["train.opt.beta"]) for r in drawn if r is not None}
    assert points == {(32, 0.8), (32, 0.9), (64, 0.8), (64, 0.9)}


def test_the_manifest_keeps_the_search(tmp_path: Path) -> None:
    sweep_dir, ref = make_sweep(tmp_path)
    data = json.loads((sweep_dir / "sweep.json").read_text())
    assert data["search"]["study"] == "exp-sweep" and data["search"]["storage"] == str(
        sweep_dir / "study.journal"
    )
    assert StudyRef.of_sweep(sweep_dir) == ref
