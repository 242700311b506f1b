"""A search's study as `status` tells it: its trials by state, the best so far, and what pruning
saved. The counts are the study's own (what `optuna.load_study` and optuna-dashboard show); the
hours are the elements' (sacct's GPU hours, else the allocated time)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmddp.experiment.sweep import describe
from slurmddp.manage import runs
from slurmddp.rundir.records import Progress
from slurmddp.search import study as studies
from slurmddp.search.study import StudyRef

STATES = ("complete", "pruned", "failed", "running", "waiting")


@dataclass(frozen=True)
class Best:
    number: int
    value: float
    params: dict[str, Any]


@dataclass(frozen=True)
class Summary:
    name: str
    storage: str
    trials: dict[str, int]
    """How many trials are in each of STATES; waiting counts those not asked for yet."""
    best: Best | None
    hours: float
    """Spent by every element so far, in `unit`."""
    pruned_would_take: float
    """What the pruned trials would have taken on to their last step, at their own pace."""
    unit: str
    """"GPU hours", or "hours allocated" where no GPU was counted (a CPU cluster, a local run)."""
    load: str
    """The Python line that opens the study."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        counts = ", ".join(f"{self.trials[state]} {state}" for state in STATES if self.trials[state])
        said = [f"study {self.name}: {counts or 'no trials yet'}"]
        if self.best is not None:
            best = self.best
            said.append(f"best: trial {best.number}, {best.value:.6g} ({describe(best.params)})")
        if self.trials["pruned"]:
            said.append(
                f"{self.hours:.3g} {self.unit} spent; the {self.trials['pruned']} pruned trials would "
                f"have taken {self.pruned_would_take:.3g} more to finish"
            )
        said.append(f"open it: {self.load}")
        return said


def summary(target: runs.Target, rows: Sequence[runs.Row]) -> Summary | None:
    """The study of `target`, a search; None for any other run or sweep."""
    ref = StudyRef.of_manifest(target.sweep) if target.sweep is not None else None
    if ref is None:
        return None
    study = studies.load(ref)
    states = studies.optuna_module().trial.TrialState
    found = study.get_trials(deepcopy=False)
    named = {
        "complete": states.COMPLETE,
        "pruned": states.PRUNED,
        "failed": states.FAIL,
        "running": states.RUNNING,
        "waiting": states.WAITING,
    }
    trials = {key: sum(1 for t in found if t.state == state) for key, state in named.items()}
    trials["waiting"] += max(0, len(target.elements) - len(found))
    done = [t for t in found if t.state == states.COMPLETE]
    best = None
    if done:
        top = study.best_trial
        assert top.value is not None  # a complete trial's
        best = Best(top.number, top.value, dict(top.params))
    gpu = all(row.gpu_hours for row in rows)
    spent = {row.index: _hours(row, gpu) for row in rows}
    would = sum(spent[row.index] * _rest(row) for row in rows if row.shown_state == "PRUNED")
    unit = "GPU hours" if gpu else "hours allocated"
    return Summary(ref.name, ref.storage, trials, best, sum(spent.values()), would, unit, ref.load_hint)


def _hours(row: runs.Row, gpu: bool) -> float:
    if gpu:
        return float(row.gpu_hours or 0.0)
    return 0.0 if row.goodput is None else row.goodput.allocated_s / 3600


def _rest(row: runs.Row) -> float:
    """How many times its own run so far a pruned trial had left to go."""
    progress = Progress.read(Path(row.dir))
    total = progress.loop.total_steps if progress is not None and progress.loop is not None else None
    if not total or not row.step:
        return 0.0
    return max(0.0, total / row.step - 1)
