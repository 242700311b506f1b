"""An element's trial, from its first start to its end: asked once (`claim`), reported to as the
run logs its metric (`Reporter`, rank 0), and told how it ended (`finish`, once its run ended
for good).

A trial is the unit that resumes, not the Slurm attempt: a preempted, timed-out or crashed
element finds its trial in RUN_DIR/trial.json and goes on with it (its parameters, its values
reported so far); a step reported before is not reported again (the steps a crash redoes). Only
an end the run does not come back from tells the study: completed (the metric's last value),
pruned, or failed (the budgets spent, a cancel, a metric never logged).
"""

from __future__ import annotations

import contextlib
import difflib
import math
import sys
from pathlib import Path
from typing import Any

from slurmddp.rundir.config import read_config, write_config
from slurmddp.rundir.metrics import read_metrics
from slurmddp.rundir.outputs import Result
from slurmddp.rundir.trial import TrialRecord
from slurmddp.search import study as studies
from slurmddp.search.study import StudyRef


def claim(sweep_dir: Path, run_dir: Path, element: int) -> TrialRecord | None:
    """The trial element `element` runs: the one it asked for before, or a new one, recorded in
    its run directory; None where the sweep is no search. The element's config.yaml is rewritten
    with the trial's values, so that it says what ran."""
    ref = StudyRef.of_sweep(sweep_dir)
    if ref is None:
        return None
    existing = TrialRecord.read(run_dir)
    if existing is not None:
        return existing
    record = ask(ref, run_dir, element)
    write_config(run_dir, applied_to(read_config(run_dir), record))
    record.write(run_dir)
    return record


def ask(ref: StudyRef, run_dir: Path, element: int) -> TrialRecord:
    """A new trial of the study for element `element`, whose run directory is `run_dir`."""
    study = studies.load(ref, element)
    trial = study.ask(fixed_distributions=studies.distributions(ref.search))
    trial.set_user_attr("element", element)
    trial.set_user_attr("run_dir", str(run_dir))
    by_name = {p.key.removeprefix("train."): p.key for p in ref.search.params}
    # Optuna's Trial keeps its storage id private; it is what reopens the trial (Trial(study, id)).
    return TrialRecord(trial.number, trial._trial_id, {by_name[k]: v for k, v in trial.params.items()})


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = _merged(dict(out.get(key) or {}), value) if isinstance(value, dict) else value
    return out


def applied(config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The resolved experiment a rank is handed, with its trial's values (a search's element was
    pickled before they were chosen); `config` itself where the run is no trial."""
    record = TrialRecord.read(run_dir)
    return config if record is None else applied_to(config, record)


def applied_to(config: dict[str, Any], record: TrialRecord) -> dict[str, Any]:
    return {**config, "train": _merged(dict(config.get("train") or {}), record.train_overrides())}


class Reporter:
    """Rank 0 of a trial's run: each value of the metric goes to the study as it is logged, and
    the pruner is asked after each."""

    def __init__(self, ref: StudyRef, record: TrialRecord) -> None:
        optuna = studies.optuna_module()
        self.metric = ref.metric
        study = studies.load(ref)
        self._trial = optuna.trial.Trial(study, record.trial_id)
        (frozen,) = (t for t in study.get_trials(deepcopy=False) if t.number == record.number)
        self._reported = set(frozen.intermediate_values)
        self._logged: set[str] = set()

    @classmethod
    def open(cls, run_dir: Path) -> Reporter | None:
        """The reporter of the trial `run_dir` runs; None where it runs none."""
        record = TrialRecord.read(run_dir)
        if record is None:
            return None
        ref = StudyRef.of_sweep(run_dir.parent)
        return None if ref is None else cls(ref, record)

    def report(self, step: int, values: dict[str, float]) -> bool:
        """Report the metric's value at `step` (where `values` has it and the step was not reported
        before); whether the pruner says to stop the trial."""
        self._logged.update(values)
        if self.metric not in values or step in self._reported:
            return False
        self._reported.add(step)
        self._trial.report(values[self.metric], step)
        return bool(self._trial.should_prune())

    def never_logged(self) -> str | None:
        """Why the trial cannot be judged, where the run logs other values but never the metric
        and one of them is a near miss (a typo in sweep.metric): said at once, not after the
        whole budget."""
        if self.metric in self._logged or not difflib.get_close_matches(
            self.metric, sorted(self._logged), n=1, cutoff=0.8
        ):
            return None
        return _unlogged(self.metric, self._logged)


def _unlogged(metric: str, logged: set[str]) -> str:
    near = difflib.get_close_matches(metric, sorted(logged), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return (
        f"the run never logged sweep.metric {metric!r}{hint}; it logs {', '.join(sorted(logged))}: set "
        "sweep.metric to one of them, or log it with ctx.log(step, NAME=value)"
    )


def objective(run_dir: Path, metric: str) -> tuple[float | None, str | None]:
    """A completed run's value of `metric` (what its function returned, else the last value it
    logged), or why there is none."""
    done = Result.read(run_dir)
    result = done.result if done is not None else None
    if isinstance(result, dict) and isinstance(result.get(metric), (int, float)):
        return float(result[metric]), None
    logged: set[str] = set()
    value = None
    for record in read_metrics(run_dir):
        logged.update(record.values)
        if metric in record.values:
            value = float(record.values[metric])
    if value is None:
        return None, _unlogged(metric, logged | set(result or {}))
    return value, None


def finish(run_dir: Path, reason: str, message: str) -> None:
    """Tell the study how the element's trial ended for good (`reason`: the attempt's final
    decision); nothing where the run is no trial or its trial was told before."""
    record = TrialRecord.read(run_dir)
    ref = StudyRef.of_sweep(run_dir.parent) if record is not None else None
    if record is None or ref is None:
        return
    optuna = studies.optuna_module()
    states = optuna.trial.TrialState
    study = studies.load(ref)
    if reason == "pruned":
        ended = record.ended("pruned")
        study.tell(record.number, state=states.PRUNED, skip_if_finished=True)
    elif reason == "completed":
        value, why = objective(run_dir, ref.metric)
        if value is not None and math.isfinite(value):
            ended = record.ended("complete", value=value)
            study.tell(record.number, value, skip_if_finished=True)
        else:
            ended = record.ended("fail", message=why or f"{ref.metric} ended as {value}")
    else:
        ended = record.ended("fail", message=message)
    if ended.state == "fail":
        with contextlib.suppress(Exception):  # a finished trial takes no attribute
            optuna.trial.Trial(study, record.trial_id).set_user_attr("failed_because", ended.message)
        study.tell(record.number, state=states.FAIL, skip_if_finished=True)
        print(f"slurmddp: trial {record.number} failed: {ended.message}", file=sys.stderr)
    ended.write(run_dir)
