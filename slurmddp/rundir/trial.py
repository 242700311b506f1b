"""RUN_DIR/trial.json: the Optuna trial a `search:` sweep's element runs (search/trial.py writes
it), read by the element's ranks (its parameters), by its batch script (how it ended) and by
`status` and `results`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from slurmddp.files import read_json_object, write_json
from slurmddp.rundir.layout import TRIAL

State = Literal["running", "complete", "pruned", "fail"]
"""Optuna's trial states, those an element's trial passes through."""


@dataclass(frozen=True)
class TrialRecord:
    number: int
    """The trial's number in the study (not the element's index: elements ask as they start)."""
    trial_id: int
    """Optuna's id of the trial in its storage."""
    params: dict[str, Any]
    """The values chosen, by full config key (`train.lr`)."""
    state: State = "running"
    value: float | None = None
    """A complete trial's objective value."""
    step: int | None = None
    """The step a pruned trial ended at."""
    message: str | None = None
    """Why a trial failed, or what pruned it."""

    @classmethod
    def read(cls, run_dir: Path) -> TrialRecord | None:
        data = read_json_object(run_dir / TRIAL)
        return None if data is None else cls.from_json(data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialRecord:
        return cls(
            int(data["number"]),
            int(data["trial_id"]),
            dict(data.get("params") or {}),
            data.get("state", "running"),
            data.get("value"),
            data.get("step"),
            data.get("message"),
        )

    def write(self, run_dir: Path) -> None:
        write_json(run_dir / TRIAL, dataclasses.asdict(self))

    def ended(self, state: State, **changes: Any) -> TrialRecord:
        return dataclasses.replace(self, state=state, **changes)

    def train_overrides(self) -> dict[str, Any]:
        """The parameters as keys under train: (`lr`), nested where the key is (`opt.lr`)."""
        nested: dict[str, Any] = {}
        for key, value in self.params.items():
            *parents, last = key.split(".")[1:]
            node = nested
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        return nested
